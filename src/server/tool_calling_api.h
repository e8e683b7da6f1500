// Tool calling on /v1/chat/completions (docs/tool_calling.md): the request's `tools`,
// `tool_choice` and `parallel_tool_calls`, and the grammar that enforces `required` and named
// choices.
//
//   tools                [{"type": "function", "function": {"name", "description"?,
//                         "parameters"? (a JSON Schema), "strict"?}}], at most kMaxTools, names
//                         of 1-64 characters [a-zA-Z0-9_-], distinct.
//   tool_choice          "none": the tools reach the template, the output is plain content;
//                        "auto" (the default with tools): the output is parsed for calls;
//                        "required": the grammar makes the output one or more calls;
//                        {"type": "function", "function": {"name": F}}: one call of F.
//   parallel_tool_calls  true (default): required may make several calls; false: one (with
//                        auto, calls after the first are dropped).
// Without tools, only tool_choice "none" and parallel_tool_calls pass (request_fields.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "chat/tool_calls.h"
#include "server/api_common.h"

namespace arbor::server {

inline constexpr size_t kMaxTools = 128;

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  nlohmann::ordered_json tools;     // as the client sent them (its key order); null: no tools
  std::vector<std::string> names;   // [tools] function names
  ToolChoice choice = ToolChoice::kNone;
  std::string named;                // kNamed: the function
  bool parallel = true;

  bool has_tools() const { return !names.empty(); }
  // The output is read for calls (auto, required, named).
  bool parses_calls() const { return choice != ToolChoice::kNone; }
  // The grammar decides the output (required, named).
  bool forces_calls() const { return choice == ToolChoice::kRequired || choice == ToolChoice::kNamed; }
};

// A function name as OpenAI and Anthropic allow them: 1-64 characters of a-z, A-Z, 0-9, _ and -.
bool valid_function_name(const std::string& name);

// Reads tools, tool_choice and parallel_tool_calls. body: the request; ordered: the same request
// with the client's key order (the tools' JSON reaches the template as written).
std::optional<ApiError> read_tools(const nlohmann::json& body,
                                   const nlohmann::ordered_json& ordered, ToolRequest* out);

// The GBNF grammar for a request that forces calls, in `format`: one call (named, or parallel
// off) or one or more, each naming one of the allowed tools with arguments valid under its
// `parameters` schema (json_schema_to_gbnf.h's subset; absent parameters: an empty object).
// kInvalidArgument names the tool whose schema cannot be compiled. kHarmony: one call, written
// as gpt-oss does after "<|start|>assistant": <|channel|>commentary to=functions.NAME
// <|constrain|>json<|message|>ARGUMENTS (its <|call|> ends generation).
Result<std::string> tool_call_grammar(const ToolRequest& request, chat::ToolCallFormat format);

}  // namespace arbor::server
