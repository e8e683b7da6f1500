// LocalExecutor: the in-process executor over model::ModelRunner, on the CPU or a CUDA GPU
// (options.device picks the forward's ops, model/forward_ops.h; everything else is the same:
// sampling, verification and proposers run on the host. What comes back of the logits: whole
// rows, except for greedy requests whose transforms cannot move the argmax (argmax_suffices),
// which get only each row's argmax, computed on the device: 4 bytes instead of 4 x vocab, and
// sampled requests whose distribution is a function of their top_k best logits
// (top_k_suffices), which get only those candidates: 8 x top_k bytes; the host writes them into
// a row of -inf that sampling and verification then use unchanged).
//
// Builds one ForwardBatch per step from the SchedulerOutput (BatchBuilder: per request its block
// tables, one per KV cache group, num_computed_tokens as committed tokens, the scheduled committed tokens and drafts,
// logits of the last 1 + k rows when it samples, and of the rows that score prompt positions
// when it asks for prompt logprobs), runs the forward on the runner's device
// and samples or verifies each sampling request (verify_drafts). Thread-safety: engine thread
// only.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "executor/draft_proposer.h"
#include "executor/executor_options.h"
#include "executor/grammar_states.h"
#include "spec/proposer.h"
#include "executor/request_states.h"
#include "step/model_executor.h"
#include "model/batch_builder.h"
#include "model/runner.h"
#include "sampling/rejection_sampler.h"
#include "sampling/sampler.h"
#include "sampling/token_tree.h"
#include "sampling/tree_sampler.h"

namespace arbor::executor {

// ok when the draft model's tokenizer has the same ids as the target's (vocabulary size, BOS,
// EOS, every token's text); otherwise kInvalidArgument naming both vocabularies.
Status check_same_vocabulary(const std::string& target_path, const std::string& draft_path);

class LocalExecutor : public step::ModelExecutor {
 public:
  // Loads the GGUF at `path` with a KV pool of options.num_kv_blocks blocks (or as many as
  // options.kv_cache_gib holds) of options.block_size tokens.
  static Result<std::unique_ptr<LocalExecutor>> load(const std::string& path,
                                                        const ExecutorOptions& options);
  explicit LocalExecutor(std::unique_ptr<model::ModelRunner> runner);

  Result<step::StepResult> execute(const step::SchedulerOutput& output) override;
  int32_t vocab_size() const override { return runner_->config().vocab_size; }
  int64_t max_model_len() const override;
  int64_t num_kv_blocks() const override;
  int32_t block_size() const override;
  // The runner's KV cache groups (model::KvCacheLayout; one full-attention group unless
  // ExecutorOptions::kv_reclaim and the model has sliding-window layers).
  std::vector<int32_t> kv_group_windows() const override;

  Result<std::vector<double>> measure_step_costs(std::span<const int32_t> num_tokens) override;
  double draft_token_cost() const override { return draft_token_cost_; }
  bool has_proposer() const override { return draft_ != nullptr || proposer_ != nullptr; }
  bool proposer_writes_kv() const override { return draft_ != nullptr; }
  int32_t max_tree_nodes() const override { return tree_budget_; }
  // Logits rows that came back as their top-k candidates only (RowOut::kTopK) since load.
  int64_t num_top_k_rows() const { return num_top_k_rows_; }
  // Sends top_k_suffices requests' rows as candidates (kTopK) from now on, or not.
  void set_top_k_candidates(bool on) { top_k_candidates_ = on; }
  // Proposes token trees of at most `budget` nodes and `width` children per node (0: chains);
  // a draft model draws them for unseeded sampling requests as `sampling` says.
  // static_widths: a draft model's static tree shape (empty: dynamic trees).
  Status set_tree_options(int32_t budget, int32_t width,
                          TreeSampling sampling = TreeSampling::kTopK,
                          std::vector<int32_t> static_widths = {});

  // Proposes with a draft model from now on (load() does this for --spec draft).
  Status set_draft_model(std::unique_ptr<DraftModelProposer> draft);
  // Proposes with a model-free proposer from now on (--spec ngram / suffix).
  void set_proposer(std::unique_ptr<spec::Proposer> proposer) { proposer_ = std::move(proposer); }

  // The vocabulary structured output masks over (load() sets it from the model's tokenizer);
  // without one, requests with a grammar fail.
  void set_grammar_vocabulary(std::shared_ptr<const grammar::TokenVocabulary> vocab) {
    grammars_.set_vocabulary(std::move(vocab));
  }

  model::ModelRunner& runner() { return *runner_; }
  Status check_max_model_len(int64_t max_model_len) const override;

 private:
  // The longest sequence the KV pool holds at one token per step, over every KV cache group.
  int64_t max_pool_tokens() const;
  Status build_batch(const step::SchedulerOutput& output, std::vector<int32_t>& rows,
                     std::vector<int32_t>& prompt_rows);
  Status prompt_logprobs_rows(const step::ScheduledRequest& s, const RequestState& st,
                              int32_t num_committed_run, model::SequenceInput& in) const;
  step::PromptLogprobsResult score_prompt(const step::ScheduledRequest& s, const float* rows);
  // A request's logits rows [0, k] as the step returned them: whole rows (for top_k_suffices
  // requests rebuilt from their candidates: -inf elsewhere), or (argmax_suffices) only each
  // row's argmax.
  struct RequestRows {
    float* logits = nullptr;          // [k + 1, vocab_size], or null
    std::span<const int32_t> argmax;  // [k + 1] when logits is null
  };
  // Whether nothing reads a row beyond its best entries or moves them: no logprobs, logit_bias,
  // penalties, grammar, or min_tokens mask still to apply.
  static bool reads_only_the_best(const RequestState& st);
  // Whether the request's tokens follow from its rows' argmax alone, so that its logits can stay
  // on the device: greedy and reads_only_the_best.
  static bool argmax_suffices(const RequestState& st);
  // Whether the request's tokens follow from each row's top_k best candidates alone (the rows
  // Sampler sees when every other logit is -inf: sampling::fill_sparse_row): sampled with top_k
  // in [1, model::kMaxDeviceTopK] and, as for argmax_suffices, nothing else that moves or reads
  // the logits (min_p and top_p act on the top_k survivors only, so they may be on).
  static bool top_k_suffices(const RequestState& st);
  // The one place that decides what comes back of a sampling request's rows (LogitsOut::want):
  // kArgmax when argmax_suffices, kTopK when top_k_suffices, else kRow.
  model::RowOut row_out(const RequestState& st) const;
  // Masks the request's logits rows with its grammar (if it has one) and verifies its drafts.
  step::RequestResult sample_request(const step::ScheduledRequest& s, const RequestRows& rows);
  void mask_min_tokens(const step::ScheduledRequest& s, const RequestState& st, float* logits);
  step::RequestResult verify_drafts(const step::ScheduledRequest& s, const RequestState& st,
                                    const RequestRows& rows);
  step::RequestResult verify_tree(const step::ScheduledRequest& s, const RequestState& st,
                                  const RequestRows& rows);
  // The token emitted from row `row` and, when logits are there, what sample() reports of it.
  step::SampledToken emitted(const RequestRows& rows, int32_t row, int32_t token,
                             const RequestState& st);
  void compact_kv(const step::ScheduledRequest& s, std::span<const int32_t> accepted_nodes);
  void propose_model_free(std::span<const DraftInput> inputs,
                          std::vector<sampling::TokenTree>& trees);
  void set_next_drafts(const sampling::TokenTree& tree, bool drawn, step::RequestResult& r);
  std::optional<sampling::SiblingDraws> tree_draws(const RequestState& st) const;
  bool uses_model_rule(const RequestState& st) const;
  Status propose(const step::SchedulerOutput& output, step::StepResult& result);
  // Drops next drafts a grammar refuses, where dropping them by value keeps verification
  // lossless (sample-and-compare; not the model rule's draws from q).
  void constrain_next_drafts(step::RequestResult& r);

  std::unique_ptr<model::ModelRunner> runner_;
  RequestStates states_;
  GrammarStates grammars_;
  std::unique_ptr<DraftModelProposer> draft_;
  std::unique_ptr<spec::Proposer> proposer_;
  double draft_token_cost_ = 0.0;
  model::BatchBuilder builder_;
  sampling::Sampler sampler_;
  sampling::RejectionSampler rejection_;
  sampling::TreeRejectionSampler tree_sampler_;
  int32_t tree_budget_ = 0;  // 0: chains
  int32_t tree_width_ = 4;
  TreeSampling tree_sampling_ = TreeSampling::kTopK;
  std::vector<int32_t> tree_static_widths_;
  // Drawn trees proposed last step (with their q groups), for requests that verify by SpecInfer's
  // or Sequoia's rule.
  std::unordered_map<step::RequestId, sampling::TokenTree> drawn_trees_;
  std::vector<uint8_t> mask_;     // scratch: one tree's packed mask, [ceil((1 + k)^2 / 8)]
  std::vector<int32_t> positions_;  // scratch: one tree's positions, [1 + k]
  // The draft model's distributions q of the drafts it proposed last step, for requests that
  // verify by the model rule (unseeded sampling). [num_drafts][candidates]
  std::unordered_map<step::RequestId, std::vector<std::vector<sampling::Candidate>>> draft_q_;
  std::vector<float> logits_;  // [num_logits, vocab_size]
  std::vector<model::RowOut> want_;  // [num_logits] what comes back of each row
  std::vector<int32_t> argmax_;      // [num_logits] the kArgmax rows' argmax
  std::vector<float> top_k_scale_;   // [num_logits] the kTopK rows' 1 / temperature
  std::vector<int32_t> top_ids_;     // [num_logits, step's top_k] the kTopK rows' candidates
  std::vector<float> top_logits_;    // [num_logits, step's top_k] and their logits
  int64_t num_top_k_rows_ = 0;
  // Whether top_k_suffices requests get kTopK rows: on a GPU, or on the host when
  // ExecutorOptions::top_k_candidates_on_host says so.
  bool top_k_candidates_ = false;
  std::vector<int32_t> tokens_;   // scratch: one request's tokens run this step
};

}  // namespace arbor::executor
