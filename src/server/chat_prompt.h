// What the chat-shaped routes share between the request and the engine: /v1/chat/completions,
// /v1/responses and /v1/messages each turn their body into OpenAI-shaped chat messages and a
// ToolRequest, then
//   1. render_chat_prompt: the chat template renders the messages, and the prompt is tokenised
//      with message content kept literal (control-token text typed by a user stays text);
//   2. the route reads its sampling fields and its structured-output field;
//   3. constrain_chat_output: tool_choice required / named becomes a grammar, a thinking model's
//      grammar waits for the end of its thinking block, and the output options say how the
//      answer is read back (chat_output.h).
// One implementation of each step, so the three APIs cannot drift apart.
// Thread-safety: pure functions (request workers).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_common.h"
#include "server/chat_output.h"
#include "server/openai_api.h"
#include "server/tool_calling_api.h"

namespace arbor::server {

struct ChatPrompt {
  std::string text;                // the rendered template
  std::vector<int32_t> token_ids;  // its tokens (no BOS added: the template writes it)
};

// messages: OpenAI chat messages, valid (objects with a known role and string, part-array or
// assistant-null content). Errors name `param`, the field the client sent the conversation in
// ("messages", "input"): no chat template, a template error, content holding control-token
// text that this template does not let arbor keep literal, an empty prompt.
std::optional<ApiError> render_chat_prompt(const ModelInfo& model,
                                           const nlohmann::ordered_json& messages,
                                           const ChatPromptExtras& extras, std::string_view param,
                                           ChatPrompt* out);

// Call after the route has read its fields into `r` (a structured-output grammar included):
// forces calls with a grammar when `tools` asks (a conflict with another grammar is a 400 on
// tool_choice), gates the grammar behind a thinking model's block when `prompt` leaves the
// model thinking, and fills `out` with how the output is read.
std::optional<ApiError> constrain_chat_output(const ModelInfo& model, const ToolRequest& tools,
                                              const std::string& prompt,
                                              engine::GenerateRequest* r, ChatOutputOptions* out);

// The body with the client's key order (tools and tool-call arguments reach the template as
// written, as transformers renders them): parsed again from raw_body when given.
nlohmann::ordered_json ordered_body(const nlohmann::json& body, std::string_view raw_body);

// vLLM's chat_template_kwargs (an object of more template variables, e.g. {"enable_thinking":
// false}); it may not set messages, tools or add_generation_prompt. Leaves *out unchanged when
// absent.
// reasoning_effort ("low", "medium", "high") as the template variable of that name, into
// extras->template_kwargs (after read_template_kwargs); 400 when the template does not read it.
std::optional<ApiError> read_reasoning_effort(const nlohmann::json& body, const ModelInfo& model,
                                              ChatPromptExtras* extras);
std::optional<ApiError> read_template_kwargs(const nlohmann::ordered_json& body,
                                             nlohmann::ordered_json* out);

}  // namespace arbor::server
