// DraftModelProposer: a second, smaller GGUF model that proposes drafts by decoding ahead.
//
// It keeps its own paged KV cache with the target's geometry (same number of blocks, same block
// size), indexed by the same block ids: a request's draft K/V lives in the same slots of the
// draft cache as its target K/V in the target cache, so the scheduler's block tables, forks
// (copy_block) and lookahead reservations serve both. Per request it remembers which tokens its
// draft K/V holds (run_tokens); at each proposal it keeps the longest prefix that is still
// committed (accepted drafts stay; rejected ones are rolled back by forgetting them: their slots
// are overwritten), catches up on the committed tokens it has not run (the prompt for a new
// request, then normally the bonus/recovered token and the accepted drafts' tail), and decodes
// max_depth tokens in as many ragged-batch forwards over all proposing requests.
//
// Draft tokens follow the request's own sampling: greedy requests take the argmax after the
// request's logit bias and penalties; sampling requests draw from the draft distribution q after
// the request's transforms at draw site Rng::at(seed, position, kDraft), and q is returned when
// asked for (the rejection sampler needs it).
//
// Threading: the engine thread (inside the executor's execute()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "model/batch_builder.h"
#include "model/runner.h"
#include "sampling/sampler.h"
#include "sampling/token_tree.h"
#include "spec/proposer.h"
#include "step/step.h"

namespace arbor::executor {

// What one proposal reads of a request (spec::DraftRequest; block_ids cover at least
// N - 1 + max_depth slots, and max_nodes + 1 past the committed tokens for a tree: the
// scheduler's lookahead).
using DraftInput = spec::DraftRequest;

// A chain's drafts: [max_depth] tokens and, when drawn (DraftRequest::draw), the q each came from.
struct DraftOutput {
  std::vector<int32_t> tokens;
  std::vector<std::vector<sampling::Candidate>> q;
};

class DraftModelProposer final : public spec::Proposer {
 public:
  // Loads the draft GGUF with a KV pool of `num_blocks` blocks of `block_size` tokens, running
  // on `pool`, on the device of `make_ops` (the target's; null: the CPU). Errors name the file.
  static Result<std::unique_ptr<DraftModelProposer>> load(
      const std::string& path, int64_t num_blocks, int32_t block_size,
      std::shared_ptr<kernels::ThreadPool> pool, model::RunnerOptions::OpsFactory make_ops = {});

  int32_t vocab_size() const { return runner_->config().vocab_size; }

  // spec::Proposer. Chains (max_nodes == 0) come from propose_chains, trees from propose_tree
  // with the shape set_tree_shape() chose; a drawn chain keeps each node's q (one group each).
  std::string_view name() const override { return "draft"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override;
  void forget(spec::RequestId id, std::span<const int32_t>, int32_t) override {
    states_.erase(id);
  }
  bool is_model() const override { return true; }
  // Mirror of the target's copy-on-write copies.
  void copy_block(int32_t src, int32_t dst) override { runner_->kv_cache().copy_block(src, dst); }
  // measure_token_cost()'s figure, once measured (0 before).
  double token_cost() const override { return token_cost_; }
  // Trees' children per expanded node, and a static shape (empty: dynamic trees).
  void set_tree_shape(int32_t width, std::vector<int32_t> static_widths) {
    width_ = width;
    static_widths_ = std::move(static_widths);
  }

  // [inputs.size()] chain proposals: each input's max_depth tokens decoded one per forward,
  // sampled with the request's params at Rng::at(seed, position, kDraft) (the argmax for greedy
  // ones), with the q of each when the input draws. Errors come from the forward (the state is
  // then reset).
  Result<std::vector<DraftOutput>> propose_chains(std::span<const DraftInput> inputs);
  // Token trees (EAGLE-2's dynamic tree): per input a tree of at most `budget` (max_nodes) nodes and
  // max_depth levels, parents first, every node one-hot (a chosen token) with draft_prob = the
  // draft's probability of it at its parent (softmax after the request's logit bias and
  // penalties, at its temperature, 1 for greedy requests). Level by level, the `width` most probable children of each expanded
  // node become candidates, and the `width` candidates of the newest level with the highest
  // path probability are expanded next, in one ragged forward over all inputs (each expanded
  // node with its ancestors, under the tree mask; at most `budget` tokens per input, so the
  // scheduler's lookahead of `budget` slots holds them). The tree is the `budget` candidates of
  // highest path probability, in that order. Tree nodes' K/V is not kept: the next proposal
  // catches up from the last committed token. Errors as propose().
  // Inputs with draw get a *drawn* tree instead: each expanded node's children are drawn
  // from q (after the request's transforms) at (position, tree_draft_stream(j)) with the
  // request's seed (append_sampled_children), as many as the budget leaves (at most `width`),
  // and the tree keeps every drawn node in the order drawn (level by level, no pruning: which
  // nodes are expanded may depend on anything but their own children, so each child has law
  // q_i given its path, as rejection_sampler.h's exact rules require).
  // With static_widths (non-empty) the shape is static instead (Sequoia's and Medusa's fixed
  // trees): every node at depth d gets the static_widths[d - 1] most probable (or drawn)
  // children, down to static_widths.size() levels, and the tree is the shape's first
  // max_nodes nodes in level order.
  Result<std::vector<sampling::TokenTree>> propose_tree(std::span<const DraftInput> inputs,
                                                        int32_t width,
                                                        std::span<const int32_t> static_widths = {});
  // Seconds of a one-token draft step (median of three after a warm-up), kept as token_cost();
  // before any propose().
  Result<double> measure_token_cost();
  // Whether a chain draft of `in` is the argmax of the draft's row (greedy, no logit_bias or
  // penalties, no q kept): then only the argmax comes back from the device (model::LogitsOut).
  static bool argmax_drafts(const DraftInput& in);

 private:
  explicit DraftModelProposer(std::unique_ptr<model::ModelRunner> runner);
  int32_t pick(const DraftInput& in, std::span<const float> logits, int64_t position,
               std::span<const int32_t> drafted, DraftOutput& out);
  // Runs the committed tokens each input's draft K/V lacks (at least the last one); logits_
  // gets one row per input, the distribution after its last committed token, or argmax_ its
  // argmax where want[i] is kArgmax (empty want: every row whole).
  Status catch_up(std::span<const DraftInput> inputs, std::span<const model::RowOut> want = {});
  // runner_->forward of builder_'s batch into logits_ (and argmax_ for kArgmax rows).
  Status forward_rows(std::span<const model::RowOut> want);
  struct TreeBuild;
  void draw_children(const DraftInput& in, std::span<const float> row, int32_t u, int32_t depth,
                     int32_t width, TreeBuild& t);
  std::vector<sampling::Candidate> top_children(const DraftInput& in, std::span<const float> row,
                                                std::span<const int32_t> path, int32_t width);

  std::unique_ptr<model::ModelRunner> runner_;
  double token_cost_ = 0.0;
  int32_t width_ = 4;
  std::vector<int32_t> static_widths_;
  model::BatchBuilder builder_;
  sampling::Sampler sampler_;
  std::unordered_map<step::RequestId, std::vector<int32_t>> states_;  // run_tokens per request
  std::vector<float> logits_;
  std::vector<int32_t> argmax_;          // [rows] of the last forward, for kArgmax rows
  std::vector<model::RowOut> want_;      // [inputs] scratch of propose()
  std::vector<float> work_;
  std::vector<int32_t> history_;
  std::vector<std::vector<int32_t>> chunks_;  // per input: the tokens of this forward
};

}  // namespace arbor::executor
