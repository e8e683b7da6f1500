// The step protocol's values: what the scheduler asks of an executor (SchedulerOutput) and
// what the executor returns (StepResult). See docs/engine.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace arbor::step {

using RequestId = uint64_t;

// One request's work in a step. The new tokens are
// token_ids[num_computed_tokens, num_computed_tokens + num_scheduled_tokens).
struct ScheduledRequest {
  RequestId request_id = 0;
  int32_t num_scheduled_tokens = 0;
  int64_t num_computed_tokens = 0;            // before this step
  bool is_prompt_chunk = false;               // the new tokens include prompt tokens
  bool is_new = false;                        // admitted (or resumed) this step
  bool sample = false;                        // the last new token's logits are sampled
  std::span<const int32_t> token_ids;         // [num_tokens] prompt + outputs
  std::span<const int32_t> prompt_token_ids;  // [num_prompt_tokens] (penalties)
  std::span<const int32_t> output_token_ids;  // [num_output_tokens] (penalties)
  std::span<const int32_t> block_ids;         // [num_blocks] the whole block table
  const sampling::SamplingParams* sampling = nullptr;
  sampling::Rng* rng = nullptr;               // the request's own stream; one draw per sample
};

struct SchedulerOutput {
  int64_t step = 0;
  std::vector<ScheduledRequest> requests;     // running first, then newly admitted
  std::vector<kv::BlockCopy> block_copies;    // copy-on-write of forks: do before the forward
  std::vector<RequestId> preempted_ids;       // preempted this step, in order
  std::vector<RequestId> finished_ids;        // finished since the previous schedule()
  int32_t total_num_scheduled_tokens = 0;
  bool empty() const { return requests.empty(); }
};

struct SampledToken {
  RequestId request_id = 0;
  int32_t token_id = 0;
  float logprob = 0.0f;                              // 0 unless logprobs were asked for
  std::vector<sampling::TokenLogprob> top_logprobs;  // [num_top] by decreasing logprob
};

// What the executor returns: one SampledToken per ScheduledRequest with sample == true, in any
// order.
struct StepResult {
  std::vector<SampledToken> sampled;
};

}  // namespace arbor::step
