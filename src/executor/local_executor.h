// LocalExecutor: the in-process executor over model::ModelRunner, on the CPU or a CUDA GPU
// (options.device picks the forward's ops, model/forward_ops.h; everything else runs on the
// host). execute() is a short recipe over named parts, each with its own header:
//
//   RequestStates   what the executor remembers of each request (executor/request_states.h)
//   batch           one ForwardBatch from the SchedulerOutput: per request its block tables,
//                   committed tokens run and the drafts to verify (Drafter), the tree's mask
//                   and positions, which logits rows come back (build_batch, below)
//   LogitsReadback  what comes back of each row and its finite check (executor/readback.h)
//   prompt scorer   prompt logprobs rows and scores (executor/prompt_scorer.h)
//   Pooler          pooling requests: hidden-state rows, their pooled state, the vector
//                   (executor/pooler.h)
//   Verifier        masks, verification, emitted tokens' logprobs (executor/verifier.h)
//   KV compaction   the accepted path's K/V moved into place (compact_kv, below)
//   Drafter         the next step's drafts, kept here; only their shape is returned
//                   (executor/drafter.h); an MTP head also reads every request's hidden
//                   rows of its committed positions (committed_hidden)
//   TpSync          a tensor-parallel rank's share of what rank 0 alone knows: the drafts to
//                   verify and the accepted paths (executor/tp_sync.h). Ranks other than 0
//                   run the forward and the KV bookkeeping only: they sample, score, pool and
//                   propose nothing, and return an empty StepResult
//
// Loading (load(): device choice, runner, tokenizer vocabulary for grammars, proposer) is in
// executor/loader.cc beside executor/device.cc. Thread-safety: engine thread only.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/drafter.h"
#include "executor/executor_options.h"
#include "executor/grammar_states.h"
#include "executor/pooler.h"
#include "executor/readback.h"
#include "executor/request_states.h"
#include "executor/tp_sync.h"
#include "executor/verifier.h"
#include "model/batch_builder.h"
#include "model/runner.h"
#include "step/model_executor.h"

namespace arbor::executor {

// Whether the GGUF at `path` can run as a tensor-parallel group of `tp_size` ranks (its
// config's refusals, model::check_tp_config), from the file's metadata alone: for a launcher,
// before it starts tp_size processes that would each refuse the model. tp_size 1: ok.
Status check_tp_launch(const std::string& path, int tp_size);

// ok when the draft model's tokenizer has the same ids as the target's (vocabulary size, BOS,
// EOS, every token's text); otherwise kInvalidArgument naming both vocabularies.
Status check_same_vocabulary(const std::string& target_path, const std::string& draft_path);

class LocalExecutor : public step::ModelExecutor {
 public:
  // Loads the GGUF at `path` with a KV pool of options.num_kv_blocks blocks (or as many as
  // options.kv_cache_gib holds) of options.block_size tokens, and the proposer options.proposer
  // names (executor/loader.cc).
  static Result<std::unique_ptr<LocalExecutor>> load(const std::string& path,
                                                     const ExecutorOptions& options);
  // drafter: null when nothing proposes drafts.
  LocalExecutor(std::unique_ptr<model::ModelRunner> runner, std::unique_ptr<Drafter> drafter);

  Result<step::StepResult> execute(const step::SchedulerOutput& output) override;
  int32_t vocab_size() const override { return runner_->config().vocab_size; }
  int64_t max_model_len() const override;
  Status check_max_model_len(int64_t max_model_len) const override;
  int64_t num_kv_blocks() const override;
  int32_t block_size() const override;
  // The runner's KV cache groups (model::KvCacheLayout; one full-attention group unless
  // ExecutorOptions::kv_reclaim and the model has sliding-window layers).
  std::vector<int32_t> kv_group_windows() const override;

  Result<std::vector<step::StepCostSample>> measure_step_costs(
      std::span<const step::StepCostProbe> probes) override;
  step::ExpertShape expert_shape() const override {
    return {runner_->config().num_experts, runner_->config().num_experts_used};
  }
  double draft_token_cost() const override {
    return drafter_ ? drafter_->proposer().token_cost() : 0.0;
  }
  bool has_proposer() const override { return drafter_ != nullptr; }
  bool proposer_writes_kv() const override {
    return drafter_ != nullptr && drafter_->proposer().is_model();
  }
  bool proposer_keeps_up() const override {
    return drafter_ != nullptr && drafter_->proposer().reads_hidden();
  }
  int32_t recurrent_state_slots() const override {
    if (runner_->recurrent_states() == nullptr) return 0;
    return main_slots_ > 0 ? main_slots_
                           : runner_->recurrent_states()->num_slots() - num_checkpoints_;
  }
  int32_t state_checkpoints() const override { return num_checkpoints_; }
  // A recurrent model: the last `n` state slots become checkpoints (ModelExecutor::
  // state_checkpoints). Call before split_state_slots_for_speculation and the first execute().
  void reserve_state_checkpoints(int32_t n);
  // A recurrent model with speculation: slots [main_slots, num_slots) become scratch slots,
  // handed out per step to the drafts being verified (a chain one per request, a tree up to one
  // per node), the request's own slot untouched until the accepted ones are replayed into it
  // (ModelRunner::commit_states). Call before the first execute().
  void split_state_slots_for_speculation(int32_t main_slots);
  int32_t max_tree_nodes() const override {
    return drafter_ ? drafter_->options().tree_budget : 0;
  }

  // Logits rows that came back as their top-k candidates only (RowOut::kTopK) since load.
  int64_t num_top_k_rows() const { return readback_.num_top_k_rows(); }
  // Sends top_k_suffices requests' rows as candidates (kTopK) from now on, or not.
  void set_top_k_candidates(bool on) { readback_.set_top_k_candidates(on); }
  // The vocabulary structured output masks over (load() sets it from the model's tokenizer);
  // without one, requests with a grammar fail.
  void set_grammar_vocabulary(std::shared_ptr<const grammar::TokenVocabulary> vocab) {
    grammars_.set_vocabulary(std::move(vocab));
  }
  model::ModelRunner& runner() { return *runner_; }
  // Proposes with `drafter` from now on (null: no speculation); load() sets the flags' one.
  void set_drafter(std::unique_ptr<Drafter> drafter) { drafter_ = std::move(drafter); }
  // The head rank pooling applies (load() sets the file's cls.output.weight when it has one;
  // a server with the Qwen3-Reranker convention sets the LM head's yes/no rows).
  void set_rank_head(RankHead head) { pooler_.set_rank_head(std::move(head)); }
  const std::optional<RankHead>& rank_head() const { return pooler_.rank_head(); }
  // Pooling requests whose pooled state the executor keeps (for tests: 0 when idle).
  size_t num_pooling_states() const { return pooler_.num_states(); }

 private:
  // A request's hidden-state rows in the step: rows [row, row + count) of the hidden output,
  // the first at prompt position first_position.
  struct HiddenRows {
    int32_t row = 0;
    int32_t count = 0;
    int64_t first_position = 0;
  };
  // The requests' sampling and prompt logprobs rows of the step's batch (-1: none), hidden
  // rows and first token rows, [requests].
  struct BatchRows {
    std::vector<int32_t> sample, prompt;
    std::vector<HiddenRows> hidden;
    std::vector<int32_t> token;
  };
  // A recurrent model's requests that verified drafts: their accepted tokens replayed into
  // their state slots.
  Status commit_states(const step::SchedulerOutput& output, const BatchRows& rows,
                       const std::vector<step::RequestResult>& results);
  // A proposer reading the target's hidden states: [requests] each one's rows of its committed
  // positions (into hidden_ or gathered_).
  std::vector<TargetHidden> committed_hidden(const step::SchedulerOutput& output,
                                             const BatchRows& rows,
                                             const std::vector<step::RequestResult>& results);
  // Forgets what the step's finished and preempted ids name; copies forked blocks.
  Status apply_bookkeeping(const step::SchedulerOutput& output);
  // A model with recurrent layers: frees the forgotten requests' state slots and gives each new
  // request one (a fork child a copy of its parent's state).
  Status assign_state_slots(
      const step::SchedulerOutput& output,
      const std::vector<std::pair<step::RequestId, RequestState>>& forgotten);
  Result<BatchRows> build_batch(const step::SchedulerOutput& output,
                                std::vector<sampling::TokenTree>& trees);
  // A TP rank other than 0, after the forward: the accepted paths from rank 0, compacted.
  Status follow_verification(const step::SchedulerOutput& output);
  Status add_sequence(const step::ScheduledRequest& s, const sampling::TokenTree& tree,
                      int32_t& sample_row, int32_t& prompt_row, HiddenRows& hidden);
  // Feeds the step's hidden rows to the Pooler and returns the vectors of the requests whose
  // last prompt token ran.
  std::vector<step::PoolingResult> pool(const step::SchedulerOutput& output,
                                        const BatchRows& rows);
  step::RequestResult sample(const step::ScheduledRequest& s, const sampling::TokenTree& tree,
                             int32_t row);
  void compact_kv(const step::ScheduledRequest& s, std::span<const int32_t> accepted_nodes);
  // A recurrent model's prefix-hit admission and checkpoint save (ScheduledRequest::
  // save_state_at): the checkpoint copied into the request's slot, the save's state routing.
  Status load_checkpoint(const step::SchedulerOutput& output, const step::NewRequestData& d,
                         RequestState& st);
  Status route_save(const step::ScheduledRequest& s, const RequestState& st, int32_t n,
                    model::SequenceInput& in);
  int32_t checkpoint_slot(int32_t i) const {
    return runner_->recurrent_states()->num_slots() - num_checkpoints_ + i;
  }
  // A recurrent model's drafts: `in`'s per-token state routing through scratch slots.
  Status route_states(const step::ScheduledRequest& s, const RequestState& st,
                      const sampling::TokenTree& tree, model::SequenceInput& in);
  // The longest sequence the KV pool holds at one token per step, over every KV cache group.
  int64_t max_pool_tokens() const;

  std::unique_ptr<model::ModelRunner> runner_;
  std::unique_ptr<Drafter> drafter_;
  RequestStates states_;
  GrammarStates grammars_;
  model::BatchBuilder builder_;
  LogitsReadback readback_;
  Verifier verifier_;
  Pooler pooler_;
  TpSync tp_sync_;
  std::vector<float> hidden_;       // [hidden rows, dim] the step's hidden-state rows
  std::vector<std::vector<float>> gathered_;  // per request: a verification's committed rows
  std::vector<int32_t> tokens_;     // scratch: one request's tokens run this step
  std::vector<float> cost_logits_;  // scratch: the logits of measure_step_costs' steps
  std::vector<int32_t> positions_;  // scratch: one tree's positions, [1 + k]
  std::vector<uint8_t> mask_;       // scratch: one tree's packed mask, [ceil((1 + k)^2 / 8)]
  std::vector<int32_t> free_state_slots_;  // a recurrent model's unused state slots (a stack)
  int32_t main_slots_ = 0;            // > 0: slots from here on are speculation's scratch
  int32_t num_checkpoints_ = 0;       // the last ones of all: checkpoints (state_checkpoints)
  // After the forward: checkpoint -> request slot copies (a save on the step's last row).
  std::vector<std::pair<int32_t, int32_t>> post_copies_;
  std::vector<int32_t> free_scratch_;  // this step's unused scratch slots (a stack)
  std::vector<int32_t> state_src_, state_dst_;  // scratch: one sequence's per-token routing
};

}  // namespace arbor::executor
