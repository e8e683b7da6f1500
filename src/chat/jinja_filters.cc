// Filters and tests of the Jinja interpreter, after Jinja2 3.1's filters.py and tests.py.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

// Jinja2's soft_str: a Markup stays Markup, anything else becomes str(value).
Value soft_str(const Value& v) { return v.is_string() ? v : Value(v.str()); }

// A string result that keeps the markup flag of the string it came from (Markup methods).
Value like(const Value& source, std::string s) {
  return source.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

// Jinja2's make_attrgetter: `attribute` split at dots (digit parts are indices), each part looked
// up with environment.getitem; `dflt` replaces an undefined result when given.
Value get_attribute(const Value& item, const Value& attribute, SourcePos pos,
                    const Value& dflt = Value()) {
  Value v = item;
  if (attribute.is_integral()) {
    v = get_item(v, attribute, pos);
  } else {
    const std::string path = attribute.str();
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
      v = get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part), pos);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }
  return v.is_undefined() && !dflt.is_undefined() ? dflt : v;
}

// The sort key of min/max/sort/unique/dictsort: strings lower-cased unless case-sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(string_lower(v.as_string())) : v;
}

Value filter_default(const Value& v, const CallArgs& a) {
  const bool boolean = a.get(1, "boolean", Value(false)).truthy();
  return v.is_undefined() || (boolean && !v.truthy()) ? a.get(0, "default_value", Value("")) : v;
}

Value filter_join(const Value& v, const CallArgs& a) {
  const std::string sep = a.get(0, "d", Value("")).str();
  const Value attr = a.get(1, "attribute", Value::none());
  std::string out;
  const ValueList items = iterate(v, a.pos);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += (attr.is_none() ? items[i] : get_attribute(items[i], attr, a.pos)).str();
  }
  return Value(std::move(out));
}

// Python int(s) for a str: optional sign, digits (with single underscores), surrounding spaces.
std::optional<int64_t> parse_int(const std::string& s) {
  const std::string t = string_strip(s, Value::none(), true, true);
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_' && i > 0 && i + 1 < t.size() && std::isdigit(t[i - 1]) &&
        std::isdigit(t[i + 1]))
      continue;
    digits += t[i];
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long i = std::strtoll(digits.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || !(std::isdigit(digits.back()))) return std::nullopt;
  return static_cast<int64_t>(i);
}

// Python float(s) for a str (strtod also accepts hex floats, which Python does not).
std::optional<double> parse_float(const std::string& s) {
  const std::string t = string_strip(s, Value::none(), true, true);
  if (t.empty() || t.find_first_of("xX") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return d;
}

Value filter_int(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0));
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_float()) ? Value(v.as_int()) : dflt;
  if (!v.is_string()) return dflt;
  if (std::optional<int64_t> i = parse_int(v.as_string())) return Value(*i);
  std::optional<double> d = parse_float(v.as_string());
  return d && std::isfinite(*d) ? Value(static_cast<int64_t>(*d)) : dflt;
}

Value filter_float(const Value& v, const CallArgs& a) {
  const Value dflt = a.get(0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_float());
  if (!v.is_string()) return dflt;
  std::optional<double> d = parse_float(v.as_string());
  return d ? Value(*d) : dflt;
}

Value filter_map(const Value& v, const CallArgs& a) {
  ValueList out;
  if (!v.truthy()) return Value::iterator({});
  const ValueList items = iterate(v, a.pos);
  if (a.args.empty() && a.kwarg("attribute")) {
    const Value attr = *a.kwarg("attribute");
    const Value dflt = a.get(99, "default");
    for (const Value& item : items) out.push_back(get_attribute(item, attr, a.pos, dflt));
    return Value::iterator(std::move(out));
  }
  if (a.args.empty()) fail(a.pos, "map requires a filter argument");
  const std::string name = a.args[0].str();
  CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs, a.pos};
  for (const Value& item : items) {
    std::optional<Value> x = call_filter(name, item, rest);
    if (!x) fail(a.pos, "No filter named '" + name + "'.");
    out.push_back(std::move(*x));
  }
  return Value::iterator(std::move(out));
}

// select/reject (by_attr = false) and selectattr/rejectattr (by_attr = true).
Value filter_select(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  const size_t test_index = by_attr ? 1 : 0;
  std::optional<std::string> test;
  if (a.args.size() > test_index) test = a.args[test_index].str();
  const size_t first_arg = std::min(test_index + 1, a.args.size());
  const CallArgs test_args{
      std::vector<Value>(a.args.begin() + static_cast<long>(first_arg), a.args.end()), a.kwargs,
      a.pos};
  ValueList out;
  if (!v.truthy()) return Value::iterator({});
  if (by_attr && a.args.empty()) fail(a.pos, "Missing parameter for attribute name");
  for (const Value& item : iterate(v, a.pos)) {
    const Value subject = by_attr ? get_attribute(item, a.args[0], a.pos) : item;
    bool pass = subject.truthy();
    if (test) {
      std::optional<bool> r = call_test(*test, subject, test_args);
      if (!r) fail(a.pos, "No test named '" + *test + "'.");
      pass = *r;
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::iterator(std::move(out));
}

Value filter_items(const Value& v, SourcePos pos) {
  if (v.is_undefined()) return Value::iterator({});
  if (!v.is_mapping()) fail(pos, "TypeError: Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, x] : v.entries()) out.push_back(Value::tuple({k, x}));
  return Value::iterator(std::move(out));
}

// tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value filter_tojson(const Value& v, const CallArgs& a) {
  JsonFormat f;
  f.ensure_ascii = a.get(0, "ensure_ascii", Value(false)).truthy();
  const Value indent = a.get(1, "indent", Value::none());
  if (indent.is_string()) {
    f.indent = indent.as_string();
  } else if (indent.is_integral()) {
    f.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent.as_int(), 0, 64)), ' ');
  } else if (!indent.is_none()) {
    fail(a.pos, "TypeError: tojson indent must be an int or a string");
  }
  if (f.indent) f.item_sep = ",";
  const Value separators = a.get(2, "separators", Value::none());
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.items().size() != 2 ||
        !separators.items()[0].is_string() || !separators.items()[1].is_string()) {
      fail(a.pos, "ValueError: tojson separators must be a pair of strings");
    }
    f.item_sep = separators.items()[0].as_string();
    f.key_sep = separators.items()[1].as_string();
  }
  f.sort_keys = a.get(3, "sort_keys", Value(false)).truthy();
  return Value(to_json(v, f, a.pos));
}

Value filter_reverse(const Value& v, SourcePos pos) {
  if (v.is_string()) {
    ValueList chars = iterate(v, pos);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->as_string();
    return like(v, std::move(out));
  }
  // reversed() works on sequences and dicts (an iterator); a generator becomes a reversed list.
  const bool reversible = (v.is_list() && !v.is_iterator()) || v.is_mapping();
  ValueList items = iterate(v, pos);
  std::reverse(items.begin(), items.end());
  return reversible ? Value::iterator(std::move(items)) : Value::list(std::move(items));
}

Value first_or_last(const Value& v, bool first, SourcePos pos) {
  if (!first && v.is_iterator()) fail(pos, "TypeError: 'generator' object is not reversible");
  const ValueList items = v.is_iterator() ? v.consume(1) : iterate(v, pos);
  if (items.empty()) return Value();
  return first ? items.front() : items.back();
}

// The key sort, min, max and unique order by: the item or its `attribute`, lower-cased strings
// unless case-sensitive.
struct OrderKey {
  bool case_sensitive = false;
  Value attribute = Value::none();
  SourcePos pos;
  Value operator()(const Value& x) const {
    return sort_key(attribute.is_none() ? x : get_attribute(x, attribute, pos), case_sensitive);
  }
};

// sort(value, reverse=False, case_sensitive=False, attribute=None): a stable sort.
Value filter_sort(const Value& v, const CallArgs& a) {
  const bool reverse = a.get(0, "reverse", Value(false)).truthy();
  const OrderKey key{a.get(1, "case_sensitive", Value(false)).truthy(),
                     a.get(2, "attribute", Value::none()), a.pos};
  ValueList items = iterate(v, a.pos);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare_values(key(y), key(x), a.pos) < 0
                   : compare_values(key(x), key(y), a.pos) < 0;
  });
  return Value::list(std::move(items));
}

// min/max(value, case_sensitive=False, attribute=None): the first extreme item; undefined when
// there are none.
Value filter_min_max(const Value& v, const CallArgs& a, bool is_min) {
  const OrderKey key{a.get(0, "case_sensitive", Value(false)).truthy(),
                     a.get(1, "attribute", Value::none()), a.pos};
  const ValueList items = iterate(v, a.pos);
  if (items.empty()) return Value();
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare_values(key(items[i]), key(items[best]), a.pos);
    if (is_min ? c < 0 : c > 0) best = i;
  }
  return items[best];
}

Value filter_unique(const Value& v, const CallArgs& a) {
  const OrderKey order{a.get(0, "case_sensitive", Value(false)).truthy(),
                       a.get(1, "attribute", Value::none()), a.pos};
  ValueList seen, out;
  for (const Value& x : iterate(v, a.pos)) {
    const Value key = order(x);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(key); }))
      continue;
    seen.push_back(key);
    out.push_back(x);
  }
  return Value::iterator(std::move(out));
}

Value filter_dictsort(const Value& v, const CallArgs& a) {
  const bool case_sensitive = a.get(0, "case_sensitive", Value(false)).truthy();
  const std::string by = a.get(1, "by", Value("key")).str();
  const bool reverse = a.get(2, "reverse", Value(false)).truthy();
  if (!v.is_mapping()) fail(a.pos, "AttributeError: dictsort expects a mapping");
  if (by != "key" && by != "value")
    fail(a.pos, "FilterArgumentError: You can only sort by either 'key' or 'value'");
  ValueList pairs;
  for (const auto& [k, x] : v.entries()) pairs.push_back(Value::tuple({k, x}));
  const size_t pick = by == "key" ? 0 : 1;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
    const Value x = sort_key(p.items()[pick], case_sensitive);
    const Value y = sort_key(q.items()[pick], case_sensitive);
    return reverse ? compare_values(y, x, a.pos) < 0 : compare_values(x, y, a.pos) < 0;
  });
  return Value::list(std::move(pairs));
}

Value filter_indent(const Value& v, const CallArgs& a) {
  if (!v.is_string()) fail(a.pos, "TypeError: indent expects a string");
  const Value width = a.get(0, "width", Value(4));
  const std::string unit =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(width.as_int(), 0)), ' ');
  const bool first = a.get(1, "first", Value(false)).truthy();
  const bool blank = a.get(2, "blank", Value(false)).truthy();
  const std::vector<std::string> lines = string_splitlines(v.as_string() + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += unit;
    out += lines[i];
  }
  if (first) out = unit + out;
  return like(v, std::move(out));
}

Value filter_abs(const Value& v, SourcePos pos) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  fail(pos, "TypeError: bad operand type for abs(): '" + std::string(v.type_name()) + "'");
}

Value filter_string_op(std::string_view name, const Value& v, const CallArgs& a) {
  const Value s = soft_str(v);
  if (name == "trim")
    return like(s, string_strip(s.as_string(), a.get(0, "chars", Value::none()), true, true));
  if (name == "upper") return like(s, string_upper(s.as_string()));
  if (name == "lower") return like(s, string_lower(s.as_string()));
  if (name == "capitalize") return like(s, string_capitalize(s.as_string()));
  if (name == "title") return like(s, string_title(s.as_string()));
  // replace(s, old, new, count=None) works on str(s): the result is plain.
  const Value count = a.get(2, "count", Value::none());
  return Value(string_replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(),
                              count.is_none() ? -1 : count.as_int()));
}

}  // namespace

std::optional<Value> call_filter(std::string_view name, const Value& v, const CallArgs& a) {
  if (name == "trim" || name == "upper" || name == "lower" || name == "capitalize" ||
      name == "title" || name == "replace") {
    return filter_string_op(name, v, a);
  }
  if (name == "length" || name == "count") return Value(length_of(v, a.pos));
  if (name == "first" || name == "last") return first_or_last(v, name == "first", a.pos);
  if (name == "join") return filter_join(v, a);
  if (name == "default" || name == "d") return filter_default(v, a);
  if (name == "tojson") return filter_tojson(v, a);
  if (name == "string") return soft_str(v);
  if (name == "int") return filter_int(v, a);
  if (name == "float") return filter_float(v, a);
  if (name == "items") return filter_items(v, a.pos);
  if (name == "list") return Value::list(iterate(v, a.pos));
  if (name == "map") return filter_map(v, a);
  if (name == "select" || name == "reject") return filter_select(v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return filter_select(v, a, true, name == "selectattr");
  if (name == "reverse") return filter_reverse(v, a.pos);
  if (name == "sort") return filter_sort(v, a);
  if (name == "dictsort") return filter_dictsort(v, a);
  if (name == "min" || name == "max") return filter_min_max(v, a, name == "min");
  if (name == "unique") return filter_unique(v, a);
  if (name == "indent") return filter_indent(v, a);
  if (name == "safe") return v.is_markup() ? v : Value::markup(v.str());
  if (name == "e" || name == "escape" || name == "forceescape") {
    return v.is_markup() && name != "forceescape" ? v : Value::markup(html_escape(v.str()));
  }
  if (name == "abs") return filter_abs(v, a.pos);
  if (name == "attr") return get_attr(v, a.get(0, "name").str(), a.pos);
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
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") {
    return v.is_list() || v.is_mapping() || v.is_string() || v.is_undefined();
  }
  if (name == "sequence") {
    return (v.is_list() && !v.is_iterator()) || v.is_mapping() || v.is_string() || v.is_undefined();
  }
  if (name == "callable") return v.is_macro() || v.is_callable();
  if (name == "escaped") return v.is_markup();
  if (name == "lower") return string_is_lower(v.str());
  if (name == "upper") return string_is_upper(v.str());
  const Value other = a.get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==") return v.equals(other);
  if (name == "ne" || name == "!=") return !v.equals(other);
  if (name == "sameas") {  // Python `is`: containers by identity, scalars by kind and value
    if (v.kind() != other.kind()) return false;
    if (v.is_list()) return &v.items() == &other.items();
    if (v.is_dict()) return &v.entries() == &other.entries();
    return v.equals(other);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return compare_values(v, other, a.pos) < 0;
  if (name == "le" || name == "<=") return compare_values(v, other, a.pos) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return compare_values(v, other, a.pos) > 0;
  if (name == "ge" || name == ">=") return compare_values(v, other, a.pos) >= 0;
  if (name == "in") return contains(a.get(0, "seq"), v, a.pos);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_integral())
      fail(a.pos, "TypeError: test '" + std::string(name) + "' expects an integer");
    const int64_t d = name == "divisibleby" ? a.get(0, "num").as_int() : 2;
    if (d == 0) fail(a.pos, "ZeroDivisionError: integer division or modulo by zero");
    const int64_t r = ((v.as_int() % d) + d) % d;
    return name == "odd" ? r != 0 : r == 0;
  }
  return std::nullopt;
}

}  // namespace arbor::chat::jinja
