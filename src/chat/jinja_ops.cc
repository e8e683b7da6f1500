// Arithmetic and concatenation operators of the Jinja interpreter, with Python's semantics
// (int/float promotion, floor division and modulo, Markup escaping on +).
#include <climits>
#include <cmath>

#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {
namespace {

[[noreturn]] void limit_error(SourcePos pos, std::string message) {
  throw TemplateError(TemplateError::Kind::kLimit, pos, std::move(message));
}

Value repeat(const Value& seq, int64_t times, size_t max_size, SourcePos pos) {
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.items().size();
  const size_t n = times > 0 ? static_cast<size_t>(times) : 0;
  if (unit != 0 && n > max_size / unit)
    limit_error(pos, "repetition builds a value over the size limit");
  if (seq.is_string()) {
    std::string out;
    for (size_t i = 0; i < n; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  ValueList out;
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value int_arithmetic(int64_t a, int64_t b, const std::string& op, SourcePos pos) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") overflow = __builtin_add_overflow(a, b, &r);
  if (op == "-") overflow = __builtin_sub_overflow(a, b, &r);
  if (op == "*") overflow = __builtin_mul_overflow(a, b, &r);
  if (op == "//" || op == "%") {
    if (b == 0) fail(pos, "ZeroDivisionError: integer division or modulo by zero");
    if (a == INT64_MIN && b == -1) overflow = true;
    if (!overflow) {
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        --q;
        m += b;
      }
      r = op == "//" ? q : m;
    }
  }
  if (op == "**") {
    if (b < 0) {
      if (a == 0) fail(pos, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
      return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
    }
    r = 1;
    for (int64_t i = 0; i < b && !overflow; ++i) overflow = __builtin_mul_overflow(r, a, &r);
  }
  if (overflow) fail(pos, "integer overflow in '" + op + "'");
  return Value(r);
}

Value float_arithmetic(double a, double b, const std::string& op, SourcePos pos) {
  if (op == "+") return Value(a + b);
  if (op == "-") return Value(a - b);
  if (op == "*") return Value(a * b);
  if (op == "**") {
    if (a == 0.0 && b < 0) fail(pos, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
    return Value(std::pow(a, b));
  }
  if (b == 0.0) fail(pos, "ZeroDivisionError: float division by zero");
  if (op == "/") return Value(a / b);
  if (op == "//") return Value(std::floor(a / b));
  const double m = std::fmod(a, b);
  return Value(m != 0.0 && ((m < 0) != (b < 0)) ? m + b : m);
}

// str + str, where a Markup operand escapes the plain one (Markup.__add__ / __radd__).
Value add_strings(const Value& l, const Value& r) {
  if (!l.is_markup() && !r.is_markup()) return Value(l.as_string() + r.as_string());
  const std::string left = l.is_markup() ? l.as_string() : html_escape(l.as_string());
  const std::string right = r.is_markup() ? r.as_string() : html_escape(r.as_string());
  return Value::markup(left + right);
}

}  // namespace

Value binary_op(const std::string& op, const Value& l, const Value& r, size_t max_size,
                SourcePos pos) {
  if (op == "+" && l.is_string() && r.is_string()) return add_strings(l, r);
  const bool sequences = l.is_list() && r.is_list() && !l.is_iterator() && !r.is_iterator();
  if (op == "+" && sequences && l.is_tuple() == r.is_tuple()) {
    ValueList out = l.items();
    out.insert(out.end(), r.items().begin(), r.items().end());
    return l.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  auto repeatable = [](const Value& v) {
    return v.is_string() || (v.is_list() && !v.is_iterator());
  };
  if (op == "*" && repeatable(l) && r.is_integral()) return repeat(l, r.as_int(), max_size, pos);
  if (op == "*" && repeatable(r) && l.is_integral()) return repeat(r, l.as_int(), max_size, pos);
  if (l.is_undefined() || r.is_undefined()) {
    fail(pos, "UndefinedError: an undefined value used with '" + op + "'");
  }
  if (!l.is_number() || !r.is_number()) {
    fail(pos, "TypeError: unsupported operand type(s) for " + op + ": '" +
                  std::string(l.type_name()) + "' and '" + std::string(r.type_name()) + "'");
  }
  if (op == "/") {
    if (r.as_float() == 0.0) fail(pos, "ZeroDivisionError: division by zero");
    return Value(l.as_float() / r.as_float());
  }
  if (!l.is_float() && !r.is_float()) return int_arithmetic(l.as_int(), r.as_int(), op, pos);
  return float_arithmetic(l.as_float(), r.as_float(), op, pos);
}

}  // namespace arbor::chat::jinja
