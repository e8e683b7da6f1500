// Per-request sampling parameters (the OpenAI / vLLM vocabulary) and their validation.
//
// Order in which the Sampler applies them to a logits row (vLLM v1 order; docs/sampling.md):
//   1. logit_bias                     added to the raw logits
//   2. repetition_penalty             over prompt + generated tokens (HF / llama.cpp)
//   3. presence / frequency penalty   over generated tokens only (OpenAI)
//   4. temperature == 0 -> argmax (ties -> lowest id); otherwise logits / temperature
//   5. min_p -> top_k -> top_p        each on the survivors of the previous step
//   6. one draw from the renormalised survivors
// A grammar (structured output) masks the raw logits before step 1: disallowed tokens get -inf,
// so logprobs, like vLLM's, describe the masked distribution.
// Logprobs are computed from log_softmax of the *raw* logits (before steps 1-5), as vLLM does by
// default: they describe the model, not the sampling transform.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "base/status.h"
#include "grammar/grammar_spec.h"

namespace arbor::sampling {

// Limits enforced by validate().
inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxAbsPenalty = 2.0f;       // presence / frequency (OpenAI range)
inline constexpr float kMaxRepetitionPenalty = 10.0f;
inline constexpr float kMaxAbsLogitBias = 100.0f;   // OpenAI range
inline constexpr int32_t kMaxLogprobs = 20;         // OpenAI top_logprobs limit
// Temperatures below this are treated as greedy (as vLLM does).
inline constexpr float kGreedyEpsilon = 1e-5f;

struct SamplingParams {
  // 0 = greedy. Default 1.0 (OpenAI); the CLI uses 0.8 like llama.cpp.
  float temperature = 1.0f;
  // Keep the k most likely tokens; 0 or -1 = disabled.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p; 1 = disabled.
  float top_p = 1.0f;
  // Keep tokens with probability >= min_p * (probability of the most likely token); 0 = disabled.
  float min_p = 0.0f;
  // Seen tokens (prompt + generated): a positive logit is divided by it, a negative multiplied.
  // 1 = disabled.
  float repetition_penalty = 1.0f;
  // Subtracted once from the logit of every token generated at least once. 0 = disabled.
  float presence_penalty = 0.0f;
  // Subtracted count times, count = how often the token was generated. 0 = disabled.
  float frequency_penalty = 0.0f;
  // (token id, bias) pairs added to the raw logits. A token may appear once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Reproducible sampling for this request; nullopt = a random seed.
  std::optional<uint64_t> seed;
  // nullopt: no logprobs computed. n >= 0: the sampled token's logprob plus the n most likely
  // alternatives.
  std::optional<int32_t> logprobs;
  // Prompt logprobs (vLLM's prompt_logprobs). nullopt: none. n in [0, kMaxLogprobs]: for every
  // prompt position p >= 1, the logprob of prompt token p given tokens < p, its rank and the n
  // most likely alternatives, all from log_softmax of the model's *raw* logits (no logit_bias,
  // penalties, temperature, grammar or min_tokens mask: what the model says of the prompt, as
  // vLLM's default "raw logprobs"). Position 0 has none (nothing precedes it).
  std::optional<int32_t> prompt_logprobs;
  // Structured output: only tokens the grammar allows are sampled (their logits pass, every
  // other one becomes -inf before step 1), with and without speculation. nullopt = free text.
  // validate() does not compile it; the server does (a 400 names the problem).
  std::optional<grammar::GrammarSpec> grammar;
  // vLLM's min_tokens: until the request has generated this many tokens, the ids in
  // min_tokens_banned (its EOS ids unless ignore_eos, and its stop_token_ids; the engine fills
  // them in) are masked like a grammar's refusals. 0 = disabled. Where a grammar allows nothing
  // but those ids (it has completed), the grammar wins and they stay allowed.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_banned;

  bool greedy() const { return temperature < kGreedyEpsilon; }
  bool top_k_enabled() const { return top_k > 0; }
  // Whether steps 1-3 change any logit (logit_bias, repetition / presence / frequency penalty).
  bool has_logit_transforms() const {
    return !logit_bias.empty() || repetition_penalty != 1.0f || presence_penalty != 0.0f ||
           frequency_penalty != 0.0f;
  }

  // Checks every field against its limit; the error names the field, its value and the limit.
  Status validate(int64_t vocab_size) const;
};

}  // namespace arbor::sampling
