// POST /v1/responses: OpenAI's Responses API (docs/server.md, "/v1/responses"), served by the
// chat machinery: the input becomes chat messages rendered with the chat template
// (chat_prompt.h), and the output is read as on chat (chat_output.h) and written as output
// items.
//
// Request fields (request_fields.h lists them; anything else is a 400 naming it):
//   input                 a string (one user message) or a list of items:
//                         messages {"type"?: "message", "role": user | assistant | system |
//                         developer, "content": string | [input_text | output_text parts]},
//                         {"type": "function_call", "call_id", "name", "arguments"},
//                         {"type": "function_call_output", "call_id", "output"},
//                         {"type": "reasoning", "content"?: [reasoning_text], "summary"?}
//                         (its text becomes the next assistant message's reasoning_content).
//                         Images, files, audio and other item types are 400s naming the item.
//   instructions          a system message before everything (not carried over by
//                         previous_response_id, as OpenAI)
//   previous_response_id  continue a stored conversation (response_store.h): 404 when it is
//                         not (or no longer) stored
//   store                 default true: the response is kept for previous_response_id
//   tools                 function tools {"type": "function", "name", "description"?,
//                         "parameters"?, "strict"?}; built-in tools (web_search, file_search,
//                         computer_use_preview, code_interpreter, mcp, ...) are 400s
//   tool_choice           "none" | "auto" | "required" | {"type": "function", "name"}
//   parallel_tool_calls   default true
//   text.format           {"type": "text" | "json_object" | "json_schema", "schema", ...}
//   max_output_tokens     default: what fits in the context
//   temperature, top_p, stream, and arbor's extensions seed, top_k, min_p, repetition_penalty,
//   presence_penalty, frequency_penalty, speculation, priority, chat_template_kwargs
//   (e.g. {"enable_thinking": false}).
// The response: {"id": "resp_<request id>", "object": "response", "status": "completed" |
// "incomplete" (max_output_tokens) | "cancelled", "output": [reasoning item?, message?,
// function_call...], "usage", ...}; streamed as the Responses events (responses_output.h).
// Thread-safety: a pure function of its arguments and the store (request workers).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/api_common.h"

namespace arbor::server {

// Validates a /v1/responses body (renders the conversation); on success fills *out.
std::optional<ApiError> prepare_responses(const nlohmann::json& body, const ModelInfo& model,
                                          PreparedRequest* out);

}  // namespace arbor::server
