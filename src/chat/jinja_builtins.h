// Internal to the Jinja interpreter: filters, tests, methods of str/dict, global functions and
// tojson. Each throws TemplateError at `args.pos` on a bad argument, as Jinja2 raises.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// Filters (`x | name(args)`). Returns nullopt when `name` is not a known filter.
std::optional<Value> call_filter(std::string_view name, const Value& subject, const CallArgs& args);
// Tests (`x is name(args)`). Returns nullopt when `name` is not a known test.
std::optional<bool> call_test(std::string_view name, const Value& subject, const CallArgs& args);
// Methods of str and dict (`s.strip()`, `d.items()`). Returns nullopt when `obj` has no such
// method.
std::optional<Value> call_method(const Value& obj, std::string_view name, const CallArgs& args);
// Globals: range, namespace, dict, raise_exception, strftime_now. nullopt when not a global.
std::optional<Value> call_global(std::string_view name, const CallArgs& args);

// Python json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson filter prints it
// (insertion-ordered keys, no HTML escaping). indent < 0 means single-line.
std::string to_json(const Value& v, int indent, SourcePos pos);

// Python slice semantics: the indices selected by [start:stop:step] of a sequence of `length`.
std::vector<size_t> slice_indices(size_t length, const Value& start, const Value& stop,
                                  const Value& step, SourcePos pos);
// The items a for loop or a filter iterates: list items, dict keys, string code points; undefined
// iterates nothing. Other values fail.
ValueList iterate(const Value& v, SourcePos pos);
// Python len(); fails for values without one.
int64_t length_of(const Value& v, SourcePos pos);

// Python str.strip/lstrip/rstrip: `chars` (a string) or, when not a string, whitespace.
std::string string_strip(const std::string& s, const Value& chars, bool left, bool right);
// ASCII case mapping with Python's str.upper/lower/title/capitalize rules.
std::string string_upper(std::string s);
std::string string_lower(std::string s);
std::string string_title(std::string s);
std::string string_capitalize(std::string s);
// Python str.replace(old, new, count); count < 0 or not an int replaces all.
std::string string_replace(const std::string& s, const Value& old_v, const Value& new_v,
                           const Value& count, SourcePos pos);

}  // namespace arbor::chat::jinja
