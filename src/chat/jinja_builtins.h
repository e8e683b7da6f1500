// Internal to the Jinja interpreter: filters, tests, methods of str/dict/list, global functions,
// tojson and the sequence helpers they share. Each follows Jinja2 3.1 (and the Python operation
// under it) and throws TemplateError at `args.pos` where Python raises.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace arbor::chat::jinja {

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  SourcePos pos;

  // The argument at `index` or named `name`; `fallback` when neither was passed.
  Value get(size_t index, std::string_view name, Value fallback = Value()) const;
  const Value* kwarg(std::string_view name) const;
};

// ---- jinja_filters.cc ----

// Filters (`x | name(args)`). Returns nullopt when `name` is not a known filter.
std::optional<Value> call_filter(std::string_view name, const Value& subject, const CallArgs& args);
// Tests (`x is name(args)`). Returns nullopt when `name` is not a known test.
std::optional<bool> call_test(std::string_view name, const Value& subject, const CallArgs& args);

// ---- jinja_methods.cc ----

// Jinja2's environment.getitem(obj, key): obj[key]; failing that, for a string key, the
// attribute (a method, a namespace's attribute); undefined when neither exists. Fails for an
// undefined obj (UndefinedError).
Value get_item(const Value& obj, const Value& key, SourcePos pos);
// Jinja2's environment.getattr(obj, name): the attribute (a bound method), else obj[name];
// undefined when neither exists. Fails for an undefined obj.
Value get_attr(const Value& obj, const std::string& name, SourcePos pos);

// Whether Python's getattr(obj, name) finds a method: str methods on strings, dict methods on
// dicts (not namespaces), list methods on lists. Jinja2 prefers these to dict keys for `obj.name`.
bool has_method(const Value& obj, std::string_view name);
// Calls the method `name` of `obj`. Methods that would modify a list or dict fail as in
// Jinja2's ImmutableSandboxedEnvironment. Precondition: has_method(obj, name).
Value call_method(const Value& obj, std::string_view name, const CallArgs& args);

// ---- jinja_builtins.cc ----

// Whether `name` is a global function: Jinja2's range, dict and namespace, and transformers'
// raise_exception and strftime_now.
bool is_global_function(std::string_view name);
// Calls a global function. Precondition: is_global_function(name).
Value call_global(std::string_view name, const CallArgs& args, const RenderEnvironment& env);

// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson
// filter calls it. `indent`: nullopt writes one line; otherwise a newline and the unit repeated
// per level (json.dumps' indent=n is n spaces). json.dumps' default separators are ", " and ": "
// on one line, "," and ": " with an indent.
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonFormat& format, SourcePos pos);

// Python slice semantics: the indices selected by [start:stop:step] of a sequence of `length`.
std::vector<size_t> slice_indices(size_t length, const Value& start, const Value& stop,
                                  const Value& step, SourcePos pos);
// Python iter(): list items, dict keys, string code points (as one-character strings), an
// iterator's remaining items (consuming them); undefined iterates nothing. Other values fail
// ("'int' object is not iterable").
ValueList iterate(const Value& v, SourcePos pos);
// Python len(); fails for values without one (none, numbers, iterators).
int64_t length_of(const Value& v, SourcePos pos);
// Python <, == ... on numbers, strings, and lists/tuples of them: -1, 0 or 1. Fails for other
// pairs ("'<' not supported between instances of 'int' and 'str'").
int compare_values(const Value& a, const Value& b, SourcePos pos);
// Python `item in container`.
bool contains(const Value& container, const Value& item, SourcePos pos);

// ---- jinja_ops.cc ----

// Python `l op r` for + - * / // % **; strings and lists built larger than `max_size` bytes or
// items are a kLimit error. (`~`, comparisons and `in` are the renderer's.)
Value binary_op(const std::string& op, const Value& l, const Value& r, size_t max_size,
                SourcePos pos);

// ---- jinja_strings.cc ----

// Python str.strip/lstrip/rstrip: `chars` (a string) or, when none, whitespace.
std::string string_strip(const std::string& s, const Value& chars, bool left, bool right);
// ASCII case mapping with Python's str.upper/lower/title/capitalize rules.
std::string string_upper(std::string s);
std::string string_lower(std::string s);
std::string string_title(std::string s);
std::string string_capitalize(std::string s);
// Python str.replace(old, new, count); count < 0 replaces all.
std::string string_replace(const std::string& s, const std::string& from, const std::string& to,
                           int64_t count);
// Python str.splitlines() (without keepends).
std::vector<std::string> string_splitlines(const std::string& s);
// Python str.islower() / isupper(): some cased character, and none of the other case.
bool string_is_lower(const std::string& s);
bool string_is_upper(const std::string& s);
// Python str.split(sep, maxsplit) (rsplit when from_right); sep null splits at whitespace runs.
std::vector<std::string> string_split(const std::string& s, const std::string* sep,
                                      int64_t maxsplit, bool from_right);
// Python str.count(sub): non-overlapping occurrences.
size_t string_count(const std::string& s, const std::string& sub);
// Python str.format(*args, **kwargs) of `self` for replacement fields {}, {0}, {name} with an
// optional !s/!r conversion and no format spec. A markup `self` escapes the arguments, as
// Markup.format does.
std::string string_format(const Value& self, const CallArgs& args);

}  // namespace arbor::chat::jinja
