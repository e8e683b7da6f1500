// Which request fields the generation routes read — the one list per route (docs/server.md,
// "Fields"): OpenAI completions and chat, OpenAI responses, Anthropic messages and
// messages/count_tokens.
//
// A field arbor does not implement is a 400 naming it, never a 200 that silently ignores what
// the client asked for (an OpenAI feature arbor lacks, a vLLM option, a typo).
// Three kinds of field pass:
//   read       the request parsing reads it and it changes the answer;
//   metadata   it asks nothing of the output (OpenAI's `user`, `metadata`, `store: false`, ...;
//              Anthropic's `metadata`);
//   no-op      it asks for what arbor always does (`parallel_tool_calls` without `tools`,
//              `tool_choice: "none"` without `tools`, `service_tier: "auto"`; on responses
//              `background: false`, `truncation: "disabled"`, an empty `include` or `reasoning`).
// Everything else is refused: known fields with what arbor lacks ("'audio' is not supported
// (audio output)"), unknown ones as unknown.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "server/api_errors.h"

namespace arbor::server {

enum class RequestRoute { kCompletions, kChat, kResponses, kMessages, kCountTokens };

// nullopt when every field of `body` is read, metadata or a no-op on `route`.
std::optional<ApiError> check_request_fields(const nlohmann::json& body, RequestRoute route);

// The fields `route` reads (for documentation and the tests that walk the API schemas).
std::vector<std::string_view> read_fields(RequestRoute route);

}  // namespace arbor::server
