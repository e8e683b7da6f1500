#include "sampling/sampling_params.h"

#include <cmath>
#include <unordered_set>

namespace arbor::sampling {

namespace {

Status check_range(const char* field, float value, float lo, float hi) {
  if (!std::isfinite(value) || value < lo || value > hi) {
    return invalid_argument(field, " is ", value, ", must be in [", lo, ", ", hi, "]");
  }
  return ok_status();
}

Status validate_logit_bias(const SamplingParams& p, int64_t vocab_size) {
  std::unordered_set<int32_t> seen;
  for (const auto& [token_id, bias] : p.logit_bias) {
    if (token_id < 0 || token_id >= vocab_size) {
      return invalid_argument("logit_bias token id ", token_id, " is outside the vocabulary [0, ",
                              vocab_size, ")");
    }
    if (!seen.insert(token_id).second) {
      return invalid_argument("logit_bias lists token id ", token_id, " twice");
    }
    if (!std::isfinite(bias) || std::fabs(bias) > kMaxAbsLogitBias) {
      return invalid_argument("logit_bias for token ", token_id, " is ", bias, ", must be in [",
                              -kMaxAbsLogitBias, ", ", kMaxAbsLogitBias, "]");
    }
  }
  return ok_status();
}

}  // namespace

Status SamplingParams::validate(int64_t vocab_size) const {
  if (min_tokens < 0) return invalid_argument("min_tokens is ", min_tokens, ", must be >= 0");
  for (int32_t id : min_tokens_banned) {
    if (id < 0 || id >= vocab_size) {
      return invalid_argument("min_tokens banned id ", id, " is outside the vocabulary [0, ",
                              vocab_size, ")");
    }
  }
  ARBOR_RETURN_IF_ERROR(check_range("temperature", temperature, 0.0f, kMaxTemperature));
  if (top_k < -1) {
    return invalid_argument("top_k is ", top_k, ", must be -1 or 0 (disabled) or a positive count");
  }
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f) {
    return invalid_argument("top_p is ", top_p, ", must be in (0, 1]");
  }
  ARBOR_RETURN_IF_ERROR(check_range("min_p", min_p, 0.0f, 1.0f));
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f ||
      repetition_penalty > kMaxRepetitionPenalty) {
    return invalid_argument("repetition_penalty is ", repetition_penalty, ", must be in (0, ",
                            kMaxRepetitionPenalty, "]");
  }
  ARBOR_RETURN_IF_ERROR(
      check_range("presence_penalty", presence_penalty, -kMaxAbsPenalty, kMaxAbsPenalty));
  ARBOR_RETURN_IF_ERROR(
      check_range("frequency_penalty", frequency_penalty, -kMaxAbsPenalty, kMaxAbsPenalty));
  ARBOR_RETURN_IF_ERROR(validate_logit_bias(*this, vocab_size));
  if (logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    return invalid_argument("logprobs is ", *logprobs, ", must be in [0, ", kMaxLogprobs, "]");
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    return invalid_argument("prompt_logprobs is ", *prompt_logprobs, ", must be in [0, ",
                            kMaxLogprobs, "]");
  }
  return ok_status();
}

}  // namespace arbor::sampling
