// The OpenAI-compatible API: request parsing and validation for POST /v1/completions and
// POST /v1/chat/completions (into an engine::GenerateRequest), and the response bodies and
// server-sent-event chunks (GET /v1/models: models_api.h). No I/O here: server.cc wires it to HTTP.
//
// Fields (docs/server.md): model, tools, tool_choice, parallel_tool_calls,
// chat_template_kwargs (tool_calling_api.h), prompt (string, [ids], or a batch [string...] / [[ids]...];
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

#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "server/api_common.h"

namespace arbor::server {

// What a chat prompt is rendered with besides the messages.
struct ChatPromptExtras {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;            // the request's tools, or null
  nlohmann::ordered_json template_kwargs;  // chat_template_kwargs (an object), or null
};

// Renders chat messages ([{"role":..., "content":..., "tool_calls"?...}, ...]) to a prompt
// string: the messages pass through chat::template_messages() (tool calls and results made fit
// for the template), then the template sees every message field, `tools` (when it renders them)
// and the template kwargs.
class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  // Errors (kInvalidArgument) name the message and the problem.
  virtual Result<std::string> render(const nlohmann::ordered_json& messages,
                                     const ChatPromptExtras& extras) const = 0;
  // How the template handles tools and how the model writes calls (--tool-call-parser may
  // have chosen the format).
  virtual const chat::TemplateToolSupport& tool_support() const = 0;
  // How the model writes its thinking (--reasoning-format may have chosen it); nullopt: the
  // output is all content.
  virtual const std::optional<chat::ReasoningSyntax>& reasoning() const = 0;
  // Whether the template's source names `variable` (so a request field passed as that template
  // variable, such as reasoning_effort, is read rather than ignored).
  virtual bool reads_variable(std::string_view variable) const = 0;
};

// Validates a /v1/completions body; on success fills *out.
std::optional<ApiError> prepare_completion(const nlohmann::json& body, const ModelInfo& model,
                                           PreparedRequest* out);
// Validates a /v1/chat/completions body (renders the messages); on success fills *out.
std::optional<ApiError> prepare_chat(const nlohmann::json& body, const ModelInfo& model,
                                     PreparedRequest* out);

}  // namespace arbor::server
