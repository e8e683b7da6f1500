#include "sched/request.h"

#include <utility>

#include "sampling/rng.h"

namespace arbor::sched {

RequestId child_request_id(RequestId parent_id, int32_t index) {
  ARBOR_CHECK(parent_id < kMaxUserRequestId && index >= 0 && index < 65535);
  return (static_cast<RequestId>(index + 1) << 48) | parent_id;
}

bool is_finished(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting:
    case RequestStatus::kRunning:
    case RequestStatus::kPreempted:
    case RequestStatus::kForked:
      return false;
    case RequestStatus::kFinishedStopped:
    case RequestStatus::kFinishedLength:
    case RequestStatus::kFinishedAborted:
      return true;
  }
  return false;
}

std::string_view request_status_name(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting: return "waiting";
    case RequestStatus::kRunning: return "running";
    case RequestStatus::kPreempted: return "preempted";
    case RequestStatus::kForked: return "forked";
    case RequestStatus::kFinishedStopped: return "finished_stopped";
    case RequestStatus::kFinishedLength: return "finished_length";
    case RequestStatus::kFinishedAborted: return "finished_aborted";
  }
  return "?";
}

std::string_view stop_kind_name(StopKind kind) {
  switch (kind) {
    case StopKind::kEos: return "eos";
    case StopKind::kStopToken: return "stop_token";
    case StopKind::kStopString: return "stop_string";
    case StopKind::kMaxTokens: return "max_tokens";
    case StopKind::kMaxModelLen: return "max_model_len";
    case StopKind::kAbort: return "abort";
  }
  return "?";
}

FinishReason StopReason::finish_reason() const {
  switch (kind) {
    case StopKind::kEos:
    case StopKind::kStopToken:
    case StopKind::kStopString:
      return FinishReason::kStop;
    case StopKind::kMaxTokens:
    case StopKind::kMaxModelLen:
      return FinishReason::kLength;
    case StopKind::kAbort:
      return FinishReason::kAbort;
  }
  return FinishReason::kAbort;
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "?";
}

int64_t Request::target_tokens() const {
  if (is_fork_parent()) return num_prompt_tokens() - 1;
  return num_tokens();
}

kv::KvRequest Request::kv_view() const {
  const int64_t committed = is_fork_parent() ? num_prompt_tokens() - 1 : num_tokens();
  return kv::KvRequest{
      .request_id = request_id,
      .token_ids = std::span<const int32_t>(token_ids.data(), static_cast<size_t>(committed)),
      .num_computed_tokens = num_computed_tokens,
      .cache_salt = cache_salt,
  };
}

void Request::append_output(int32_t token_id) { token_ids.push_back(token_id); }

Status validate_request_spec(const RequestSpec& spec, int32_t vocab_size) {
  if (spec.request_id >= kMaxUserRequestId) {
    return invalid_argument("request id ", spec.request_id, " is >= 2^48");
  }
  if (spec.prompt_token_ids.empty()) return invalid_argument("prompt has 0 tokens");
  for (size_t i = 0; i < spec.prompt_token_ids.size(); ++i) {
    const int32_t id = spec.prompt_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return invalid_argument("prompt token ", i, " is ", id, ", vocabulary size is ", vocab_size);
    }
  }
  if (spec.stop.max_tokens < 0) {
    return invalid_argument("max_tokens is ", spec.stop.max_tokens, ", must be >= 0");
  }
  if (spec.n < 1) return invalid_argument("n is ", spec.n, ", must be >= 1");
  const int32_t best_of = spec.best_of == 0 ? spec.n : spec.best_of;
  if (spec.stop.max_tokens == 0 && best_of > 1) {
    return invalid_argument("max_tokens is 0 with n = ", spec.n, " and best_of = ", best_of,
                            ": a request that generates nothing has one sample");
  }
  if (best_of < spec.n || best_of > 1024) {
    return invalid_argument("best_of is ", best_of, ", must be in [n = ", spec.n, ", 1024]");
  }
  if (spec.speculation.k < 0 || spec.speculation.k > kMaxSpecTokens) {
    return invalid_argument("speculation.k is ", spec.speculation.k, ", must be in [0, ",
                            kMaxSpecTokens, "]");
  }
  if (spec.pooling &&
      (spec.stop.max_tokens != 0 || best_of != 1 || spec.sampling.prompt_logprobs.has_value())) {
    return invalid_argument("a pooling request (", step::pooling_type_name(*spec.pooling),
                            ") generates nothing: max_tokens is ", spec.stop.max_tokens,
                            " and best_of is ", best_of, ", must be 0 and 1, without "
                            "prompt_logprobs");
  }
  if (const auto k = static_cast<int64_t>(spec.resumed_output_token_ids.size()); k > 0) {
    if (best_of != 1 || spec.pooling || spec.sampling.prompt_logprobs.has_value()) {
      return invalid_argument("a resumed sample needs n = best_of = 1, no pooling and no "
                              "prompt_logprobs (best_of is ", best_of, ")");
    }
    if (k >= spec.stop.max_tokens) {
      return invalid_argument("resumed with ", k, " generated tokens, max_tokens is ",
                              spec.stop.max_tokens, ": nothing is left to generate");
    }
    for (size_t i = 0; i < spec.resumed_output_token_ids.size(); ++i) {
      const int32_t id = spec.resumed_output_token_ids[i];
      if (id < 0 || id >= vocab_size) {
        return invalid_argument("resumed token ", i, " is ", id, ", vocabulary size is ",
                                vocab_size);
      }
    }
  }
  if (spec.speculation.mode == SpecMode::kFixed && spec.speculation.k < 1) {
    return invalid_argument("speculation.k is ", spec.speculation.k,
                            ", must be >= 1 with mode \"fixed\"");
  }
  return spec.sampling.validate(vocab_size);
}

Status check_prompt_length(int64_t num_prompt_tokens, int64_t max_model_len) {
  if (max_model_len > 0 && num_prompt_tokens >= max_model_len) {
    return invalid_argument("prompt has ", num_prompt_tokens, " tokens, max_model_len is ",
                            max_model_len, " (at least one token must be generated)");
  }
  return ok_status();
}

Status check_input_length(int64_t num_prompt_tokens, int64_t max_model_len) {
  if (max_model_len > 0 && num_prompt_tokens > max_model_len) {
    return invalid_argument("input has ", num_prompt_tokens, " tokens, max_model_len is ",
                            max_model_len);
  }
  return ok_status();
}

uint64_t derive_sample_seed(uint64_t seed, int32_t index) {
  // splitmix64 finaliser over seed and index: distinct, well-mixed streams per sample.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(index) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Request make_request(RequestSpec spec) {
  Request r;
  r.request_id = spec.request_id;
  r.token_ids = std::move(spec.prompt_token_ids);
  r.num_prompt = static_cast<int64_t>(r.token_ids.size());
  r.seed = spec.sampling.seed ? *spec.sampling.seed : sampling::Rng::random_seed();
  r.sampling = std::move(spec.sampling);
  r.stop = std::move(spec.stop);
  r.n = spec.n;
  r.best_of = spec.best_of == 0 ? spec.n : spec.best_of;
  r.priority = spec.priority;
  r.arrival_time = spec.arrival_time;
  r.cache_salt = std::move(spec.cache_salt);
  r.spec.params = spec.speculation;
  r.pooling = spec.pooling;
  r.token_ids.insert(r.token_ids.end(), spec.resumed_output_token_ids.begin(),
                     spec.resumed_output_token_ids.end());
  return r;
}

}  // namespace arbor::sched
