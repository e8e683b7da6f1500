// A Jinja2 interpreter for the subset that Hugging Face chat templates use.
//
// Renders like transformers' apply_chat_template environment: trim_blocks and lstrip_blocks on,
// the loopcontrols extension ({% break %}, {% continue %}), `{% generation %}` as a plain block,
// tojson without HTML escaping and with insertion-ordered keys, default Undefined (prints
// nothing, is falsy, iterates as empty; attribute access on it or arithmetic with it is an error).
//
// Supported: {{ }}, {% %}, {# #}, `-`/`+` whitespace modifiers; if/elif/else, for (loop.*,
// `for x in xs if cond`, for-else, tuple targets), set (including `set ns.x` on a namespace() and
// block set), macro (positional and keyword arguments with defaults), break/continue;
// literals, lists, dicts, attribute/subscript/slice access, arithmetic, comparison, `in`, `~`,
// `and/or/not`, ternaries, filters, tests, str/dict methods and the globals range, namespace,
// dict, raise_exception and strftime_now. Filter, test and method names are listed in
// jinja_builtins.cc. Not supported: template inheritance/include/import, call blocks, recursive
// loops, `{% raw %}`, `{% filter %}`.
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
