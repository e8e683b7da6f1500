// Tool calling's text formats: how a model writes its function calls, and reading them back out
// of its output into OpenAI `tool_calls` (docs/tool_calling.md).
//
// Formats:
//   kHermes      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, repeated for
//                parallel calls (Hermes 2/3, Qwen 2.5, Qwen 3; arbor's choice for templates that
//                do not render tools themselves).
//   kLlama3Json  {"name": "f", "parameters": {...}} as the whole message, optionally after
//                <|python_tag|>; parallel calls separated by ";" (Llama 3.1 / 3.2 / 3.3).
//   kHarmony     gpt-oss's harmony messages: <|channel|>commentary to=functions.f
//                <|constrain|>json<|message|>{...}<|call|> (harmony.h; the server reads the
//                whole output, reasoning included, with parse_harmony).
//
// parse_tool_calls() reads the whole output so far. It is prefix-monotone, which is what lets a
// stream send deltas: for any text T and any prefix P of T, parse(P, partial) describes a prefix
// of parse(T, final): its content is a prefix of the final content, its calls are the first calls
// of the final ones with the same names, every call's arguments a prefix of the final arguments.
// To keep that promise a partial parse holds back text that may still become a call (a trailing
// "<tool_c", a message that starts with "{" in kLlama3Json), and a call appears only once its
// name is complete and names one of the request's tools. Text that turns out not to be a call
// (bad JSON before the name, an unknown name) is content.
//
// Pure functions; any thread.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace arbor::chat {

// kQwen3Coder: Qwen3-Coder's and Qwen3.5's XML calls (vLLM's qwen3_coder parser):
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// whose arguments become a JSON object: each VALUE (one leading and one trailing newline
// dropped) typed by the parameter's schema type (ToolParamTypes): a "string" parameter's as a
// JSON string, an "integer", "number", "boolean", "object", "array" or "null" one's as written
// when it parses as that, else as a string; an untyped one's as written when it reads as a JSON
// number, boolean, null, object or array, else as a string.
enum class ToolCallFormat { kHermes, kLlama3Json, kHarmony, kQwen3Coder };

// "hermes", "llama3_json", "harmony", "qwen3_coder"
std::string_view tool_call_format_name(ToolCallFormat format);
// nullopt for an unknown name.
std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name);

// How a chat template handles tools.
struct TemplateToolSupport {
  // The template renders the `tools` variable (and tool calls and results) itself. When false,
  // the caller describes the tools in a system message and rewrites tool calls and results as
  // text (tool_prompt.h), in the kHermes format.
  bool renders_tools = false;
  ToolCallFormat format = ToolCallFormat::kHermes;
  std::string reason;  // why, for the server's log: "the template writes <tool_call>"
};

// Reads the template's source: it renders tools when it uses a `tools` variable; kQwen3Coder
// when it writes "<function=" (Qwen3-Coder, Qwen3.5), kHermes when it writes "<tool_call>",
// kLlama3Json when it writes "<|python_tag|>" or Llama 3 headers, and kHermes
// (with a reason saying so) for other templates that render tools.
TemplateToolSupport detect_tool_support(std::string_view template_source);

// Each tool's parameters' JSON Schema types by name ("string", "integer", ...; "" when the schema
// gives none), for formats whose values are untyped text (kQwen3Coder).
using ToolParamTypes = std::map<std::string, std::map<std::string, std::string>, std::less<>>;
// The types of `tools` (OpenAI's tool list: function.parameters.properties.P.type; an enum of
// strings is "string"; a list of types, its first non-null one).
ToolParamTypes tool_param_types(const nlohmann::ordered_json& tools);

struct ParsedToolCall {
  std::string name;
  // The arguments as the model wrote them: JSON text (a prefix of it while incomplete); "{}"
  // when a complete call has none.
  std::string arguments;
  bool complete = false;  // the call's JSON object has ended
};

struct ParsedToolOutput {
  std::string content;  // the text outside the calls
  std::vector<ParsedToolCall> calls;
};

// Reads `text`, the model's whole output so far (final: the output has ended). tool_names: the
// request's tools; a call naming another function is content. Never fails: what is not a call is
// content.
ParsedToolOutput parse_tool_calls(ToolCallFormat format, std::string_view text, bool final,
                                  std::span<const std::string> tool_names,
                                  const ToolParamTypes* types = nullptr);

// What a stream sends next: the difference between two parses of a growing output.
struct ToolCallDelta {
  int32_t index = 0;          // the call's index in the message
  bool first = false;         // the call's first delta: send its id, type and name
  std::string name;           // set when first
  std::string arguments;      // more argument text (may be empty)
};

// Turns successive parses of a growing output into the deltas OpenAI streams: more content, new
// calls (their names), more argument text. The concatenation of everything it returns equals the
// final parse. One per choice of a streamed request.
class ToolCallStreamer {
 public:
  ToolCallStreamer(ToolCallFormat format, std::vector<std::string> tool_names,
                   ToolParamTypes types = {})
      : format_(format), tool_names_(std::move(tool_names)), types_(std::move(types)) {}

  struct Step {
    std::string content;                // more content text
    std::vector<ToolCallDelta> calls;   // in call order
  };
  // text: the whole output so far; final: it has ended.
  Step update(std::string_view text, bool final);

  int32_t num_calls() const { return static_cast<int32_t>(sent_args_.size()); }

 private:
  ToolCallFormat format_;
  std::vector<std::string> tool_names_;
  ToolParamTypes types_;
  size_t sent_content_ = 0;
  std::vector<size_t> sent_args_;  // per call: argument bytes sent
};

}  // namespace arbor::chat
