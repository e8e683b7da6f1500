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
// MTP mode (load_mtp; --spec mtp): the drafter is the target file's own multi-token-prediction
// head, a one-layer model over the target's weights (model::LlamaModel::mtp_model) with its own
// KV cache of the target's geometry. Its row at position p reads token p and the target's final
// hidden row at p - 1 (docs/qwen35.md §8), so it keeps up with every request every step
// (Proposer::reads_hidden: the executor hands it each step's hidden rows, DraftRequest::hidden)
// and its K/V only ever holds rows computed from the target's hidden rows; drafts chain the
// head's own hidden row instead and are never kept. A request admitted on a prefix-cache hit
// continues from the head's K/V in the shared blocks and the target's hidden row at the last
// cached block's end, which the head keeps per block (keyed by a hash of the tokens up to it).
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
  // [tokens] when not drawn: the draft's probability of each token (top_children's: softmax
  // after the request's logit bias and penalties, at its temperature, 1 for greedy requests),
  // which the scheduler's policy reads as the draft's confidence (step::DraftShape::probs).
  std::vector<float> probs;
};

class DraftModelProposer final : public spec::Proposer {
 public:
  // Loads the draft GGUF with a KV pool of `num_blocks` blocks of `block_size` tokens, running
  // on `pool`, on the device of `make_ops` (the target's; null: the CPU). Errors name the file.
  static Result<std::unique_ptr<DraftModelProposer>> load(
      const std::string& path, int64_t num_blocks, int32_t block_size,
      std::shared_ptr<kernels::ThreadPool> pool, model::RunnerOptions::OpsFactory make_ops = {});

  // The MTP head of `target` (loaded with ModelLoadOptions::load_mtp; it must outlive the
  // proposer), on the CPU with `pool`, with a one-layer KV pool of `num_blocks` blocks of
  // `block_size` tokens. Errors: the target has no MTP head loaded.
  static Result<std::unique_ptr<DraftModelProposer>> load_mtp(
      const model::LlamaModel& target, int64_t num_blocks, int32_t block_size,
      std::shared_ptr<kernels::ThreadPool> pool);

  int32_t vocab_size() const { return runner_->config().vocab_size; }

  // spec::Proposer. Chains (max_nodes == 0) come from propose_chains, trees from propose_tree
  // with the shape set_tree_shape() chose; a drawn chain keeps each node's q (one group each).
  std::string_view name() const override { return mtp_ != nullptr ? "mtp" : "draft"; }
  Status propose(std::span<const spec::DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) override;
  void forget(spec::RequestId id, std::span<const int32_t>, int32_t) override {
    states_.erase(id);
    if (mtp_ != nullptr) mtp_->seqs.erase(id);
  }
  bool is_model() const override { return true; }
  bool reads_hidden() const override { return mtp_ != nullptr; }
  // MTP mode: rows run with zeros for a target hidden row the head never received (a request
  // resumed inside a cached prefix the head holds no row for), since load.
  int64_t mtp_missing_rows() const { return mtp_ != nullptr ? mtp_->missing_rows : 0; }
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
  // ones), with the q of each when the input draws, else each token's probability. Errors come
  // from the forward (the state is then reset).
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
 private:
  explicit DraftModelProposer(std::unique_ptr<model::ModelRunner> runner);
  // MTP mode's state.
  struct MtpSeq {
    // The target's hidden rows of positions [first, first + rows / dim) kept: from the row the
    // head's last catch-up row read on (a re-run reads it again) to the newest.
    int64_t first = 0;
    std::vector<float> rows;
    // The hash of the request's tokens [0, hash_end) (block_rows' key).
    uint64_t hash = 0;
    int64_t hash_end = 0;
  };
  struct BlockRow {
    uint64_t prefix_hash = 0;  // of the tokens up to the block's end
    std::vector<float> row;    // the target's hidden row at the block's last position
  };
  struct Mtp {
    int32_t dim = 0;
    std::unordered_map<step::RequestId, MtpSeq> seqs;
    std::unordered_map<int32_t, BlockRow> block_rows;  // by block id
    std::vector<std::vector<float>> inputs;  // per input: this forward's input hidden rows
    std::vector<std::vector<float>> chain;   // per input: the head's newest hidden row
    std::vector<float> out;                  // [H, dim] the last forward's hidden rows
    int64_t missing_rows = 0;
  };
  // The target's hidden row at `position` for `in` (null: none kept or given).
  const float* target_row(const MtpSeq& q, const DraftInput& in, int64_t position) const;
  // A request first seen after position 0 (a prefix-cache hit): where the head's K/V and a
  // kept hidden row let it continue; returns the rows it may keep.
  int64_t mtp_resume(const DraftInput& in, MtpSeq& q);
  int32_t pick(const DraftInput& in, std::span<const float> logits, int64_t position,
               std::span<const int32_t> drafted, DraftOutput& out);
  // Runs the committed tokens each input's draft K/V lacks (at least the last one); logits_
  // gets one row per input that drafts (max_depth > 0), the distribution after its last
  // committed token. MTP mode: inputs that do not draft only keep up (no row when nothing is new), and
  // mtp_->chain[i] gets each drafting input's hidden row of the head.
  Status catch_up(std::span<const DraftInput> inputs);
  // MTP mode: the rows [valid, end) input i runs now and their input hidden rows (into
  // mtp_->inputs[i]); may lower `valid` (a resumed request, a re-run last row).
  int64_t mtp_rows(const DraftInput& in, size_t i, int64_t& valid);
  // MTP mode: after a successful catch-up of rows [valid, end) of `in`.
  void mtp_advance(const DraftInput& in, int64_t valid, int64_t end);
  // runner_->forward of builder_'s batch into logits_ (every row whole).
  Status forward_rows();
  struct TreeBuild;
  void draw_children(const DraftInput& in, std::span<const float> row, int32_t u, int32_t depth,
                     int32_t width, TreeBuild& t);
  std::vector<sampling::Candidate> top_children(const DraftInput& in, std::span<const float> row,
                                                std::span<const int32_t> path, int32_t width);
  // work_ = `row` after the committed tokens and `path` with the request's logit bias and
  // penalties applied; returns 1 / its temperature (1 for greedy requests).
  float ranking_logits(const DraftInput& in, std::span<const float> row,
                       std::span<const int32_t> path);
  // `token`'s probability in the draft's row as top_children ranks it: softmax of
  // ranking_logits at that temperature (0 for a row holding a NaN or +Inf). O(vocab).
  float chosen_prob(const DraftInput& in, std::span<const float> row,
                    std::span<const int32_t> path, int32_t token);

  std::unique_ptr<model::ModelRunner> runner_;
  double token_cost_ = 0.0;
  int32_t width_ = 4;
  std::vector<int32_t> static_widths_;
  model::BatchBuilder builder_;
  sampling::Sampler sampler_;
  std::unordered_map<step::RequestId, std::vector<int32_t>> states_;  // run_tokens per request
  std::vector<float> logits_;
  std::vector<float> work_;
  std::vector<int32_t> history_;
  std::vector<std::vector<int32_t>> chunks_;  // per input: the tokens of this forward
  std::unique_ptr<Mtp> mtp_;                  // MTP mode, else null
};

}  // namespace arbor::executor
