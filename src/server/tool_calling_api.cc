#include "server/tool_calling_api.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "grammar/gbnf_text.h"
#include "grammar/json_number_gbnf.h"
#include "grammar/json_schema_to_gbnf.h"

namespace arbor::server {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::optional<ApiError> read_tool(const ojson& tool, size_t i, std::string* name) {
  const std::string where = str_cat("tools[", i, "]");
  if (!tool.is_object()) return invalid_param("tools", str_cat(where, " must be an object"));
  if (tool.value("type", ojson()) != "function") {
    return invalid_param("tools", str_cat(where, ".type must be \"function\""));
  }
  auto f = tool.find("function");
  if (f == tool.end() || !f->is_object()) {
    return invalid_param("tools", str_cat(where, ".function must be an object"));
  }
  auto n = f->find("name");
  if (n == f->end() || !n->is_string() || !valid_function_name(n->get<std::string>())) {
    return invalid_param("tools", str_cat(where, ".function.name must be 1-64 characters of "
                                                 "a-z, A-Z, 0-9, _ and -"));
  }
  *name = n->get<std::string>();
  auto d = f->find("description");
  if (d != f->end() && !d->is_null() && !d->is_string()) {
    return invalid_param("tools", str_cat(where, ".function.description must be a string"));
  }
  auto p = f->find("parameters");
  if (p != f->end() && !p->is_null() && !p->is_object()) {
    return invalid_param("tools", str_cat(where, ".function.parameters must be a JSON Schema "
                                                 "object"));
  }
  auto s = f->find("strict");
  if (s != f->end() && !s->is_null() && !s->is_boolean()) {
    return invalid_param("tools", str_cat(where, ".function.strict must be a boolean"));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tool_choice(const json& body, ToolRequest* out) {
  auto it = body.find("tool_choice");
  out->choice = out->has_tools() ? ToolChoice::kAuto : ToolChoice::kNone;
  if (it == body.end() || it->is_null()) return std::nullopt;
  const json& c = *it;
  if (c == "none") {
    out->choice = ToolChoice::kNone;
    return std::nullopt;
  }
  if (!out->has_tools()) {
    return invalid_param("tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
  }
  if (c == "auto") return std::nullopt;
  if (c == "required") {
    out->choice = ToolChoice::kRequired;
    return std::nullopt;
  }
  const bool named = c.is_object() && c.value("type", json()) == "function" &&
                     c.contains("function") && c["function"].is_object() &&
                     c["function"].contains("name") && c["function"]["name"].is_string();
  if (!named) {
    return invalid_param("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" "
                                        "or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  out->named = c["function"]["name"].get<std::string>();
  if (std::find(out->names.begin(), out->names.end(), out->named) == out->names.end()) {
    return invalid_param("tool_choice", str_cat("'tool_choice' names function '", out->named,
                                                "', which is not in 'tools'"));
  }
  out->choice = ToolChoice::kNamed;
  return std::nullopt;
}

// {"name": <const>, <args_key>: <parameters>} for one tool.
// A tool's `parameters` schema (absent: an empty object).
ojson parameters_schema(const ojson& tool) {
  const ojson& f = tool["function"];
  return f.contains("parameters") && f["parameters"].is_object()
             ? f["parameters"]
             : ojson{{"type", "object"}, {"properties", ojson::object()}};
}

ojson call_schema(const ojson& tool, std::string_view args_key) {
  const ojson& f = tool["function"];
  ojson params = parameters_schema(tool);
  ojson properties = ojson::object();
  properties["name"] = {{"const", f["name"]}};
  properties[std::string(args_key)] = std::move(params);
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", {"name", std::string(args_key)}}};
}

// Harmony (gpt-oss): one call, a commentary message to functions.NAME whose body is the
// arguments (generation ends at its <|call|>, so a response holds one call), after
// "<|start|>assistant", which the thinking gate skips (chat_prompt.cc, read_harmony). Each
// tool's argument rules are converted under their own root (args-I); the shared rules (ws,
// string, ...) come out identical from every conversion and are kept once.
Result<std::string> harmony_call_grammar(const ToolRequest& request) {
  std::string root = "root ::= ";
  std::vector<std::string> rules;
  std::map<std::string, std::string, std::less<>> defined;  // rule name -> its line
  bool first = true;
  for (size_t i = 0; i < request.names.size(); ++i) {
    if (request.choice == ToolChoice::kNamed && request.names[i] != request.named) continue;
    grammar::JsonGrammarOptions options;
    options.root_rule = str_cat("args-", i);
    Result<std::string> args = grammar::json_schema_to_gbnf(parameters_schema(request.tools[i]),
                                                            options);
    if (!args.ok()) {
      return invalid_argument("the parameters of tool '", request.names[i],
                              "' cannot be enforced: ", args.status().message());
    }
    root += str_cat(first ? "" : " | ",
                    grammar::gbnf_literal_ascii(str_cat("<|channel|>commentary to=functions.",
                                                        request.names[i],
                                                        " <|constrain|>json<|message|>")),
                    " ", options.root_rule);
    first = false;
    std::istringstream lines(*args);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      const std::string name = line.substr(0, line.find(" ::="));
      auto [it, added] = defined.emplace(name, line);
      if (added) {
        rules.push_back(line);
      } else if (it->second != line) {
        return invalid_argument("the parameters of tool '", request.names[i], "' define rule '",
                                name, "' differently from another tool's; give their $defs "
                                "distinct names");
      }
    }
  }
  std::string out = root + "\n";
  for (const std::string& r : rules) out += r + "\n";
  return out;
}

// One XML parameter value's GBNF by its schema (the text chat::parse_tool_calls types back):
// an enum of strings its members, an integer its range (minimum / maximum, else 16 digits), a
// number a JSON number, a boolean true / false, a string up to maxLength characters (at least
// minLength) of anything but '<', and anything else text without '<'.
std::string xml_value_gbnf(const ojson& schema) {
  if (!schema.is_object()) return "[^<]*";
  if (schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty() &&
      std::all_of(schema["enum"].begin(), schema["enum"].end(),
                  [](const ojson& e) { return e.is_string(); })) {
    std::string alts;
    for (const ojson& e : schema["enum"]) {
      alts += str_cat(alts.empty() ? "" : " | ", grammar::gbnf_literal_ascii(e.get<std::string>()));
    }
    return "(" + alts + ")";
  }
  const std::string type = schema.value("type", ojson("")).is_string()
                               ? schema.value("type", ojson("")).get<std::string>()
                               : std::string();
  const auto bound = [&](const char* key, int64_t fallback) {
    const auto it = schema.find(key);
    return it != schema.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  if (type == "integer") {
    const int64_t lo = bound("minimum", -grammar::kMaxUnboundedInteger);
    const int64_t hi = bound("maximum", grammar::kMaxUnboundedInteger);
    if (lo <= hi) return grammar::integer_range_gbnf(lo, hi);
  }
  if (type == "number") return "\"-\"? [0-9]+ (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?";
  if (type == "boolean") return "(\"true\" | \"false\")";
  if (type == "string") {
    const int64_t lo = std::max<int64_t>(0, bound("minLength", 0));
    const int64_t hi = bound("maxLength", -1);
    if (hi >= lo && hi <= 256) return str_cat("[^<]{", lo, ",", hi, "}");
    if (lo > 0 && lo <= 256) return str_cat("[^<]{", lo, ",}");
  }
  return "[^<]*";
}

// Qwen3-Coder / Qwen3.5 XML calls (chat::ToolCallFormat::kQwen3Coder): per allowed tool its
// <function=NAME> block with its schema's properties as <parameter=P> blocks, the required ones
// in schema order, then each optional one at most once in order, each value by
// xml_value_gbnf. Nested objects' and arrays' own schemas are not enforced (text without '<').
std::string qwen3_coder_call_grammar(const ToolRequest& request) {
  const bool many = request.parallel && request.choice == ToolChoice::kRequired;
  std::string out = many ? "root ::= call (\"\\n\" call)*\n" : "root ::= call\n";
  std::string functions, rules;
  for (size_t i = 0; i < request.names.size(); ++i) {
    if (request.choice == ToolChoice::kNamed && request.names[i] != request.named) continue;
    const ojson params = parameters_schema(request.tools[i]);
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array()) {
      for (const ojson& r : params["required"]) {
        if (r.is_string()) required.insert(r.get<std::string>());
      }
    }
    const std::string fn = str_cat("fn-", i);
    std::string must, may;
    if (params.contains("properties") && params["properties"].is_object()) {
      int j = 0;
      for (const auto& [key, schema] : params["properties"].items()) {
        const std::string p = str_cat(fn, "-p", j++);
        rules += str_cat(p, " ::= ", grammar::gbnf_literal_ascii(str_cat("<parameter=", key, ">\n")),
                         " ", xml_value_gbnf(schema), " \"\\n</parameter>\\n\"\n");
        if (required.contains(key)) {
          must += " " + p;
        } else {
          may += " " + p + "?";
        }
      }
    }
    functions += str_cat(functions.empty() ? "" : " | ", fn);
    rules += str_cat(fn, " ::= ",
                     grammar::gbnf_literal_ascii(str_cat("<function=", request.names[i], ">\n")),
                     must, may, " \"</function>\\n\"\n");
  }
  out += str_cat("call ::= \"<tool_call>\\n\" (", functions, ") \"</tool_call>\"\n");
  return out + rules;
}

}  // namespace

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
  });
}

std::optional<ApiError> read_tools(const json& body, const ojson& ordered, ToolRequest* out) {
  auto it = ordered.find("tools");
  if (it != ordered.end() && !it->is_null()) {
    if (!it->is_array()) return invalid_param("tools", "'tools' must be an array");
    if (it->size() > kMaxTools) {
      return invalid_param("tools", str_cat("'tools' has ", it->size(), " tools, at most ",
                                            kMaxTools, " are allowed"));
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < it->size(); ++i) {
      std::string name;
      ARBOR_API_TRY(read_tool((*it)[i], i, &name));
      if (!seen.insert(name).second) {
        return invalid_param("tools", str_cat("tools[", i, "]: function '", name,
                                              "' is defined twice"));
      }
      out->names.push_back(std::move(name));
    }
    if (!it->empty()) out->tools = *it;
  }
  ARBOR_API_TRY(read_tool_choice(body, out));
  auto p = body.find("parallel_tool_calls");
  if (p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) {
      return invalid_param("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    }
    out->parallel = p->get<bool>();
  }
  return std::nullopt;
}

Result<std::string> tool_call_grammar(const ToolRequest& request, chat::ToolCallFormat format) {
  if (format == chat::ToolCallFormat::kHarmony) return harmony_call_grammar(request);
  if (format == chat::ToolCallFormat::kQwen3Coder) return qwen3_coder_call_grammar(request);
  const bool hermes = format == chat::ToolCallFormat::kHermes;
  const std::string_view args_key = hermes ? "arguments" : "parameters";
  ojson branches = ojson::array();
  for (size_t i = 0; i < request.names.size(); ++i) {
    if (request.choice == ToolChoice::kNamed && request.names[i] != request.named) continue;
    branches.push_back(call_schema(request.tools[i], args_key));
  }
  const ojson schema = branches.size() == 1 ? branches[0] : ojson{{"anyOf", branches}};
  grammar::JsonGrammarOptions options;
  options.root_rule = "call-json";
  Result<std::string> json_rules = grammar::json_schema_to_gbnf(schema, options);
  if (!json_rules.ok()) {
    return invalid_argument("a tool's parameters cannot be enforced: ",
                            json_rules.status().message());
  }
  const bool many = request.parallel && request.choice == ToolChoice::kRequired;
  std::string top;
  if (hermes) {
    top = "root ::= call";
    if (many) top += " (\"\\n\" call)*";
    top += "\ncall ::= \"<tool_call>\\n\" call-json \"\\n</tool_call>\"\n";
  } else {
    top = "root ::= call-json";
    if (many) top += " (\"; \" call-json)*";
    top += "\n";
  }
  return top + *json_rules;
}

}  // namespace arbor::server
