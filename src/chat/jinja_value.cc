#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "base/check.h"

namespace arbor::chat::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.flag_ = Flag::kTuple;
  return v;
}

Value Value::iterator(ValueList items) {
  Value v = list(std::move(items));
  v.flag_ = Flag::kIterator;
  v.cursor_ = std::make_shared<size_t>(0);
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.flag_ = Flag::kMarkup;
  return v;
}

Value Value::dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::namespace_dict(ValueDict items) {
  Value v = dict(std::move(items));
  v.flag_ = Flag::kNamespace;
  return v;
}

Value Value::macro(const MacroNode* node, std::shared_ptr<const MacroClosure> closure) {
  Value v;
  v.kind_ = Kind::kMacro;
  v.macro_ = node;
  v.closure_ = std::move(closure);
  return v;
}

Value Value::callable(std::string name, const Value* self) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.str_ = std::move(name);
  v.self_ = std::make_shared<const Value>(self ? *self : Value());
  return v;
}

namespace {

template <typename Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(j.template get<bool>());
    case Json::value_t::number_integer: return Value(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return Value(j.template get<double>());
    case Json::value_t::string: return Value(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      ValueDict entries;
      entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        entries.emplace_back(Value(it.key()), value_from_json(*it));
      return Value::dict(std::move(entries));
    }
    case Json::value_t::binary:
    case Json::value_t::discarded: return Value();
  }
  return Value();
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

ValueList Value::consume(size_t limit) const {
  ARBOR_CHECK(is_iterator());
  const size_t begin = std::min(*cursor_, list_->size());
  const size_t end = begin + std::min(limit, list_->size() - begin);
  *cursor_ = end;
  return ValueList(list_->begin() + static_cast<std::ptrdiff_t>(begin),
                   list_->begin() + static_cast<std::ptrdiff_t>(end));
}

const Value* Value::find(std::string_view key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k.is_string() && k.str_ == key) return &v;
  }
  return nullptr;
}

const Value* Value::find_key(const Value& key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k.equals(key)) return &v;
  }
  return nullptr;
}

void Value::set(std::string_view key, Value v) const { set_key(Value(key), std::move(v)); }

void Value::set_key(const Value& key, Value v) const {
  for (auto& [k, old] : *dict_) {
    if (k.equals(key)) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !str_.empty();
    case Kind::kList: return is_iterator() || !list_->empty();
    case Kind::kDict: return is_namespace() || !dict_->empty();
    case Kind::kMacro:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: scientific when the exponent is below -4
  // or at least 16, positional otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return out + ebuf;
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_digits = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_digits) {
    return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

std::string repr_string(const std::string& s) {
  // Python picks double quotes only when the string has a ' and no ".
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", u);
          out += buf;
          continue;
        }
        if (c == q) out += '\\';
        out += c;
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return str_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return format_float(float_);
    case Kind::kString:
      return is_markup() ? "Markup(" + repr_string(str_) + ")" : repr_string(str_);
    case Kind::kList: {
      if (is_iterator()) return "<generator object>";
      std::string out = is_tuple() ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (is_tuple() && list_->size() == 1) out += ",";
      return out + (is_tuple() ? ")" : "]");
    }
    case Kind::kDict: {
      if (is_namespace()) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        out += (i ? ", " : "") + (*dict_)[i].first.repr() + ": " + (*dict_)[i].second.repr();
      }
      return out + "}";
    }
    case Kind::kMacro: return "<Macro>";
    case Kind::kCallable: return "<built-in method " + str_ + ">";
  }
  return "";
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() == other.as_float();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return str_ == other.str_;
    case Kind::kList: {
      if (is_iterator() || other.is_iterator()) return list_ == other.list_;
      if (is_tuple() != other.is_tuple() || list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (is_namespace() || other.is_namespace()) return dict_ == other.dict_;
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* o = other.find_key(k);
        if (o == nullptr || !v.equals(*o)) return false;
      }
      return true;
    }
    case Kind::kMacro: return macro_ == other.macro_;
    case Kind::kCallable: return str_ == other.str_ && self_ == other.self_;
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat: return false;  // handled by the number branch
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_iterator() ? "generator" : is_tuple() ? "tuple" : "list";
    case Kind::kDict: return is_namespace() ? "Namespace" : "dict";
    case Kind::kMacro: return "Macro";
    case Kind::kCallable: return "builtin_function_or_method";
  }
  return "?";
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
}

}  // namespace arbor::chat::jinja
