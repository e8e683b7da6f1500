// A Jinja2 interpreter for Hugging Face chat templates that renders as Python's jinja2 does in
// transformers' apply_chat_template environment (ImmutableSandboxedEnvironment, trim_blocks and
// lstrip_blocks on, the loopcontrols extension, `{% generation %}` as a plain block, tojson as
// json.dumps with ensure_ascii=False, raise_exception and strftime_now), byte for byte on the 70
// real templates of shared/templates (tests/chat/template_reference_test.cc).
//
// Python's semantics are kept where templates can see them: default Undefined (prints nothing, is
// falsy, iterates as empty; attribute access, calls and arithmetic on it fail); `obj.name` finds
// a method before a dict key (a schema's `.items` is dict.items) and `obj[key]` a key before a
// method; map/select/reject/selectattr/rejectattr/unique/items/reverse return one-shot iterators
// (truthy, no length, not JSON, empty once consumed); `|safe` and `|e` make Markup, which escapes
// a plain string added to it with `+`; dict keys of any hashable type (1 == 1.0 == true); Python
// float repr, str methods by code point, list and dict methods that mutate refused as in the
// sandbox; and a template fails (a Status naming Python's exception type, e.g. "TypeError: ...")
// wherever jinja2 raises.
//
// Supported: {{ }}, {% %}, {# #}, `-`/`+` whitespace modifiers; if/elif/else, for (loop.*,
// `for x in xs if cond`, for-else, tuple targets), set (including `set ns.x` on a namespace() and
// block set), macro (positional and keyword arguments, defaults evaluated in the macro's scope),
// filter blocks, break/continue; literals, lists, tuples, dicts, attribute/subscript/slice access,
// arithmetic, comparison, `in`, `~`, `and/or/not`, ternaries; the filters, tests, methods and
// globals of jinja_filters.cc, jinja_methods.cc and jinja_builtins.cc. Not supported (no chat
// template uses them): template inheritance/include/import, call blocks, recursive loops,
// `{% raw %}`, macro varargs/kwargs/caller, printf-style `%` on strings, format specs in
// str.format.
//
// Errors are Status values carrying the template line and column. Renders are bounded: expression
// and block nesting is capped at parse time, and RenderLimits caps output size, the size of
// strings and lists a template builds, the number of executed steps and macro recursion.
//
// Thread safety: a parsed Template is immutable; render() may run concurrently on one Template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "chat/jinja_value.h"

namespace arbor::chat::jinja {

struct Program;  // the parsed syntax tree

struct RenderLimits {
  // Largest output, and largest string or list built while rendering.
  size_t max_output_bytes = size_t{16} << 20;
  // Statements executed plus loop iterations.
  int64_t max_steps = 10'000'000;
  // Nested macro calls (a macro calling itself).
  int max_call_depth = 64;
};

// What a render may read from its surroundings besides its variables.
struct RenderEnvironment {
  // The instant strftime_now() formats, in Unix seconds; nullopt means the current time. Either
  // way it is shown in the local time zone, as transformers' datetime.now() does. Tests fix it so
  // that a rendering is reproducible.
  std::optional<int64_t> now_unix_seconds;
};

class Template {
 public:
  // Parses `source`. A syntax error is kInvalidArgument with "line L, column C".
  static Result<Template> parse(std::string source);

  // Renders with `globals` (a dict Value: variable name -> value). `raise_exception(msg)` in the
  // template returns kInvalidArgument whose message is exactly `msg`; other failures are
  // kInvalidArgument (template errors, and a RenderLimits cap: the request can never render)
  // with position.
  Result<std::string> render(const Value& globals, const RenderLimits& limits = {},
                             const RenderEnvironment& env = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace arbor::chat::jinja
