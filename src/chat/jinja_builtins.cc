// Global functions of the Jinja interpreter: Jinja2's range, dict and namespace, and the
// raise_exception and strftime_now that transformers adds.
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <array>
#include <ctime>

namespace arbor::chat::jinja {
namespace {

// Jinja2's sandbox caps range() at this many items (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

Value global_range(const CallArgs& a) {
  for (const Value& x : a.args) {
    if (!x.is_integral()) {
      fail(a.pos, "TypeError: '" + std::string(x.type_name()) +
                      "' object cannot be interpreted as an integer");
    }
  }
  if (a.args.empty() || a.args.size() > 3) {
    fail(a.pos, "TypeError: range expected 1 to 3 arguments, got " + std::to_string(a.args.size()));
  }
  const int64_t start = a.args.size() == 1 ? 0 : a.args[0].as_int();
  const int64_t stop = a.args.size() == 1 ? a.args[0].as_int() : a.args[1].as_int();
  const int64_t step = a.args.size() == 3 ? a.args[2].as_int() : 1;
  if (step == 0) fail(a.pos, "ValueError: range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      throw TemplateError(
          TemplateError::Kind::kLimit, a.pos,
          "OverflowError: range too big, maximum size is " + std::to_string(kMaxRange));
    }
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

Value global_dict(std::string_view name, const CallArgs& a) {
  Value d = name == "namespace" ? Value::namespace_dict() : Value::dict();
  for (const Value& x : a.args) {
    if (!x.is_mapping()) {
      fail(a.pos, "TypeError: " + std::string(name) + "() positional argument must be a mapping");
    }
    for (const auto& [k, v] : x.entries()) d.set_key(k, v);
  }
  for (const auto& [k, v] : a.kwargs) d.set(k, v);
  return d;
}

// datetime.now().strftime(format): the local time (or env's fixed instant) in the C locale.
Value global_strftime_now(const CallArgs& a, const RenderEnvironment& env) {
  const Value format = a.get(0, "format");
  if (!format.is_string()) {
    fail(a.pos,
         "TypeError: strftime() argument 1 must be str, not " + std::string(format.type_name()));
  }
  const std::time_t now =
      env.now_unix_seconds ? static_cast<std::time_t>(*env.now_unix_seconds) : std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), format.as_string().c_str(), &tm);
  if (n == 0 && !format.as_string().empty())
    fail(a.pos, "strftime_now: the format produced no text or more than 512 bytes");
  return Value(std::string(buf, n));
}

}  // namespace

bool is_global_function(std::string_view name) {
  static constexpr std::array<std::string_view, 5> kNames = {"range", "dict", "namespace",
                                                             "raise_exception", "strftime_now"};
  return std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

Value call_global(std::string_view name, const CallArgs& a, const RenderEnvironment& env) {
  if (name == "raise_exception") {
    throw TemplateError(TemplateError::Kind::kRaised, a.pos, a.get(0, "message").str());
  }
  if (name == "range") return global_range(a);
  if (name == "dict" || name == "namespace") return global_dict(name, a);
  return global_strftime_now(a, env);
}

}  // namespace arbor::chat::jinja
