// Filters, tests and global functions of the Jinja interpreter.
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>

namespace arbor::chat::jinja {
namespace {

// Jinja's sandbox caps range() at this many items.
constexpr int64_t kMaxRange = 100000;

std::string soft_str(const Value& v) { return v.str(); }

Value first_or_last(const Value& v, bool first, SourcePos pos) {
  const ValueList items = iterate(v, pos);
  if (items.empty()) return Value();
  return first ? items.front() : items.back();
}

Value filter_join(const Value& v, const CallArgs& a) {
  const Value sep = a.get(0, "d", Value(""));
  const Value attr = a.get(1, "attribute");
  std::string out;
  const ValueList items = iterate(v, a.pos);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += soft_str(sep);
    if (attr.is_string()) {
      const Value* x = items[i].find(attr.as_string());
      out += x ? soft_str(*x) : "";
    } else {
      out += soft_str(items[i]);
    }
  }
  return Value(std::move(out));
}

Value to_int(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0));
  if (v.is_bool() || v.is_int()) return Value(v.as_int());
  if (v.is_float())
    return std::isfinite(v.as_float()) ? Value(static_cast<int64_t>(v.as_float())) : dflt;
  if (!v.is_string()) return dflt;
  const std::string s = v.as_string();
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && end != s.c_str() && *end == '\0') return Value(static_cast<int64_t>(i));
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(d));
  return dflt;
}

Value to_float(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_float());
  if (!v.is_string()) return dflt;
  char* end = nullptr;
  const double d = std::strtod(v.as_string().c_str(), &end);
  return end != v.as_string().c_str() && *end == '\0' ? Value(d) : dflt;
}

Value attribute_of(const Value& item, const Value& attr) {
  if (!attr.is_string()) return Value();
  const Value* x = item.find(attr.as_string());
  return x ? *x : Value();
}

Value filter_map(const Value& v, const CallArgs& a) {
  ValueList out;
  const ValueList items = iterate(v, a.pos);
  if (const Value* attr = a.kwarg("attribute")) {
    const Value dflt = a.get(99, "default");
    for (const Value& item : items) {
      Value x = attribute_of(item, *attr);
      out.push_back(x.is_undefined() ? dflt : x);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty() || !a.args[0].is_string())
    fail(a.pos, "map: expects a filter name or attribute=");
  CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs, a.pos};
  for (const Value& item : items) {
    std::optional<Value> x = call_filter(a.args[0].as_string(), item, rest);
    if (!x) fail(a.pos, "map: no filter named '" + a.args[0].as_string() + "'");
    out.push_back(std::move(*x));
  }
  return Value::list(std::move(out));
}

// select/reject (by_attr = false) and selectattr/rejectattr (by_attr = true).
Value filter_select(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  const size_t test_index = by_attr ? 1 : 0;
  std::string test = "truthy";
  if (a.args.size() > test_index) {
    if (!a.args[test_index].is_string()) fail(a.pos, "select: test name must be a string");
    test = a.args[test_index].as_string();
  }
  const size_t first_arg = test_index + 1;
  CallArgs test_args{
      std::vector<Value>(a.args.begin() + std::min(first_arg, a.args.size()), a.args.end()),
      {},
      a.pos};
  ValueList out;
  for (const Value& item : iterate(v, a.pos)) {
    const Value subject = by_attr ? attribute_of(item, a.get(0, "attribute")) : item;
    bool pass = subject.truthy();
    if (test != "truthy") {
      std::optional<bool> r = call_test(test, subject, test_args);
      if (!r) fail(a.pos, "no test named '" + test + "'");
      pass = *r;
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_items(const Value& v, SourcePos pos) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict()) fail(pos, "items: expected a mapping, got " + std::string(v.type_name()));
  ValueList out;
  for (const auto& [k, x] : v.entries()) out.push_back(Value::tuple({Value(k), x}));
  return Value::list(std::move(out));
}

Value filter_tojson(const Value& v, const CallArgs& a) {
  const Value indent = a.get(0, "indent");
  if (!indent.is_undefined() && !indent.is_none() && !indent.is_int())
    fail(a.pos, "tojson: indent must be an int");
  return Value(to_json(
      v, indent.is_int() ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64)) : -1,
      a.pos));
}

Value filter_reverse(const Value& v, SourcePos pos) {
  ValueList items = iterate(v, pos);
  std::reverse(items.begin(), items.end());
  if (!v.is_string()) return Value::list(std::move(items));
  std::string out;
  for (const Value& c : items) out += c.as_string();
  return Value(std::move(out));
}

int compare_numbers_or_strings(const Value& a, const Value& b, SourcePos pos) {
  if (a.is_number() && b.is_number())
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string());
  fail(pos, "cannot compare " + std::string(a.type_name()) + " with " + std::string(b.type_name()));
}

}  // namespace

std::optional<Value> call_filter(std::string_view name, const Value& v, const CallArgs& a) {
  if (name == "trim") return Value(string_strip(soft_str(v), a.get(0, "chars"), true, true));
  if (name == "upper") return Value(string_upper(soft_str(v)));
  if (name == "lower") return Value(string_lower(soft_str(v)));
  if (name == "capitalize") return Value(string_capitalize(soft_str(v)));
  if (name == "title") return Value(string_title(soft_str(v)));
  if (name == "length" || name == "count") return Value(length_of(v, a.pos));
  if (name == "first" || name == "last") return first_or_last(v, name == "first", a.pos);
  if (name == "join") return filter_join(v, a);
  if (name == "default" || name == "d") {
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    return (v.is_undefined() || (boolean && !v.truthy())) ? a.get(0, "default_value", Value(""))
                                                          : v;
  }
  if (name == "tojson") return filter_tojson(v, a);
  if (name == "string") return Value(soft_str(v));
  if (name == "int") return to_int(v, a);
  if (name == "float") return to_float(v, a);
  if (name == "replace")
    return Value(
        string_replace(soft_str(v), a.get(0, "old"), a.get(1, "new"), a.get(2, "count"), a.pos));
  if (name == "items") return filter_items(v, a.pos);
  if (name == "list") return Value::list(iterate(v, a.pos));
  if (name == "map") return filter_map(v, a);
  if (name == "select" || name == "reject") return filter_select(v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return filter_select(v, a, true, name == "selectattr");
  if (name == "reverse") return filter_reverse(v, a.pos);
  if (name == "safe") return v;
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_number()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    fail(a.pos, "abs: expected a number, got " + std::string(v.type_name()));
  }
  return std::nullopt;
}

std::optional<bool> call_test(std::string_view name, const Value& v, const CallArgs& a) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_macro();
  if (name == "lower") return v.is_string() && string_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && string_upper(v.as_string()) == v.as_string();
  const Value other = a.get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return v.equals(other);
  if (name == "ne" || name == "!=") return !v.equals(other);
  if (name == "lt" || name == "lessthan" || name == "<")
    return compare_numbers_or_strings(v, other, a.pos) < 0;
  if (name == "le" || name == "<=") return compare_numbers_or_strings(v, other, a.pos) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return compare_numbers_or_strings(v, other, a.pos) > 0;
  if (name == "ge" || name == ">=") return compare_numbers_or_strings(v, other, a.pos) >= 0;
  if (name == "in") {
    const ValueList items = iterate(other, a.pos);
    return std::any_of(items.begin(), items.end(), [&](const Value& x) { return x.equals(v); });
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool())
      fail(a.pos, "test '" + std::string(name) + "' expects an integer");
    const int64_t d = name == "divisibleby" ? other.as_int() : 2;
    if (d == 0) fail(a.pos, "divisibleby 0");
    const int64_t r = v.as_int() % d;
    return name == "odd" ? r != 0 : r == 0;
  }
  return std::nullopt;
}

std::optional<Value> call_global(std::string_view name, const CallArgs& a) {
  if (name == "raise_exception") {
    throw TemplateError(TemplateError::Kind::kRaised, a.pos, soft_str(a.get(0, "message")));
  }
  if (name == "range") {
    for (const Value& x : a.args) {
      if (!x.is_int() && !x.is_bool()) fail(a.pos, "range: arguments must be integers");
    }
    if (a.args.empty() || a.args.size() > 3) fail(a.pos, "range expects 1 to 3 arguments");
    const int64_t start = a.args.size() == 1 ? 0 : a.args[0].as_int();
    const int64_t stop = a.args.size() == 1 ? a.args[0].as_int() : a.args[1].as_int();
    const int64_t step = a.args.size() == 3 ? a.args[2].as_int() : 1;
    if (step == 0) fail(a.pos, "range: step must not be zero");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.size()) >= kMaxRange) {
        throw TemplateError(TemplateError::Kind::kLimit, a.pos,
                            "range() is capped at " + std::to_string(kMaxRange) + " items");
      }
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  }
  if (name == "namespace" || name == "dict") {
    ValueDict entries;
    for (const Value& x : a.args) {
      if (!x.is_dict()) fail(a.pos, std::string(name) + "() positional argument must be a mapping");
      for (const auto& kv : x.entries()) entries.push_back(kv);
    }
    for (const auto& kv : a.kwargs) entries.push_back(kv);
    return name == "namespace" ? Value::namespace_dict(std::move(entries))
                               : Value::dict(std::move(entries));
  }
  if (name == "strftime_now") {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), soft_str(a.get(0, "format")).c_str(), &tm);
    return Value(std::string(buf, n));
  }
  return std::nullopt;
}

}  // namespace arbor::chat::jinja
