// LogitsReadback: the one place that decides what comes back of each logits row of a step and
// reads it back (docs/engine.md, "What comes back of the logits"). Whole rows, except for greedy
// requests whose transforms cannot move the argmax (argmax_suffices), which get only each row's
// argmax, computed on the device: 4 bytes instead of 4 x vocab, and sampled requests whose
// distribution is a function of their top_k best logits (top_k_suffices), which get only those
// candidates: 8 x top_k bytes; the host writes them into a row of -inf that sampling and
// verification then use unchanged. Every row is checked for non-finite logits: one fails its
// request alone.
//
// Per step: plan() with the batch's rows, then the runner's forward into out(), then rows() per
// sampling request. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "executor/request_states.h"
#include "model/llama_forward.h"
#include "step/step.h"

namespace arbor::executor {

// A request's logits rows [0, k] as the step returned them: whole rows (for top_k_suffices
// requests rebuilt from their candidates: -inf elsewhere), or (argmax_suffices) only each row's
// argmax.
struct RequestRows {
  float* logits = nullptr;          // [k + 1, vocab_size], or null
  std::span<const int32_t> argmax;  // [k + 1] when logits is null
};

class LogitsReadback {
 public:
  // Whether nothing reads a row beyond its best entries or moves them: no logprobs, logit_bias,
  // penalties, grammar, or min_tokens mask still to apply.
  static bool reads_only_the_best(const RequestState& st);
  // Whether the request's tokens follow from its rows' argmax alone: greedy and
  // reads_only_the_best.
  static bool argmax_suffices(const RequestState& st);
  // Whether the request's tokens follow from each row's top_k best candidates alone (the rows
  // Sampler sees when every other logit is -inf: sampling::fill_sparse_row): sampled with top_k
  // in [1, model::kMaxDeviceTopK] and, as for argmax_suffices, nothing else that moves or reads
  // the logits (min_p and top_p act on the top_k survivors only, so they may be on).
  static bool top_k_suffices(const RequestState& st);

  // Sends top_k_suffices requests' rows as candidates (kTopK) from now on, or not.
  void set_top_k_candidates(bool on) { top_k_candidates_ = on; }
  // Logits rows that came back as their top-k candidates only (RowOut::kTopK) since creation.
  int64_t num_top_k_rows() const { return num_top_k_rows_; }

  // Sizes the step's buffers for num_logits rows of vocab_size and decides each row's RowOut:
  // rows[i] = request i's first sampling row (-1: none), prompt_rows[i] its first prompt
  // logprobs row (-1: none; such a request's rows come back whole).
  void plan(const step::SchedulerOutput& output, std::span<const int32_t> rows,
            std::span<const int32_t> prompt_rows, RequestStates& states, int32_t num_logits,
            int32_t vocab_size);
  // Where the forward writes (model::ModelRunner::forward); valid until the next plan().
  model::LogitsOut out();
  // The whole rows from `row` on ([n, vocab]), for prompt logprobs.
  const float* row(int32_t row) const { return logits_.data() + static_cast<size_t>(row) * vocab_; }
  // Where the hidden state of a logits row first became non-finite ("" unknown): the runner's
  // diagnosis (model::ModelRunner::nonfinite_origin).
  using OriginFn = std::function<std::string(int32_t row)>;
  // Request `s`'s rows from `row` (its first sampling row), checked finite; kInternal naming the
  // position and, from `origin`, where the hidden state first became non-finite.
  Result<RequestRows> rows(const step::ScheduledRequest& s, int32_t row, const OriginFn& origin);

 private:
  model::RowOut row_out(const RequestState& st) const;

  int32_t vocab_ = 0;
  int32_t top_k_ = 0;                // the most candidates a kTopK row of this step needs
  std::vector<float> logits_;        // [num_logits, vocab_size]
  std::vector<model::RowOut> want_;  // [num_logits] what comes back of each row
  std::vector<int32_t> argmax_;      // [num_logits] the kArgmax rows' argmax
  std::vector<float> top_k_scale_;   // [num_logits] the kTopK rows' 1 / temperature
  std::vector<int32_t> top_ids_;     // [num_logits, top_k_] the kTopK rows' candidates
  std::vector<float> top_logits_;    // [num_logits, top_k_] and their logits
  int64_t num_top_k_rows_ = 0;
  // Whether top_k_suffices requests get kTopK rows: on a GPU, or on the host when
  // ExecutorOptions::top_k_candidates_on_host says so.
  bool top_k_candidates_ = false;
};

}  // namespace arbor::executor
