#include "executor/fake_executor.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "sampling/rng.h"

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

step::SampledToken fake_sampled(int32_t token) {
  return step::SampledToken{.token_id = token,
                            .logprob = -static_cast<float>((token % 13) + 1) / 10.0f};
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

// The token a plain step produces after `tokens` (the request's committed tokens, possibly
// extended by drafts).
int32_t FakeExecutor::next_token(const RequestState& st, std::span<const int32_t> tokens) const {
  const int32_t greedy = fake_greedy_token(tokens, options_);
  if (st.sampling.greedy()) return greedy;
  const auto position = static_cast<int64_t>(tokens.size());
  const uint64_t draw =
      sampling::Rng::at(st.seed, position, sampling::RngStream::kSample).next_u64();
  return to_token(mix(draw ^ static_cast<uint64_t>(greedy)), options_);
}

Result<step::RequestResult> FakeExecutor::run(const step::ScheduledRequest& s,
                                               RequestState& st) {
  step::RequestResult r;
  r.request_id = s.request_id;
  r.num_draft_tokens = s.num_draft_tokens();
  std::vector<int32_t> drafts = std::move(drafts_[s.request_id]);
  drafts_.erase(s.request_id);
  if (s.num_draft_tokens() > static_cast<int32_t>(drafts.size())) {
    return internal_error("request ", s.request_id, " verifies ", s.num_draft_tokens(),
                          " drafts, the fake executor keeps ", drafts.size());
  }
  std::vector<int32_t> tokens = st.token_ids;
  for (int32_t i = 0; i <= s.num_draft_tokens(); ++i) {
    const int32_t t = next_token(st, tokens);
    r.tokens.push_back(fake_sampled(t));
    if (i == s.num_draft_tokens() || t != drafts[static_cast<size_t>(i)]) break;
    r.accepted_draft_indices.push_back(r.num_accepted++);
    tokens.push_back(t);
  }
  if (options_.draft_correct_prefix >= 0 && s.max_next_draft_tokens > 0) {
    tokens.push_back(r.tokens.back().token_id);
    std::vector<int32_t>& next = drafts_[s.request_id];
    for (int32_t i = 0; i < s.max_next_draft_tokens; ++i) {
      int32_t t = fake_greedy_token(tokens, options_);
      tokens.push_back(t);
      if (i >= options_.draft_correct_prefix) {
        t = to_token(static_cast<uint64_t>(t - options_.min_token_id + 1), options_);
      }
      next.push_back(t);
      r.next_drafts.parent_ids.push_back(i - 1);
    }
  }
  return r;
}

// The fake's score of the prompt token at position p: logprob as fake_sampled's, rank
// 1 + token % 7, and num_top alternatives: the fake greedy token after tokens < p, then the ids
// after it (logprobs -0.05, -0.1, ...).
step::PromptLogprobsResult FakeExecutor::score_prompt(const step::ScheduledRequest& s,
                                                      const RequestState& st) const {
  step::PromptLogprobsResult r;
  r.request_id = s.request_id;
  r.first_position = s.prompt_logprobs_begin;
  for (int64_t p = s.prompt_logprobs_begin; p < s.prompt_logprobs_end; ++p) {
    const std::span<const int32_t> before = std::span<const int32_t>(st.token_ids).first(
        static_cast<size_t>(p));
    const int32_t token = st.token_ids[static_cast<size_t>(p)];
    sampling::PromptLogprob e{.token_id = token,
                              .logprob = fake_sampled(token).logprob,
                              .rank = 1 + token % 7,
                              .top = {}};
    const int32_t greedy = fake_greedy_token(before, options_);
    for (int32_t j = 0; j < st.sampling.prompt_logprobs.value_or(0); ++j) {
      e.top.push_back(sampling::TokenLogprob{
          .token_id = options_.min_token_id +
                      (greedy - options_.min_token_id + j) % (options_.vocab_size - options_.min_token_id),
          .logprob = -0.05f * static_cast<float>(j + 1)});
    }
    r.entries.push_back(std::move(e));
  }
  return r;
}

Result<std::vector<step::StepCostSample>> FakeExecutor::measure_step_costs(
    std::span<const step::StepCostProbe> probes) {
  std::vector<step::StepCostSample> costs;
  for (const step::StepCostProbe& p : probes) {
    costs.push_back({.seconds = options_.step_base_s + options_.step_token_s * p.num_tokens});
  }
  return costs;
}

std::vector<float> fake_pooled_vector(std::span<const int32_t> prompt, step::PoolingType type) {
  std::vector<float> v;
  for (int32_t d = 0; d < kFakeEmbeddingDim; ++d) {
    uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(d + 1);
    for (int32_t t : prompt) h = (h ^ static_cast<uint64_t>(t)) * 0x100000001B3ull;
    v.push_back(static_cast<float>(h % 1000) / 1000.0f - 0.5f);
  }
  if (type != step::PoolingType::kRank) return v;
  return {v[0] + 0.5f, 0.5f - v[0]};
}

Result<step::StepResult> FakeExecutor::execute(const step::SchedulerOutput& output) {
  ++num_steps_;
  ARBOR_ASSIGN_OR_RETURN(const auto forgotten, states_.apply(output));
  for (const auto& [id, st] : forgotten) drafts_.erase(id);
  if (options_.step_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.step_delay_us));
  }
  step::StepResult result;
  for (const step::ScheduledRequest& s : output.requests) {
    if (s.num_prompt_logprobs() > 0) {
      result.prompt_logprobs.push_back(score_prompt(s, states_.at(s.request_id)));
    }
    if (s.sample) {
      ARBOR_ASSIGN_OR_RETURN(step::RequestResult r, run(s, states_.at(s.request_id)));
      result.requests.push_back(std::move(r));
    }
    if (s.pool) {
      const RequestState& st = states_.at(s.request_id);
      if (!st.pooling) return internal_error("request ", s.request_id, " pools without pooling");
      result.pooled.push_back(step::PoolingResult{
          .request_id = s.request_id,
          .error = {},
          .values = fake_pooled_vector(st.prompt_ids(), *st.pooling)});
    }
  }
  return result;
}

}  // namespace arbor::executor
