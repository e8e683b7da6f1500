// Attribute and item access, methods of str/dict/list, and the sequence helpers of the Jinja
// interpreter, with Python's semantics.
#include <algorithm>
#include <array>

#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

[[noreturn]] void type_error(SourcePos pos, const std::string& message) {
  fail(pos, "TypeError: " + message);
}

// Python's attribute names of str, dict and list objects (getattr finds them before any key).
constexpr std::array<std::string_view, 47> kStrMethods = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};
constexpr std::array<std::string_view, 11> kDictMethods = {
    "clear", "copy",    "fromkeys",   "get",    "items", "keys",
    "pop",   "popitem", "setdefault", "update", "values"};
constexpr std::array<std::string_view, 11> kListMethods = {"append", "clear",   "copy",   "count",
                                                           "extend", "index",   "insert", "pop",
                                                           "remove", "reverse", "sort"};

template <size_t N>
bool listed(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Methods that modify their object: ImmutableSandboxedEnvironment refuses them.
bool mutates(std::string_view name) {
  static constexpr std::array<std::string_view, 12> kMutating = {
      "append", "clear",   "extend", "insert",     "pop",    "popitem",
      "remove", "reverse", "sort",   "setdefault", "update", "fromkeys"};
  return listed(kMutating, name);
}

Value like(const Value& source, std::string s) {
  return source.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

// An argument of a Markup method: escaped unless already markup.
std::string markup_arg(const Value& self, const Value& arg) {
  if (!self.is_markup() || arg.is_markup()) return arg.str();
  return html_escape(arg.str());
}

std::string string_arg(const Value& v, std::string_view method, SourcePos pos) {
  if (!v.is_string()) {
    type_error(pos,
               std::string(method) + "() argument must be str, not " + std::string(v.type_name()));
  }
  return v.as_string();
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix, SourcePos pos) {
  auto one = [&](const Value& a) {
    const std::string x = string_arg(a, prefix ? "startswith" : "endswith", pos);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_tuple()) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

Value split_value(const Value& self, const std::vector<std::string>& parts) {
  ValueList out;
  for (const std::string& p : parts) out.push_back(like(self, p));
  return Value::list(std::move(out));
}

Value string_join(const Value& self, const Value& iterable, SourcePos pos) {
  std::string out;
  const ValueList items = iterate(iterable, pos);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      type_error(pos, "sequence item " + std::to_string(i) + ": expected str instance, " +
                          std::string(items[i].type_name()) + " found");
    }
    if (i) out += self.as_string();
    out += markup_arg(self, items[i]);
  }
  return like(self, std::move(out));
}

std::optional<Value> string_method_1(const Value& self, std::string_view name, const CallArgs& a) {
  const std::string& s = self.as_string();
  const Value none = Value::none();
  if (name == "strip") return like(self, string_strip(s, a.get(0, "chars", none), true, true));
  if (name == "lstrip") return like(self, string_strip(s, a.get(0, "chars", none), true, false));
  if (name == "rstrip") return like(self, string_strip(s, a.get(0, "chars", none), false, true));
  if (name == "startswith") return Value(affix_matches(s, a.get(0, "prefix"), true, a.pos));
  if (name == "endswith") return Value(affix_matches(s, a.get(0, "suffix"), false, a.pos));
  if (name == "split" || name == "rsplit") {
    const Value sep = a.get(0, "sep", none);
    if (!sep.is_none() && (!sep.is_string() || sep.as_string().empty())) {
      fail(a.pos, sep.is_string()
                      ? "ValueError: empty separator"
                      : "TypeError: must be str or None, not " + std::string(sep.type_name()));
    }
    const int64_t maxsplit = a.get(1, "maxsplit", Value(-1)).as_int();
    return split_value(self, string_split(s, sep.is_none() ? nullptr : &sep.as_string(), maxsplit,
                                          name == "rsplit"));
  }
  if (name == "splitlines") return split_value(self, string_splitlines(s));
  if (name == "upper") return like(self, string_upper(s));
  if (name == "lower") return like(self, string_lower(s));
  if (name == "title") return like(self, string_title(s));
  if (name == "capitalize") return like(self, string_capitalize(s));
  if (name == "replace") {
    const std::string from = string_arg(a.get(0, "old"), "replace", a.pos);
    string_arg(a.get(1, "new"), "replace", a.pos);
    return like(self, string_replace(s, from, markup_arg(self, a.get(1, "new")),
                                     a.get(2, "count", Value(-1)).as_int()));
  }
  if (name == "join") return string_join(self, a.get(0, "iterable"), a.pos);
  if (name == "format") return like(self, string_format(self, a));
  return std::nullopt;
}

std::optional<Value> string_method_2(const Value& self, std::string_view name, const CallArgs& a) {
  const std::string& s = self.as_string();
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string sub = string_arg(a.get(0, "sub"), name, a.pos);
    if (name == "count") return Value(static_cast<int64_t>(string_count(s, sub)));
    const bool from_right = name[0] == 'r';
    const size_t hit = from_right ? s.rfind(sub) : s.find(sub);
    if (hit == std::string::npos) {
      if (name == "index" || name == "rindex") fail(a.pos, "ValueError: substring not found");
      return Value(-1);
    }
    return Value(static_cast<int64_t>(utf8_length(s.substr(0, hit))));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string affix = string_arg(a.get(0, "prefix"), name, a.pos);
    const bool prefix = name == "removeprefix";
    if (!affix_matches(s, Value(affix), prefix, a.pos)) return self;
    return like(self, prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return Value(!s.empty() &&
                 std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
  }
  if (name == "isalpha" || name == "isalnum") {
    const bool alnum = name == "isalnum";
    return Value(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
      return std::isalpha(static_cast<unsigned char>(c)) ||
             (alnum && std::isdigit(static_cast<unsigned char>(c)));
    }));
  }
  if (name == "isspace") {
    return Value(!s.empty() && string_strip(s, Value::none(), true, true).empty());
  }
  if (name == "islower") return Value(string_is_lower(s));
  if (name == "isupper") return Value(string_is_upper(s));
  return std::nullopt;
}

Value dict_method(const Value& d, std::string_view name, const CallArgs& a) {
  if (name == "get") {
    const Value* v = d.find_key(a.get(0, "key"));
    return v ? *v : a.get(1, "default", Value::none());
  }
  ValueList out;
  for (const auto& [k, v] : d.entries()) {
    if (name == "items") out.push_back(Value::tuple({k, v}));
    if (name == "keys") out.push_back(k);
    if (name == "values") out.push_back(v);
  }
  if (name == "copy") return Value::dict(d.entries());
  if (name == "items" || name == "keys" || name == "values") return Value::list(std::move(out));
  fail(a.pos, "arbor's templates do not support dict." + std::string(name) + "()");
}

Value list_method(const Value& l, std::string_view name, const CallArgs& a) {
  if (name == "copy") return Value::list(l.items());
  if (name == "count" || name == "index") {
    const Value x = a.get(0, "value");
    int64_t n = 0;
    for (size_t i = 0; i < l.items().size(); ++i) {
      if (!l.items()[i].equals(x)) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") fail(a.pos, "ValueError: " + x.repr() + " is not in list");
    return Value(n);
  }
  fail(a.pos, "arbor's templates do not support list." + std::string(name) + "()");
}

}  // namespace

bool has_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return listed(kStrMethods, name);
  if (obj.is_mapping()) return listed(kDictMethods, name);
  if (obj.is_tuple()) return name == "count" || name == "index";
  if (obj.is_list() && !obj.is_iterator()) return listed(kListMethods, name);
  return false;
}

Value call_method(const Value& obj, std::string_view name, const CallArgs& a) {
  if ((obj.is_list() || obj.is_dict()) && mutates(name)) {
    fail(a.pos, "SecurityError: access to attribute '" + std::string(name) + "' of '" +
                    std::string(obj.type_name()) + "' object is unsafe.");
  }
  if (obj.is_string()) {
    if (std::optional<Value> r = string_method_1(obj, name, a)) return std::move(*r);
    if (std::optional<Value> r = string_method_2(obj, name, a)) return std::move(*r);
    fail(a.pos, "arbor's templates do not support str." + std::string(name) + "()");
  }
  if (obj.is_dict()) return dict_method(obj, name, a);
  return list_method(obj, name, a);
}

Value get_item(const Value& obj, const Value& key, SourcePos pos) {
  if (obj.is_undefined()) fail(pos, "UndefinedError: cannot read an item of an undefined value");
  if (key.is_integral() && ((obj.is_list() && !obj.is_iterator()) || obj.is_string())) {
    const ValueList chars = obj.is_string() ? iterate(obj, pos) : ValueList();
    const ValueList& seq = obj.is_string() ? chars : obj.items();
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(seq.size());
    if (i >= 0 && i < static_cast<int64_t>(seq.size())) {
      const Value& item = seq[static_cast<size_t>(i)];
      return obj.is_string() ? like(obj, item.as_string()) : item;
    }
    return Value();
  }
  if (obj.is_mapping()) {
    if (const Value* v = obj.find_key(key)) return *v;
  }
  if (key.is_string()) {
    if (has_method(obj, key.as_string())) return Value::callable(key.as_string(), &obj);
    if (obj.is_namespace()) {
      if (const Value* v = obj.find(key.as_string())) return *v;
    }
  }
  return Value();
}

Value get_attr(const Value& obj, const std::string& name, SourcePos pos) {
  if (obj.is_undefined())
    fail(pos, "UndefinedError: cannot read attribute '" + name + "' of an undefined value");
  if (has_method(obj, name)) return Value::callable(name, &obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.find(name)) return *v;
  }
  return Value();
}

ValueList iterate(const Value& v, SourcePos pos) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.is_iterator() ? v.consume() : v.items();
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      ValueList keys;
      for (const auto& [k, x] : v.entries()) keys.push_back(k);
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
    default: break;
  }
  type_error(pos, "'" + std::string(v.type_name()) + "' object is not iterable");
}

int64_t length_of(const Value& v, SourcePos pos) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return static_cast<int64_t>(utf8_length(v.as_string()));
  if (v.is_list() && !v.is_iterator()) return static_cast<int64_t>(v.items().size());
  if (v.is_mapping()) return static_cast<int64_t>(v.entries().size());
  type_error(pos, "object of type '" + std::string(v.type_name()) + "' has no len()");
}

int compare_values(const Value& a, const Value& b, SourcePos pos) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  const bool same_sequence = a.is_list() && b.is_list() && !a.is_iterator() && !b.is_iterator() &&
                             a.is_tuple() == b.is_tuple();
  if (same_sequence) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return compare_values(x[i], y[i], pos);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  type_error(pos, "'<' not supported between instances of '" + std::string(a.type_name()) +
                      "' and '" + std::string(b.type_name()) + "'");
}

bool contains(const Value& container, const Value& item, SourcePos pos) {
  if (container.is_string()) {
    if (!item.is_string()) {
      type_error(pos, "'in <string>' requires string as left operand, not " +
                          std::string(item.type_name()));
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_mapping()) return container.find_key(item) != nullptr;
  if (container.is_iterator()) {
    while (true) {
      const ValueList next = container.consume(1);
      if (next.empty()) return false;
      if (next[0].equals(item)) return true;
    }
  }
  if (container.is_list()) {
    return std::any_of(container.items().begin(), container.items().end(),
                       [&](const Value& x) { return x.equals(item); });
  }
  if (container.is_undefined()) return false;
  type_error(pos, "argument of type '" + std::string(container.type_name()) + "' is not iterable");
}

std::vector<size_t> slice_indices(size_t length, const Value& start, const Value& stop,
                                  const Value& step, SourcePos pos) {
  auto bound = [&](const Value& v) {
    if (!v.is_undefined() && !v.is_none() && !v.is_integral())
      type_error(pos, "slice indices must be integers or None");
    return v.is_integral();
  };
  const int64_t n = static_cast<int64_t>(length);
  const int64_t st = bound(step) ? step.as_int() : 1;
  if (st == 0) fail(pos, "ValueError: slice step cannot be zero");
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

}  // namespace arbor::chat::jinja
