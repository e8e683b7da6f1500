#include "executor/fake_executor.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace arbor::executor {

namespace {
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int32_t to_token(uint64_t h, const FakeExecutorOptions& o) {
  const auto span = static_cast<uint64_t>(o.vocab_size - o.min_token_id);
  return o.min_token_id + static_cast<int32_t>(h % span);
}
}  // namespace

int32_t fake_greedy_token(std::span<const int32_t> tokens, const FakeExecutorOptions& options) {
  return to_token(mix(static_cast<uint64_t>(tokens.back()) * 1000003u + tokens.size()), options);
}

int64_t FakeExecutor::max_model_len() const {
  return std::min(options_.context_length, (options_.num_kv_blocks - 1) * options_.block_size);
}

Status FakeExecutor::check_max_model_len(int64_t max_model_len) const {
  if (max_model_len < 0 || max_model_len > this->max_model_len()) {
    return invalid_argument("--max-model-len is ", max_model_len, ", the fake executor runs at most ",
                            this->max_model_len());
  }
  return ok_status();
}

Result<step::StepResult> FakeExecutor::execute(const step::SchedulerOutput& output) {
  ++num_steps_;
  if (options_.step_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.step_delay_us));
  }
  step::StepResult result;
  for (const step::ScheduledRequest& s : output.requests) {
    if (!s.sample) continue;
    const auto upto = s.token_ids.first(s.num_computed_tokens + s.num_scheduled_tokens);
    int32_t token = fake_greedy_token(upto, options_);
    const uint64_t draw = s.rng->next_u64();  // one draw per sample, as the real Sampler does
    if (!s.sampling->greedy()) token = to_token(mix(draw ^ static_cast<uint64_t>(token)), options_);
    step::SampledToken t;
    t.request_id = s.request_id;
    t.token_id = token;
    t.logprob = -static_cast<float>((token % 13) + 1) / 10.0f;
    result.sampled.push_back(std::move(t));
  }
  return result;
}

}  // namespace arbor::executor
