// POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API (docs/server.md,
// "/v1/messages"), served by the chat machinery: the system prompt and messages become chat
// messages rendered with the chat template (chat_prompt.h), and the output is read as on chat
// (chat_output.h) and written as content blocks (messages_output.h). Errors are in Anthropic's
// shape ({"type": "error", "error": {"type", "message"}}, api_errors.h).
//
// Request fields (request_fields.h lists them; anything else is a 400 naming it):
//   model, max_tokens (required, >= 1), stream, temperature, top_p, top_k, stop_sequences (up to
//   16), metadata (ignored: it asks nothing of the output), and arbor's extensions seed, min_p,
//   repetition_penalty, presence_penalty, frequency_penalty, speculation, priority;
//   system      a string or a list of text blocks;
//   messages    [{"role": "user" | "assistant", "content": string | blocks}], blocks being
//               text, tool_result {"tool_use_id", "content": string | text blocks,
//               "is_error"?} (user), thinking {"thinking", "signature"} and tool_use {"id",
//               "name", "input"} (assistant); images, documents, redacted thinking and server
//               tool blocks are 400s naming the block. cache_control and citations pass. A final
//               assistant message (prefilling the reply) is a 400.
//   tools       [{"name", "description"?, "input_schema", "type"?: "custom"}]; Anthropic's
//               server tools (bash, text_editor, web_search, computer, code_execution, ...)
//               are 400s;
//   tool_choice {"type": "auto" | "any" | "tool" (+ "name") | "none",
//               "disable_parallel_tool_use"?}: any and tool are enforced by the grammar;
//   thinking    {"type": "enabled", "budget_tokens": >= 1024 and < max_tokens}: the template's
//               enable_thinking is true and the reasoning comes back as thinking blocks (the
//               budget is checked as Anthropic checks it, not enforced: the thinking ends when
//               the model ends it, or at max_tokens); {"type": "disabled"}: enable_thinking is
//               false and no thinking block is returned. Absent: the template's default, and
//               any reasoning comes back as thinking blocks.
// count_tokens reads model, system, messages, tools, tool_choice and thinking, and answers
// {"input_tokens": N}: the tokens of the same prompt /v1/messages renders.
// Thread-safety: pure functions (request workers).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_common.h"

namespace arbor::server {

// Validates a /v1/messages body (renders the conversation); on success fills *out.
std::optional<ApiError> prepare_messages(const nlohmann::json& body, const ModelInfo& model,
                                         PreparedRequest* out);

// /v1/messages/count_tokens: on success *answer is the JSON body.
std::optional<ApiError> count_message_tokens(const nlohmann::json& body,
                                             std::string_view raw_body, const ModelInfo& model,
                                             std::string* answer);

}  // namespace arbor::server
