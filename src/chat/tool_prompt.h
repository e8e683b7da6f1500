// The messages a chat template sees when a conversation involves tools (docs/tool_calling.md).
//
// OpenAI clients send assistant tool calls with `function.arguments` as JSON *text*, and a null
// content beside them; Hugging Face templates write arguments with `tojson` and test the content
// as a string. template_messages() therefore parses each call's arguments into a JSON value and
// turns a null content into "" (vLLM does the same).
//
// A template that does not render tools (llama2, mistral, zephyr, ...) would drop them silently.
// For those, template_messages() also rewrites the conversation as plain text any template can
// show, in the kHermes format that parse_tool_calls() reads back:
//   * the tools are described in a system message (put before the content of a leading system
//     message, or a new first message);
//   * an assistant message's tool calls follow its content as <tool_call> blocks;
//   * tool results (role "tool") become one user message of <tool_response> blocks per run of
//     results, joined with the user message that follows, if any (templates that insist on
//     alternating roles keep working).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace arbor::chat {

// messages: an OpenAI `messages` array (already checked to be objects with string roles).
// tools: the request's `tools` array ([{"type": "function", "function": {...}}]) or null.
// Errors (kInvalidArgument) name the message: content parts that are not text.
Result<nlohmann::ordered_json> template_messages(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 bool template_renders_tools);

// The system text that describes `tools` to a model whose template does not render them.
std::string describe_tools(const nlohmann::ordered_json& tools);

}  // namespace arbor::chat
