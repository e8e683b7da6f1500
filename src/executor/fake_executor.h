// FakeExecutor: a deterministic stand-in for the model, for engine tests without weights.
//
// The "model" depends only on a request's tokens: the greedy next token after `tokens` is
// fake_greedy_token(tokens) = hash(last token, num_tokens) % vocab; a sampling request mixes in
// the draw of Rng::at(seed, position, kSample), so seeded requests are reproducible and unseeded
// ones vary. The logprob of a token is -((token % 13) + 1) / 10. Tokens are in
// [min_token_id, vocab_size), so BOS/EOS (low ids) never appear unless a test lowers
// min_token_id. No KV is touched. Prompt logprobs: the prompt token at position p gets the same
// logprob formula, rank 1 + token % 7, and as alternatives the fake greedy token after tokens < p
// and the ids after it (fake_executor.cc), for exactly the positions the scheduler asks.
//
// Speculation: drafts are verified by sample-and-compare (the executor's rule for one-hot
// drafts: token i is what a plain step at that position would produce; continue while it equals
// draft i), so output never depends on the drafts. With draft_correct_prefix >= 0 the fake
// proposes, after each sampling step, a chain of the greedy continuation with every token from
// index draft_correct_prefix on replaced by a wrong one, and keeps it for the next step.
// Pooling requests get fake_pooled_vector() of their prompt on the step that runs its last
// token. Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "executor/request_states.h"
#include "step/model_executor.h"

namespace arbor::executor {

struct FakeExecutorOptions {
  int32_t vocab_size = 512;
  int64_t num_kv_blocks = 256;
  int32_t block_size = 16;
  // The fake model's context length; max_model_len() is this capped by the KV pool.
  int64_t context_length = 1 << 20;
  // Tokens below this id are never produced (keeps BOS/EOS out unless the test wants them).
  int32_t min_token_id = 3;
  // Sleep per step, to make timing metrics non-zero.
  int32_t step_delay_us = 0;
  // < 0: propose no drafts; else the first draft_correct_prefix drafts are right, the rest wrong.
  int32_t draft_correct_prefix = -1;
  // measure_step_costs() reports step_cost_s(n) = step_base_s + step_token_s * n.
  double step_base_s = 1e-3;
  double step_token_s = 0.0;
};

// The token the fake produces after `tokens` for a greedy request.
int32_t fake_greedy_token(std::span<const int32_t> tokens, const FakeExecutorOptions& options);

// The fake's pooled vector of a prompt: kFakeEmbeddingDim values in [-0.5, 0.5) hashed from the
// prompt (mean, cls, last: the same function of the whole prompt); rank: {p, 1 - p} with p the
// first of them + 0.5.
inline constexpr int32_t kFakeEmbeddingDim = 8;
std::vector<float> fake_pooled_vector(std::span<const int32_t> prompt, step::PoolingType type);

class FakeExecutor : public step::ModelExecutor {
 public:
  explicit FakeExecutor(const FakeExecutorOptions& options) : options_(options) {}

  Result<step::StepResult> execute(const step::SchedulerOutput& output) override;
  int32_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_model_len() const override;
  Status check_max_model_len(int64_t max_model_len) const override;
  int64_t num_kv_blocks() const override { return options_.num_kv_blocks; }
  int32_t block_size() const override { return options_.block_size; }
  Result<std::vector<step::StepCostSample>> measure_step_costs(
      std::span<const step::StepCostProbe> probes) override;
  bool has_proposer() const override { return options_.draft_correct_prefix >= 0; }
  int64_t num_steps() const { return num_steps_; }
  int64_t num_known_requests() const { return static_cast<int64_t>(states_.size()); }

 private:
  int32_t next_token(const RequestState& st, std::span<const int32_t> tokens) const;
  Result<step::RequestResult> run(const step::ScheduledRequest& s, RequestState& st);
  step::PromptLogprobsResult score_prompt(const step::ScheduledRequest& s,
                                          const RequestState& st) const;

  FakeExecutorOptions options_;
  RequestStates states_;
  std::unordered_map<step::RequestId, std::vector<int32_t>> drafts_;  // proposed last step
  int64_t num_steps_ = 0;
};

}  // namespace arbor::executor
