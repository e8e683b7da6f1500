// Methods of str and dict, tojson, slicing and iteration helpers for the Jinja interpreter.
#include <algorithm>
#include <cstdio>

#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

constexpr std::string_view kPyWhitespace = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f";

[[noreturn]] void bad_arg(SourcePos pos, std::string message) { fail(pos, std::move(message)); }

}  // namespace

std::string string_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.as_string() : std::string(kPyWhitespace);
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && set.find(s[b]) != std::string::npos) ++b;
  }
  if (right) {
    while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  }
  return s.substr(b, e - b);
}

namespace {

bool affix_matches(const std::string& s, const Value& affix, bool prefix, SourcePos pos) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      bad_arg(pos, "startswith/endswith expects a string, got " + std::string(a.type_name()));
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    return std::any_of(affix.items().begin(), affix.items().end(), one);
  }
  return one(affix);
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit, SourcePos pos) {
  ValueList parts;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && kPyWhitespace.find(s[i]) != std::string_view::npos) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(string_strip(s.substr(i), Value(), false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && kPyWhitespace.find(s[j]) == std::string_view::npos) ++j;
      parts.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return Value::list(std::move(parts));
  }
  if (!sep.is_string() || sep.as_string().empty())
    bad_arg(pos, "split: separator must be a non-empty string");
  const std::string& d = sep.as_string();
  size_t start = 0;
  while (true) {
    const size_t hit = s.find(d, start);
    if (hit == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit))
      break;
    parts.emplace_back(s.substr(start, hit - start));
    start = hit + d.size();
  }
  parts.emplace_back(s.substr(start));
  return Value::list(std::move(parts));
}

char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::optional<Value> string_method(const std::string& s, std::string_view name, const CallArgs& a) {
  if (name == "strip") return Value(string_strip(s, a.get(0, "chars"), true, true));
  if (name == "lstrip") return Value(string_strip(s, a.get(0, "chars"), true, false));
  if (name == "rstrip") return Value(string_strip(s, a.get(0, "chars"), false, true));
  if (name == "startswith") return Value(affix_matches(s, a.get(0, "prefix"), true, a.pos));
  if (name == "endswith") return Value(affix_matches(s, a.get(0, "suffix"), false, a.pos));
  if (name == "split")
    return split(s, a.get(0, "sep"), a.get(1, "maxsplit", Value(-1)).as_int(), a.pos);
  if (name == "upper") return Value(string_upper(s));
  if (name == "lower") return Value(string_lower(s));
  if (name == "title") return Value(string_title(s));
  if (name == "capitalize") return Value(string_capitalize(s));
  if (name == "replace") {
    return Value(
        string_replace(s, a.get(0, "old"), a.get(1, "new"), a.get(2, "count", Value(-1)), a.pos));
  }
  if (name == "join") {
    std::string out;
    const ValueList items = iterate(a.get(0, "iterable"), a.pos);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        bad_arg(a.pos, "join: sequence item " + std::to_string(i) + " is not a string");
      if (i) out += s;
      out += items[i].as_string();
    }
    return Value(std::move(out));
  }
  if (name == "find") {
    const Value sub = a.get(0, "sub");
    if (!sub.is_string()) bad_arg(a.pos, "find expects a string");
    const size_t hit = s.find(sub.as_string());
    return hit == std::string::npos ? Value(-1)
                                    : Value(static_cast<int64_t>(utf8_length(s.substr(0, hit))));
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& d, std::string_view name, const CallArgs& a) {
  if (name == "get") {
    const Value key = a.get(0, "key");
    const Value* v = key.is_string() ? d.find(key.as_string()) : nullptr;
    return v ? *v : a.get(1, "default", Value::none());
  }
  if (name == "items" || name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : d.entries()) {
      if (name == "items") out.push_back(Value::tuple({Value(k), v}));
      if (name == "keys") out.emplace_back(k);
      if (name == "values") out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  return std::nullopt;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int level, SourcePos pos) {
  const bool pretty = indent >= 0;
  auto newline = [&](int lvl) {
    if (pretty) out += '\n' + std::string(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const std::string f = format_float(v.as_float());
      out += f == "inf" ? "Infinity" : f == "-inf" ? "-Infinity" : f == "nan" ? "NaN" : f;
      return;
    }
    case Value::Kind::kString: json_string(out, v.as_string()); return;
    case Value::Kind::kList: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += pretty ? "," : ", ";
        newline(level + 1);
        json_value(out, v.items()[i], indent, level + 1, pos);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.entries().empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < v.entries().size(); ++i) {
        if (i) out += pretty ? "," : ", ";
        newline(level + 1);
        json_string(out, v.entries()[i].first);
        out += ": ";
        json_value(out, v.entries()[i].second, indent, level + 1, pos);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kMacro:
      fail(pos,
           "tojson: object of type " + std::string(v.type_name()) + " is not JSON serializable");
  }
}

}  // namespace

std::string string_upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ascii_upper);
  return s;
}

std::string string_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ascii_lower);
  return s;
}

std::string string_title(std::string s) {
  bool prev_alpha = false;
  for (char& c : s) {
    c = prev_alpha ? ascii_lower(c) : ascii_upper(c);
    prev_alpha = ascii_alpha(c);
  }
  return s;
}

std::string string_capitalize(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) s[i] = i == 0 ? ascii_upper(s[i]) : ascii_lower(s[i]);
  return s;
}

std::string string_replace(const std::string& s, const Value& old_v, const Value& new_v,
                           const Value& count, SourcePos pos) {
  if (!old_v.is_string() || !new_v.is_string()) bad_arg(pos, "replace expects string arguments");
  const std::string& from = old_v.as_string();
  const std::string& to = new_v.as_string();
  int64_t left = count.is_int() ? count.as_int() : -1;
  std::string out;
  size_t i = 0;
  if (from.empty()) {
    // Python inserts `to` between every code point (and at both ends).
    const std::vector<size_t> offs = utf8_offsets(s);
    for (size_t k = 0; k + 1 < offs.size(); ++k) {
      if (left-- != 0) out += to;
      out += s.substr(offs[k], offs[k + 1] - offs[k]);
    }
    if (left != 0) out += to;
    return out;
  }
  while (left != 0) {
    const size_t hit = s.find(from, i);
    if (hit == std::string::npos) break;
    out += s.substr(i, hit - i) + to;
    i = hit + from.size();
    --left;
  }
  return out + s.substr(i);
}

Value CallArgs::get(size_t index, std::string_view name, Value fallback) const {
  if (index < args.size()) return args[index];
  if (const Value* v = kwarg(name)) return *v;
  return fallback;
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::optional<Value> call_method(const Value& obj, std::string_view name, const CallArgs& args) {
  if (obj.is_string()) return string_method(obj.as_string(), name, args);
  if (obj.is_dict() && !obj.is_namespace()) return dict_method(obj, name, args);
  return std::nullopt;
}

std::string to_json(const Value& v, int indent, SourcePos pos) {
  std::string out;
  json_value(out, v, indent, 0, pos);
  return out;
}

std::vector<size_t> slice_indices(size_t length, const Value& start, const Value& stop,
                                  const Value& step, SourcePos pos) {
  auto bound = [&](const Value& v) {
    if (!v.is_undefined() && !v.is_none() && !v.is_int())
      fail(pos, "slice indices must be integers or none");
    return v.is_int();
  };
  const int64_t n = static_cast<int64_t>(length);
  const int64_t st = bound(step) ? step.as_int() : 1;
  if (st == 0) fail(pos, "slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!bound(v)) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

ValueList iterate(const Value& v, SourcePos pos) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [k, x] : v.entries()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& s = v.as_string();
      const std::vector<size_t> offs = utf8_offsets(s);
      ValueList chars;
      for (size_t k = 0; k + 1 < offs.size(); ++k)
        chars.emplace_back(s.substr(offs[k], offs[k + 1] - offs[k]));
      return chars;
    }
    default: fail(pos, "'" + std::string(v.type_name()) + "' object is not iterable");
  }
}

int64_t length_of(const Value& v, SourcePos pos) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.entries().size());
    default: fail(pos, "object of type '" + std::string(v.type_name()) + "' has no len()");
  }
}

}  // namespace arbor::chat::jinja
