// Pooler: the executor's side of pooling requests (step::PoolingType; docs/engine.md, "Pooling requests"). For
// each step it says which rows of a request's chunk return their final hidden state (after the
// output norm: what llama.cpp's embeddings read), keeps what a request has pooled so far across
// chunks, and makes the vector on the step that runs the last prompt token:
//
//   mean   the mean of every prompt row: a double sum in token order, divided by the count, so
//          the result does not depend on how the prompt was chunked or batched   [dim]
//   cls    the first prompt row (position 0)                                      [dim]
//   last   the last prompt row                                                    [dim]
//   rank   the rank head over the last row, softmaxed over its classes (llama.cpp's qwen3 rank
//          pooling; a Qwen3-Reranker's classes are "yes" and "no")            [classes]
//
// Vectors are not normalised (the API layer does that, with Matryoshka truncation). A hidden row
// that is not finite fails its request alone. Threading: the engine thread (the executor's).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "model/llama_model.h"
#include "step/step.h"

namespace arbor::executor {

// A linear head over the last token's normed hidden state: scores = weights x h, then a softmax
// over the classes.
struct RankHead {
  std::vector<float> weights;  // [classes, dim] row-major
  int32_t classes = 0;
  // Where the rows came from, for the startup log: "cls.output.weight (yes, no)", or "the LM
  // head's rows of 'yes' (9693) and 'no' (2152)".
  std::string source;
};

// The file's rank head (cls.output.weight, one class per classifier label); nullopt when it has
// none. Errors: a weight type the reference codecs cannot decode.
Result<std::optional<RankHead>> rank_head_from_file(const model::LlamaModel& model);
// The Qwen3-Reranker convention for files converted without a rank head: the classifier's rows
// of the given tokens (yes first, no second), softmaxed as llama.cpp's converter would have
// written them into cls.output.weight.
Result<RankHead> rank_head_from_tokens(const model::LlamaModel& model,
                                       std::span<const int32_t> token_ids,
                                       std::span<const std::string> names);

class Pooler {
 public:
  explicit Pooler(int32_t dim) : dim_(dim) {}

  void set_rank_head(RankHead head) { rank_head_ = std::move(head); }
  const std::optional<RankHead>& rank_head() const { return rank_head_; }

  // The rows [begin, end) of a chunk that runs prompt tokens [c, c + n) of a prompt of
  // num_prompt tokens whose hidden states the pooling reads (end == begin: none).
  static std::pair<int32_t, int32_t> hidden_rows(step::PoolingType type, int64_t c, int32_t n,
                                                 int64_t num_prompt);
  // Adds the chunk's rows (`rows`: [end - begin, dim], their positions from c + begin) to the
  // request's state. A non-finite value fails the request: finish() then returns the error.
  void add(step::RequestId id, step::PoolingType type, int64_t first_position,
           std::span<const float> rows);
  // The request's vector after its last chunk (every row it needs was added), or its error;
  // forgets its state.
  step::PoolingResult finish(step::RequestId id, step::PoolingType type);
  // Drops a request's state (finished, preempted: a recompute starts over).
  void forget(step::RequestId id) { states_.erase(id); }
  size_t num_states() const { return states_.size(); }

 private:
  struct State {
    std::vector<double> sum;  // [dim] mean: the sum so far; cls, last, rank: the row
    int64_t count = 0;        // rows added
    Status error;
  };
  step::PoolingResult rank(step::RequestId id, const std::vector<double>& h) const;

  int32_t dim_;
  std::optional<RankHead> rank_head_;
  std::unordered_map<step::RequestId, State> states_;
};

}  // namespace arbor::executor
