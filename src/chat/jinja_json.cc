// tojson: Python's json.dumps as transformers' tojson filter calls it.
#include <algorithm>
#include <cstdio>

#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i. Invalid bytes decode
// as themselves (U+0080..U+00FF) so that nothing is lost.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
  if (c < 0xC0 || i + static_cast<size_t>(extra) >= s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += static_cast<size_t>(extra) + 1;
  return cp;
}

void append_u_escape(std::string& out, uint32_t unit) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", unit);
  out += buf;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default: break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || (ensure_ascii && u == 0x7f)) {
      append_u_escape(out, u);
      ++i;
    } else if (u < 0x80 || !ensure_ascii) {
      out += c;
      ++i;
    } else {
      const uint32_t cp = next_code_point(s, i);
      if (cp >= 0x10000) {
        append_u_escape(out, 0xD800 + ((cp - 0x10000) >> 10));
        append_u_escape(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        append_u_escape(out, cp);
      }
    }
  }
  out += '"';
}

[[noreturn]] void not_serializable(const Value& v, SourcePos pos) {
  fail(pos,
       "TypeError: Object of type " + std::string(v.type_name()) + " is not JSON serializable");
}

std::string float_text(double d) {
  const std::string f = format_float(d);
  return f == "inf" ? "Infinity" : f == "-inf" ? "-Infinity" : f == "nan" ? "NaN" : f;
}

// A dict key as json.dumps writes it: strings as they are, numbers, bools and None converted.
std::string key_text(const Value& k, SourcePos pos) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.as_string();
    case Value::Kind::kBool: return k.as_bool() ? "true" : "false";
    case Value::Kind::kInt: return std::to_string(k.as_int());
    case Value::Kind::kFloat: return float_text(k.as_float());
    case Value::Kind::kNone: return "null";
    default:
      fail(pos, "TypeError: keys must be str, int, float, bool or None, not " +
                    std::string(k.type_name()));
  }
}

class JsonWriter {
 public:
  JsonWriter(const JsonFormat& f, SourcePos pos) : f_(f), pos_(pos) {}

  void value(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone: out_ += "null"; return;
      case Value::Kind::kBool: out_ += v.as_bool() ? "true" : "false"; return;
      case Value::Kind::kInt: out_ += std::to_string(v.as_int()); return;
      case Value::Kind::kFloat: out_ += float_text(v.as_float()); return;
      case Value::Kind::kString: json_string(out_, v.as_string(), f_.ensure_ascii); return;
      case Value::Kind::kList:
        if (v.is_iterator()) not_serializable(v, pos_);
        list(v.items(), level);
        return;
      case Value::Kind::kDict:
        if (v.is_namespace()) not_serializable(v, pos_);
        dict(v.entries(), level);
        return;
      case Value::Kind::kUndefined:
      case Value::Kind::kMacro:
      case Value::Kind::kCallable: not_serializable(v, pos_);
    }
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int level) {
    if (!f_.indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *f_.indent;
  }

  void list(const ValueList& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out_ += f_.item_sep;
      newline(level + 1);
      value(items[i], level + 1);
    }
    newline(level);
    out_ += ']';
  }

  void dict(const ValueDict& entries, int level) {
    if (entries.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> order;
    for (const auto& e : entries) order.push_back(&e);
    if (f_.sort_keys) {
      std::stable_sort(order.begin(), order.end(), [&](const auto* a, const auto* b) {
        return compare_values(a->first, b->first, pos_) < 0;
      });
    }
    out_ += '{';
    for (size_t i = 0; i < order.size(); ++i) {
      if (i) out_ += f_.item_sep;
      newline(level + 1);
      json_string(out_, key_text(order[i]->first, pos_), f_.ensure_ascii);
      out_ += f_.key_sep;
      value(order[i]->second, level + 1);
    }
    newline(level);
    out_ += '}';
  }

  const JsonFormat& f_;
  SourcePos pos_;
  std::string out_;
};

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format, SourcePos pos) {
  JsonWriter w(format, pos);
  w.value(v, 0);
  return w.take();
}

}  // namespace arbor::chat::jinja
