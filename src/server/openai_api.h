// The OpenAI-compatible API: request parsing and validation for POST /v1/completions and
// POST /v1/chat/completions (into an engine::GenerateRequest), and the response bodies and
// server-sent-event chunks (GET /v1/models: models_api.h). No I/O here: server.cc wires it to HTTP.
//
// Fields (docs/server.md): model, prompt (string, [ids], or a batch [string...] / [[ids]...];
// a batch becomes PreparedRequest::more_prompts), messages, max_tokens / max_completion_tokens, temperature, top_p, n, best_of, stop,
// seed, presence_penalty, frequency_penalty, logit_bias, logprobs (completions: int; chat: bool
// + top_logprobs), echo, stream, stream_options.include_usage, user; extensions top_k, min_p,
// repetition_penalty, ignore_eos, truncate_prompt_tokens, add_generation_prompt, prompt_logprobs
// (prompt_logprobs_api.h; echo + logprobs scores the prompt too).
// Thread-safety: functions are pure; a ResponseBuilder belongs to one request (I/O thread).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_common.h"

namespace arbor::server {

// Renders chat messages ([{"role":..., "content":...}, ...]) to a prompt string.
class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  // Errors (kInvalidArgument) name the message and the problem.
  virtual Result<std::string> render(const nlohmann::json& messages,
                                     bool add_generation_prompt) const = 0;
};

// Validates a /v1/completions body; on success fills *out.
std::optional<ApiError> prepare_completion(const nlohmann::json& body, const ModelInfo& model,
                                           PreparedRequest* out);
// Validates a /v1/chat/completions body (renders the messages); on success fills *out.
std::optional<ApiError> prepare_chat(const nlohmann::json& body, const ModelInfo& model,
                                     PreparedRequest* out);

}  // namespace arbor::server
