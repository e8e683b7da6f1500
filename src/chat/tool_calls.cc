#include "chat/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <regex>

#include "chat/call_deltas.h"
#include "chat/harmony.h"

namespace arbor::chat {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr size_t kNone = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_space(std::string_view t, size_t i) {
  while (i < t.size() && is_space(t[i])) ++i;
  return i;
}

bool all_space(std::string_view t) { return std::all_of(t.begin(), t.end(), is_space); }

// The length of the longest suffix of `t` that is a proper prefix of `word` (text a partial parse
// holds back because it may still become `word`).
size_t partial_suffix(std::string_view t, std::string_view word) {
  for (size_t n = std::min(t.size(), word.size() - 1); n > 0; --n) {
    if (t.substr(t.size() - n) == word.substr(0, n)) return n;
  }
  return 0;
}

enum class Scan { kComplete, kIncomplete, kInvalid };

struct ScanResult {
  Scan state = Scan::kInvalid;
  size_t end = 0;  // kComplete: just past the value; kInvalid: where it went wrong
};

// A JSON string starting at t[i] == '"'. *decoded (when given) receives its value, with the
// short escapes decoded and \uXXXX kept as written (tool names never need it).
ScanResult scan_string(std::string_view t, size_t i, std::string* decoded) {
  for (size_t j = i + 1; j < t.size(); ++j) {
    const char c = t[j];
    if (c == '"') return {Scan::kComplete, j + 1};
    if (c != '\\') {
      if (decoded) decoded->push_back(c);
      continue;
    }
    if (++j >= t.size()) break;
    if (!decoded) continue;
    switch (t[j]) {
      case 'n': decoded->push_back('\n'); break;
      case 't': decoded->push_back('\t'); break;
      case 'r': decoded->push_back('\r'); break;
      case 'b': decoded->push_back('\b'); break;
      case 'f': decoded->push_back('\f'); break;
      case 'u': decoded->append("\\u"); break;
      default: decoded->push_back(t[j]);
    }
  }
  return {Scan::kIncomplete, t.size()};
}

bool is_scalar_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '+' || c == '.';
}

// A JSON value at t[i] (no leading space). Objects and arrays are matched by bracket depth with
// strings skipped: lenient inside, which is enough to find where the arguments end (they are
// passed on as written).
ScanResult scan_value(std::string_view t, size_t i) {
  if (i >= t.size()) return {Scan::kIncomplete, t.size()};
  const char c = t[i];
  if (c == '"') return scan_string(t, i, nullptr);
  if (c == '{' || c == '[') {
    std::string closers;
    for (size_t j = i; j < t.size(); ++j) {
      const char d = t[j];
      if (d == '"') {
        const ScanResult s = scan_string(t, j, nullptr);
        if (s.state != Scan::kComplete) return s;
        j = s.end - 1;
      } else if (d == '{' || d == '[') {
        closers.push_back(d == '{' ? '}' : ']');
      } else if (d == '}' || d == ']') {
        if (d != closers.back()) return {Scan::kInvalid, j};
        closers.pop_back();
        if (closers.empty()) return {Scan::kComplete, j + 1};
      }
    }
    return {Scan::kIncomplete, t.size()};
  }
  if (!is_scalar_char(c)) return {Scan::kInvalid, i};
  size_t j = i;
  while (j < t.size() && is_scalar_char(t[j])) ++j;
  // A number at the very end may still grow.
  return {j == t.size() ? Scan::kIncomplete : Scan::kComplete, j};
}

// One call's JSON object: {"name": "...", "arguments": {...}} with the keys in any order (and
// "parameters" for "arguments"), other keys skipped.
struct CallScan {
  Scan state = Scan::kInvalid;
  size_t end = 0;                    // as ScanResult
  std::optional<std::string> name;   // once its string is complete
  size_t args_begin = kNone;         // the arguments value's first byte, once seen
  size_t args_end = kNone;           // just past it, once complete
};

CallScan scan_call(std::string_view t, size_t i) {
  CallScan r;
  const auto stop = [&](Scan s, size_t at) {
    r.state = s;
    r.end = at;
    return r;
  };
  i = skip_space(t, i);
  if (i >= t.size()) return stop(Scan::kIncomplete, i);
  if (t[i] != '{') return stop(Scan::kInvalid, i);
  ++i;
  for (bool first = true;; first = false) {
    i = skip_space(t, i);
    if (i >= t.size()) return stop(Scan::kIncomplete, i);
    if (t[i] == '}' && first) return stop(Scan::kComplete, i + 1);
    if (t[i] != '"') return stop(Scan::kInvalid, i);
    std::string key;
    const ScanResult k = scan_string(t, i, &key);
    if (k.state != Scan::kComplete) return stop(k.state, k.end);
    i = skip_space(t, k.end);
    if (i >= t.size()) return stop(Scan::kIncomplete, i);
    if (t[i] != ':') return stop(Scan::kInvalid, i);
    i = skip_space(t, i + 1);
    if (i >= t.size()) return stop(Scan::kIncomplete, i);
    const bool is_args = (key == "arguments" || key == "parameters") && r.args_begin == kNone;
    if (key == "name" && !r.name) {
      if (t[i] != '"') return stop(Scan::kInvalid, i);
      std::string name;
      const ScanResult v = scan_string(t, i, &name);
      if (v.state != Scan::kComplete) return stop(v.state, v.end);
      r.name = std::move(name);
      i = v.end;
    } else {
      if (is_args) r.args_begin = i;
      const ScanResult v = scan_value(t, i);
      if (v.state != Scan::kComplete) return stop(v.state, v.end);
      if (is_args) r.args_end = v.end;
      i = v.end;
    }
    i = skip_space(t, i);
    if (i >= t.size()) return stop(Scan::kIncomplete, i);
    if (t[i] == '}') return stop(Scan::kComplete, i + 1);
    if (t[i] != ',') return stop(Scan::kInvalid, i);
    ++i;
  }
}

bool known(std::span<const std::string> names, const std::optional<std::string>& name) {
  return name && std::find(names.begin(), names.end(), *name) != names.end();
}

// A call whose name is complete and known, from the scan (arguments so far, or "{}").
ParsedToolCall make_call(std::string_view t, const CallScan& s) {
  ParsedToolCall c;
  c.name = *s.name;
  c.complete = s.state != Scan::kIncomplete;
  if (s.args_begin == kNone) {
    c.arguments = c.complete ? "{}" : "";
  } else {
    // Arguments cut short by bad JSON end where it went wrong.
    const size_t end = s.args_end != kNone ? s.args_end
                       : s.state == Scan::kInvalid ? s.end : t.size();
    c.arguments = std::string(t.substr(s.args_begin, end - s.args_begin));
  }
  return c;
}

// Outside text: before the first call it is content as written; after a call, whitespace-only
// stretches are dropped (the separators between calls).
void add_text(ParsedToolOutput& out, std::string_view text) {
  if (out.calls.empty() || !all_space(text)) out.content.append(text);
}

// One call inside <tool_call> ... </tool_call>, as a format's scanner reads it.
struct TaggedCall {
  Scan state = Scan::kInvalid;
  size_t end = 0;                   // as ScanResult
  std::optional<std::string> name;  // once complete
  ParsedToolCall call;              // when the name is set
};

// The formats that wrap each call in <tool_call> ... </tool_call> (hermes, qwen3_coder):
// `scan(t, i)` reads the call starting at t[i], just past the opening tag.
template <typename ScanFn>
ParsedToolOutput parse_tagged(std::string_view t, bool final, std::span<const std::string> names,
                              ScanFn scan) {
  ParsedToolOutput out;
  size_t pos = 0;     // start of the outside text not yet added
  size_t search = 0;  // where to look for the next <tool_call>
  for (;;) {
    const size_t open = t.find(kHermesOpen, search);
    if (open == kNone) {
      std::string_view rest = t.substr(pos);
      if (!final) rest.remove_suffix(partial_suffix(rest, kHermesOpen));
      add_text(out, rest);
      return out;
    }
    const TaggedCall s = scan(t, open + kHermesOpen.size());
    if (!known(names, s.name)) {
      if (s.state == Scan::kIncomplete && !s.name && !final) {
        add_text(out, t.substr(pos, open - pos));  // hold back the call that may be forming
        return out;
      }
      search = open + 1;  // this <tool_call> is text
      continue;
    }
    add_text(out, t.substr(pos, open - pos));
    out.calls.push_back(s.call);
    if (s.state == Scan::kIncomplete) return out;
    if (s.state == Scan::kInvalid) {
      pos = search = s.end;
      continue;
    }
    const size_t after = skip_space(t, s.end);
    const std::string_view tail = t.substr(after);
    if (tail.starts_with(kHermesClose)) {
      pos = search = after + kHermesClose.size();
    } else if (!final && kHermesClose.starts_with(tail)) {
      return out;  // the closing tag may be on its way
    } else {
      pos = search = s.end;  // no closing tag: what follows is outside text
    }
  }
}

ParsedToolOutput parse_hermes(std::string_view t, bool final, std::span<const std::string> names) {
  return parse_tagged(t, final, names, [](std::string_view text, size_t i) {
    const CallScan s = scan_call(text, i);
    return TaggedCall{s.state, s.end, s.name, s.name ? make_call(text, s) : ParsedToolCall{}};
  });
}

// `v` as a JSON string.
std::string json_string(std::string_view v) {
  std::string out = "\"";
  for (const char c : v) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

// One XML parameter value as JSON text, by the parameter's schema type (tool_calls.h): as
// written (spaces around it dropped) when it is a JSON value of that type (any number, boolean,
// null, object or array for an untyped one), else a JSON string of it.
std::string xml_value_json(std::string_view v, std::string_view type) {
  const size_t b = skip_space(v, 0);
  size_t e = v.size();
  while (e > b && is_space(v[e - 1])) --e;
  const std::string_view body = v.substr(b, e - b);
  if (type == "string") return json_string(v);
  if (!type.empty() && !body.empty()) {
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    const bool fits = (type == "integer" && j.is_number_integer()) ||
                      (type == "number" && j.is_number()) ||
                      (type == "boolean" && j.is_boolean()) || (type == "null" && j.is_null()) ||
                      (type == "object" && j.is_object()) || (type == "array" && j.is_array());
    return fits ? std::string(body) : json_string(v);
  }
  if (!body.empty()) {
    const std::string padded = std::string(body) + " ";  // a trailing space ends a number
    const ScanResult s = scan_value(padded, 0);
    const bool literal = body == "true" || body == "false" || body == "null";
    const bool number = (body[0] == '-' || std::isdigit(static_cast<unsigned char>(body[0]))) &&
                        std::all_of(body.begin(), body.end(), [](char c) {
                          return std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
                                 c == '+' || c == '.' || c == 'e' || c == 'E';
                        });
    const bool composite = body[0] == '{' || body[0] == '[';
    if (s.state == Scan::kComplete && s.end == body.size() && (literal || number || composite)) {
      return std::string(body);
    }
  }
  return json_string(v);
}

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

// One XML call after its <tool_call>: the function's name, then its parameters. The arguments
// grow a parameter at a time ("{", then each complete "\"P\": VALUE"), so every partial parse's
// arguments are a prefix of the final ones; "}" once </function> is read.
struct XmlCall {
  Scan state = Scan::kInvalid;
  size_t end = 0;  // kComplete: past </function>; kInvalid: where it went wrong
  std::optional<std::string> name;
  std::string arguments;
};

XmlCall scan_xml_call(std::string_view t, size_t i, const ToolParamTypes* types) {
  XmlCall r;
  const auto stop = [&](Scan s, size_t at) {
    r.state = s;
    r.end = at;
    return r;
  };
  i = skip_space(t, i);
  const std::string_view head = t.substr(i);
  if (!head.starts_with(kFunctionOpen)) {
    return stop(kFunctionOpen.starts_with(head) ? Scan::kIncomplete : Scan::kInvalid, i);
  }
  i += kFunctionOpen.size();
  const size_t close = t.find('>', i);
  if (close == kNone) return stop(Scan::kIncomplete, t.size());
  r.name = std::string(t.substr(i, close - i));
  r.arguments = "{";
  i = close + 1;
  for (bool first = true;; first = false) {
    i = skip_space(t, i);
    const std::string_view rest = t.substr(i);
    if (rest.starts_with(kFunctionClose)) {
      r.arguments += "}";
      return stop(Scan::kComplete, i + kFunctionClose.size());
    }
    if (!rest.starts_with(kParameterOpen)) {
      const bool may_be = kFunctionClose.starts_with(rest) || kParameterOpen.starts_with(rest);
      if (may_be) return stop(Scan::kIncomplete, t.size());
      r.arguments += "}";
      return stop(Scan::kInvalid, i);
    }
    const size_t name_end = t.find('>', i + kParameterOpen.size());
    if (name_end == kNone) return stop(Scan::kIncomplete, t.size());
    const size_t value_begin = name_end + 1;
    const size_t value_end = t.find(kParameterClose, value_begin);
    if (value_end == kNone) return stop(Scan::kIncomplete, t.size());
    std::string_view value = t.substr(value_begin, value_end - value_begin);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const std::string_view key = t.substr(i + kParameterOpen.size(),
                                          name_end - i - kParameterOpen.size());
    if (!first) r.arguments += ", ";
    r.arguments += json_string(key);
    r.arguments += ": ";
    std::string_view type;
    if (types != nullptr) {
      if (auto tool = types->find(*r.name); tool != types->end()) {
        if (auto p = tool->second.find(std::string(key)); p != tool->second.end()) type = p->second;
      }
    }
    r.arguments += xml_value_json(value, type);
    i = value_end + kParameterClose.size();
  }
}

ParsedToolOutput parse_qwen3_coder(std::string_view t, bool final,
                                   std::span<const std::string> names,
                                   const ToolParamTypes* types) {
  return parse_tagged(t, final, names, [types](std::string_view text, size_t i) {
    XmlCall x = scan_xml_call(text, i, types);
    ParsedToolCall call;
    if (x.name) call = {*x.name, std::move(x.arguments), x.state != Scan::kIncomplete};
    return TaggedCall{x.state, x.end, std::move(x.name), std::move(call)};
  });
}

ParsedToolOutput parse_llama3(std::string_view t, bool final, std::span<const std::string> names) {
  ParsedToolOutput out;
  size_t p = skip_space(t, 0);
  if (t.substr(p).starts_with(kPythonTag)) p = skip_space(t, p + kPythonTag.size());
  const std::string_view head = t.substr(p);
  if (!final && (head.empty() || kPythonTag.starts_with(head))) return out;
  if (head.empty() || head[0] != '{') {
    out.content = std::string(t);
    return out;
  }
  for (;;) {
    const CallScan s = scan_call(t, p);
    if (!known(names, s.name)) {
      if (s.state == Scan::kIncomplete && !s.name && !final) return out;  // undecided: hold
      // Not a call: everything from here is content (all of it when nothing was a call).
      add_text(out, out.calls.empty() ? t : t.substr(p));
      return out;
    }
    out.calls.push_back(make_call(t, s));
    if (s.state == Scan::kIncomplete) return out;
    const size_t k = skip_space(t, s.end);
    if (s.state == Scan::kComplete && k < t.size() && t[k] == ';') {
      const size_t next = skip_space(t, k + 1);
      if (next >= t.size()) {
        if (!final) return out;
      } else if (t[next] == '{') {
        p = next;
        continue;
      }
    }
    std::string_view rest = t.substr(s.end);
    if (!final && all_space(rest)) return out;
    add_text(out, rest);
    return out;
  }
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kHarmony: return "harmony";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
  }
  return "";
}

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "harmony") return ToolCallFormat::kHarmony;
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  return std::nullopt;
}

TemplateToolSupport detect_tool_support(std::string_view source) {
  TemplateToolSupport s;
  static const std::regex kToolsVariable(R"(\btools\b)");
  s.renders_tools = std::regex_search(source.begin(), source.end(), kToolsVariable);
  if (!s.renders_tools) {
    s.reason = "the chat template does not render tools: arbor describes them in a system "
               "message and reads <tool_call> blocks";
    return s;
  }
  if (source.find("<|channel|>") != kNone && source.find("to=") != kNone) {
    s.format = ToolCallFormat::kHarmony;
    s.reason = "the chat template writes harmony messages (gpt-oss): calls are commentary "
               "messages to=functions.NAME";
  } else if (source.find(kFunctionOpen) != kNone && source.find(kParameterOpen) != kNone) {
    s.format = ToolCallFormat::kQwen3Coder;
    s.reason = "the chat template writes <tool_call><function=NAME><parameter=P> (Qwen3-Coder, "
               "Qwen3.5 XML calls)";
  } else if (source.find(kHermesOpen) != kNone) {
    s.reason = "the chat template writes <tool_call>";
  } else if (source.find(kPythonTag) != kNone || source.find("<|start_header_id|>") != kNone) {
    s.format = ToolCallFormat::kLlama3Json;
    s.reason = "the chat template is a Llama 3 template that renders tools";
  } else {
    s.reason = "the chat template renders tools in a format arbor does not recognise; reading "
               "<tool_call> blocks (choose another with --tool-call-parser)";
  }
  return s;
}

ToolParamTypes tool_param_types(const nlohmann::ordered_json& tools) {
  ToolParamTypes out;
  if (!tools.is_array()) return out;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    auto& params = out[f["name"].get<std::string>()];
    if (!f.contains("parameters") || !f["parameters"].is_object()) continue;
    const auto& p = f["parameters"];
    if (!p.contains("properties") || !p["properties"].is_object()) continue;
    for (const auto& [key, schema] : p["properties"].items()) {
      std::string type;
      if (schema.is_object() && schema.contains("type")) {
        const auto& ty = schema["type"];
        if (ty.is_string()) type = ty.get<std::string>();
        for (const auto& x : ty.is_array() ? ty : nlohmann::ordered_json::array()) {
          if (x.is_string() && x != "null") {
            type = x.get<std::string>();
            break;
          }
        }
      } else if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() &&
                 std::all_of(schema["enum"].begin(), schema["enum"].end(),
                             [](const auto& e) { return e.is_string(); })) {
        type = "string";
      }
      params[key] = type;
    }
  }
  return out;
}

ParsedToolOutput parse_tool_calls(ToolCallFormat format, std::string_view text, bool final,
                                  std::span<const std::string> tool_names,
                                  const ToolParamTypes* types) {
  switch (format) {
    case ToolCallFormat::kHermes: return parse_hermes(text, final, tool_names);
    case ToolCallFormat::kLlama3Json: return parse_llama3(text, final, tool_names);
    case ToolCallFormat::kQwen3Coder: return parse_qwen3_coder(text, final, tool_names, types);
    case ToolCallFormat::kHarmony: {
      // Every channel but the calls is content here; the server reads harmony whole
      // (parse_harmony), the analysis channel as reasoning.
      HarmonyOutput h = parse_harmony(text, final, tool_names, /*reasoning=*/false);
      return {.content = std::move(h.content), .calls = std::move(h.calls)};
    }
  }
  return {};
}

ToolCallStreamer::Step ToolCallStreamer::update(std::string_view text, bool final) {
  const ParsedToolOutput p = parse_tool_calls(format_, text, final, tool_names_, &types_);
  Step step;
  if (p.content.size() > sent_content_) {
    step.content = p.content.substr(sent_content_);
    sent_content_ = p.content.size();
  }
  append_call_deltas(p.calls, sent_args_, step.calls);
  return step;
}

}  // namespace arbor::chat
