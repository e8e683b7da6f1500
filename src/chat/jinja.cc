#include "chat/jinja.h"

#include <climits>
#include <cmath>
#include <exception>
#include <new>
#include <unordered_map>

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {

struct Program {
  Body body;
};

namespace {

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

[[noreturn]] void limit_error(SourcePos pos, std::string message) {
  throw TemplateError(TemplateError::Kind::kLimit, pos, std::move(message));
}

class Renderer {
 public:
  Renderer(const Value& globals, const RenderLimits& limits) : globals_(globals), limits_(limits) {
    scopes_.emplace_back();
  }

  std::string render(const Body& body) {
    std::string out;
    out_ = &out;
    if (render_body(body) != Flow::kNormal)
      fail(SourcePos{}, "'break' or 'continue' outside of a loop");
    return out;
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  void step(SourcePos pos) {
    if (++steps_ > limits_.max_steps) {
      limit_error(pos, "template ran more than " + std::to_string(limits_.max_steps) + " steps");
    }
  }

  void emit(const std::string& s, SourcePos pos) {
    if (out_->size() + s.size() > limits_.max_output_bytes) {
      limit_error(pos,
                  "template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
    *out_ += s;
  }

  Value checked_size(Value v, SourcePos pos) const {
    const size_t n = v.is_string() ? v.as_string().size() : v.is_list() ? v.items().size() : 0;
    if (n > limits_.max_output_bytes) {
      limit_error(pos,
                  "template built a value larger than " + std::to_string(limits_.max_output_bytes));
    }
    return v;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    const Value* g = globals_.find(name);
    return g ? *g : Value();
  }

  // ---- statements ----

  Flow render_body(const Body& body) {
    for (const StmtPtr& s : body) {
      const Flow f = render_stmt(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow render_stmt(const Stmt& s) {
    step(s.pos);
    switch (s.kind) {
      case StmtKind::kText: emit(s.text, s.pos); return Flow::kNormal;
      case StmtKind::kOutput: emit(eval(*s.expr).str(), s.pos); return Flow::kNormal;
      case StmtKind::kIf: return render_if(s);
      case StmtKind::kFor: return render_for(s);
      case StmtKind::kSet: assign(s, eval(*s.expr)); return Flow::kNormal;
      case StmtKind::kSetBlock: assign(s, Value(capture(s.body))); return Flow::kNormal;
      case StmtKind::kMacro:
        scopes_.back()[s.macro->name] = Value::macro(s.macro.get());
        return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return render_body(s.body);
    }
    return Flow::kNormal;
  }

  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    const Flow f = render_body(body);
    out_ = saved;
    if (f != Flow::kNormal) fail(SourcePos{}, "'break' or 'continue' outside of a loop");
    return buf;
  }

  Flow render_if(const Stmt& s) {
    for (const auto& [cond, body] : s.branches) {
      if (eval(*cond).truthy()) return render_body(body);
    }
    return render_body(s.else_body);
  }

  void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v,
                    SourcePos pos) {
    if (targets.size() == 1) {
      scope[targets[0]] = v;
      return;
    }
    if (!v.is_list() || v.items().size() != targets.size()) {
      fail(pos, "cannot unpack " + std::string(v.type_name()) + " into " +
                    std::to_string(targets.size()) + " variables");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = v.items()[i];
  }

  static Value loop_value(const ValueList& items, size_t i) {
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t k = static_cast<int64_t>(i);
    return Value::dict({{"index", Value(k + 1)},
                        {"index0", Value(k)},
                        {"revindex", Value(n - k)},
                        {"revindex0", Value(n - k - 1)},
                        {"first", Value(i == 0)},
                        {"last", Value(k == n - 1)},
                        {"length", Value(n)},
                        {"previtem", i > 0 ? items[i - 1] : Value()},
                        {"nextitem", k + 1 < n ? items[i + 1] : Value()}});
  }

  Flow render_for(const Stmt& s) {
    ValueList items = iterate(eval(*s.expr), s.expr->pos);
    if (s.filter) {
      ValueList kept;
      for (const Value& item : items) {
        step(s.pos);
        scopes_.emplace_back();
        bind_targets(scopes_.back(), s.targets, item, s.pos);
        const bool keep = eval(*s.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      step(s.pos);
      scopes_.emplace_back();
      bind_targets(scopes_.back(), s.targets, items[i], s.pos);
      scopes_.back()["loop"] = loop_value(items, i);
      const Flow f = render_body(s.body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (items.empty()) return render_body(s.else_body);
    return Flow::kNormal;
  }

  void assign(const Stmt& s, Value v) {
    if (s.attr.empty()) {
      bind_targets(scopes_.back(), s.targets, v, s.pos);
      return;
    }
    const Value ns = lookup(s.targets[0]);
    if (!ns.is_namespace()) {
      fail(s.pos, "cannot assign attribute '" + s.attr + "' on " + std::string(ns.type_name()) +
                      " '" + s.targets[0] + "': only namespace() objects allow it");
    }
    ns.set(s.attr, std::move(v));
  }

  // ---- expressions ----

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name);
      case ExprKind::kList: {
        ValueList items;
        for (const ExprPtr& a : e.args) items.push_back(eval(*a));
        return e.name == "tuple" ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case ExprKind::kDict: return eval_dict(e);
      case ExprKind::kGetAttr: return get_attr(eval(*e.args[0]), e.name, e);
      case ExprKind::kGetItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e);
      case ExprKind::kSlice: return eval_slice(e);
      case ExprKind::kCall: return eval_call(e);
      case ExprKind::kFilter: return eval_filter(e);
      case ExprKind::kTest: return eval_test(e);
      case ExprKind::kUnary: return eval_unary(e);
      case ExprKind::kBinary: return eval_binary(e);
      case ExprKind::kTernary:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value();
    }
    return Value();
  }

  Value eval_dict(const Expr& e) {
    Value d = Value::dict();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      const Value key = eval(*e.args[i]);
      if (!key.is_string())
        fail(e.args[i]->pos, "dict keys must be strings, got " + std::string(key.type_name()));
      d.set(key.as_string(), eval(*e.args[i + 1]));
    }
    return d;
  }

  static std::string describe(const Expr& e) {
    if (e.kind == ExprKind::kName) return "'" + e.name + "'";
    if (e.kind == ExprKind::kGetAttr) return describe(*e.args[0]) + "." + e.name;
    return "value";
  }

  static Value get_attr(const Value& obj, const std::string& name, const Expr& e) {
    if (obj.is_undefined())
      fail(e.pos, describe(*e.args[0]) + " is undefined (reading attribute '" + name + "')");
    const Value* v = obj.find(name);
    return v ? *v : Value();
  }

  static Value get_item(const Value& obj, const Value& key, const Expr& e) {
    if (obj.is_undefined()) fail(e.pos, describe(*e.args[0]) + " is undefined (reading an item)");
    if (obj.is_dict()) {
      const Value* v = key.is_string() ? obj.find(key.as_string()) : nullptr;
      return v ? *v : Value();
    }
    if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
      const ValueList items = obj.is_list() ? ValueList() : iterate(obj, e.pos);
      const ValueList& seq = obj.is_list() ? obj.items() : items;
      int64_t i = key.as_int();
      if (i < 0) i += static_cast<int64_t>(seq.size());
      if (i < 0 || i >= static_cast<int64_t>(seq.size())) return Value();
      return seq[static_cast<size_t>(i)];
    }
    return Value();
  }

  Value eval_slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    auto opt = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value(); };
    const Value start = opt(1), stop = opt(2), stride = opt(3);
    if (!obj.is_list() && !obj.is_string())
      fail(e.pos, "cannot slice " + std::string(obj.type_name()));
    const ValueList items = obj.is_list() ? obj.items() : iterate(obj, e.pos);
    ValueList out;
    for (size_t i : slice_indices(items.size(), start, stop, stride, e.pos))
      out.push_back(items[i]);
    if (obj.is_list()) return Value::list(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(std::move(s));
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    a.pos = e.pos;
    for (size_t i = first; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
    return a;
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    CallArgs a = eval_args(e, 1);
    if (callee.kind == ExprKind::kGetAttr) {
      const Value obj = eval(*callee.args[0]);
      if (std::optional<Value> r = call_method(obj, callee.name, a))
        return checked_size(std::move(*r), e.pos);
      const Value fn = get_attr(obj, callee.name, callee);
      if (fn.is_macro()) return call_macro(*fn.macro_node(), a);
      fail(e.pos, describe(callee) + " is not callable (no method '" + callee.name + "' on " +
                      std::string(obj.type_name()) + ")");
    }
    const Value fn = eval(callee);
    if (fn.is_macro()) return call_macro(*fn.macro_node(), a);
    if (fn.is_undefined() && callee.kind == ExprKind::kName) {
      if (std::optional<Value> r = call_global(callee.name, a)) return std::move(*r);
      fail(e.pos, "'" + callee.name + "' is undefined");
    }
    fail(e.pos, describe(callee) + " is not callable");
  }

  Value call_macro(const MacroNode& m, const CallArgs& a) {
    if (call_depth_ >= limits_.max_call_depth) {
      limit_error(a.pos,
                  "macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    }
    if (a.args.size() > m.params.size()) {
      fail(a.pos, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) +
                      " arguments, got " + std::to_string(a.args.size()));
    }
    Scope params;
    for (size_t i = 0; i < m.params.size(); ++i) {
      Value v = a.get(i, m.params[i]);
      if (i >= a.args.size() && a.kwarg(m.params[i]) == nullptr && m.defaults[i])
        v = eval(*m.defaults[i]);
      params[m.params[i]] = std::move(v);
    }
    // A macro sees the template's top-level variables and its parameters, not the caller's locals.
    std::vector<Scope> saved(std::make_move_iterator(scopes_.begin() + 1),
                             std::make_move_iterator(scopes_.end()));
    scopes_.resize(1);
    scopes_.push_back(std::move(params));
    ++call_depth_;
    std::string result = capture(m.body);
    --call_depth_;
    scopes_.resize(1);
    for (Scope& s : saved) scopes_.push_back(std::move(s));
    return Value(std::move(result));
  }

  Value eval_filter(const Expr& e) {
    const Value subject = eval(*e.args[0]);
    const CallArgs a = eval_args(e, 1);
    std::optional<Value> r = call_filter(e.name, subject, a);
    if (!r) fail(e.pos, "no filter named '" + e.name + "'");
    return checked_size(std::move(*r), e.pos);
  }

  Value eval_test(const Expr& e) {
    const Value subject = eval(*e.args[0]);
    const CallArgs a = eval_args(e, 1);
    std::optional<bool> r = call_test(e.name, subject, a);
    if (!r) fail(e.pos, "no test named '" + e.name + "'");
    return Value(*r != e.negated);
  }

  Value eval_unary(const Expr& e) {
    const Value v = eval(*e.args[0]);
    if (e.name == "not") return Value(!v.truthy());
    if (!v.is_number())
      fail(e.pos, "bad operand type for unary " + e.name + ": " + std::string(v.type_name()));
    if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
    return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and" || op == "or") {
      Value l = eval(*e.args[0]);
      if (l.truthy() == (op == "or")) return l;
      return eval(*e.args[1]);
    }
    const Value l = eval(*e.args[0]);
    const Value r = eval(*e.args[1]);
    if (op == "==") return Value(l.equals(r));
    if (op == "!=") return Value(!l.equals(r));
    if (op == "in" || op == "not in") return Value(contains(r, l, e.pos) == (op == "in"));
    if (op == "~") return checked_size(Value(l.str() + r.str()), e.pos);
    if (op == "<" || op == "<=" || op == ">" || op == ">=") return Value(compare(l, r, op, e.pos));
    return checked_size(arithmetic(l, r, op, e.pos), e.pos);
  }

  static bool contains(const Value& container, const Value& item, SourcePos pos) {
    if (container.is_string()) {
      if (!item.is_string()) fail(pos, "'in <string>' requires a string as left operand");
      return container.as_string().find(item.as_string()) != std::string::npos;
    }
    if (container.is_dict()) return item.is_string() && container.find(item.as_string()) != nullptr;
    if (container.is_list()) {
      for (const Value& x : container.items()) {
        if (x.equals(item)) return true;
      }
      return false;
    }
    if (container.is_undefined()) return false;
    fail(pos, "argument of type '" + std::string(container.type_name()) + "' is not iterable");
  }

  static bool compare(const Value& l, const Value& r, const std::string& op, SourcePos pos) {
    int c = 0;
    if (l.is_number() && r.is_number()) {
      c = l.as_float() < r.as_float() ? -1 : l.as_float() > r.as_float() ? 1 : 0;
      if (!l.is_float() && !r.is_float())
        c = l.as_int() < r.as_int() ? -1 : l.as_int() > r.as_int() ? 1 : 0;
    } else if (l.is_string() && r.is_string()) {
      c = l.as_string().compare(r.as_string());
    } else {
      fail(pos, "'" + op + "' not supported between " + std::string(l.type_name()) + " and " +
                    std::string(r.type_name()));
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value arithmetic(const Value& l, const Value& r, const std::string& op, SourcePos pos) const;

  const Value& globals_;
  const RenderLimits& limits_;
  std::vector<Scope> scopes_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

Value repeat(const Value& seq, int64_t times, size_t max_size, SourcePos pos) {
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.items().size();
  const size_t n = times > 0 ? static_cast<size_t>(times) : 0;
  if (unit != 0 && n > max_size / unit)
    limit_error(pos, "repetition builds a value over the size limit");
  if (seq.is_string()) {
    std::string out;
    for (size_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  ValueList out;
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out));
}

Value int_arithmetic(int64_t a, int64_t b, const std::string& op, SourcePos pos) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") overflow = __builtin_add_overflow(a, b, &r);
  if (op == "-") overflow = __builtin_sub_overflow(a, b, &r);
  if (op == "*") overflow = __builtin_mul_overflow(a, b, &r);
  if (op == "//" || op == "%") {
    if (b == 0) fail(pos, "integer division or modulo by zero");
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
    if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
    r = 1;
    for (int64_t i = 0; i < b && !overflow; ++i) overflow = __builtin_mul_overflow(r, a, &r);
  }
  if (overflow) fail(pos, "integer overflow in '" + op + "'");
  return Value(r);
}

Value Renderer::arithmetic(const Value& l, const Value& r, const std::string& op,
                           SourcePos pos) const {
  if (op == "+" && l.is_string() && r.is_string()) return Value(l.as_string() + r.as_string());
  if (op == "+" && l.is_list() && r.is_list()) {
    ValueList out = l.items();
    out.insert(out.end(), r.items().begin(), r.items().end());
    return Value::list(std::move(out));
  }
  if (op == "*" && (l.is_string() || l.is_list()) && (r.is_int() || r.is_bool())) {
    return repeat(l, r.as_int(), limits_.max_output_bytes, pos);
  }
  if (op == "*" && (r.is_string() || r.is_list()) && (l.is_int() || l.is_bool())) {
    return repeat(r, l.as_int(), limits_.max_output_bytes, pos);
  }
  if (!l.is_number() || !r.is_number()) {
    fail(pos, "unsupported operand types for " + op + ": " + std::string(l.type_name()) + " and " +
                  std::string(r.type_name()));
  }
  if (op == "/") {
    if (r.as_float() == 0.0) fail(pos, "division by zero");
    return Value(l.as_float() / r.as_float());
  }
  if (!l.is_float() && !r.is_float()) return int_arithmetic(l.as_int(), r.as_int(), op, pos);
  const double a = l.as_float(), b = r.as_float();
  if (op == "+") return Value(a + b);
  if (op == "-") return Value(a - b);
  if (op == "*") return Value(a * b);
  if (op == "**") return Value(std::pow(a, b));
  if (b == 0.0) fail(pos, "float division or modulo by zero");
  if (op == "//") return Value(std::floor(a / b));
  const double m = std::fmod(a, b);
  return Value(m != 0.0 && ((m < 0) != (b < 0)) ? m + b : m);
}

std::string where(SourcePos pos) {
  return "line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

}  // namespace

Result<Template> Template::parse(std::string source) {
  try {
    auto program = std::make_shared<Program>();
    program->body = parse_tokens(tokenize(source));
    return Template(std::move(program));
  } catch (const TemplateError& e) {
    return invalid_argument("template syntax error at ", where(e.pos()), ": ", e.message());
  } catch (const std::bad_alloc&) {
    return resource_exhausted("out of memory while parsing a template");
  } catch (const std::exception& e) {  // a bug in the interpreter, kept inside the module
    return internal_error("template parser failed: ", e.what());
  }
}

Result<std::string> Template::render(const Value& globals, const RenderLimits& limits) const {
  try {
    Renderer renderer(globals, limits);
    return renderer.render(program_->body);
  } catch (const TemplateError& e) {
    switch (e.kind()) {
      case TemplateError::Kind::kRaised: return invalid_argument(e.message());
      case TemplateError::Kind::kLimit:  // the request can never render: 400, not a retry
        return invalid_argument("template resource limit at ", where(e.pos()), ": ",
                                e.message());
      case TemplateError::Kind::kSyntax:
      case TemplateError::Kind::kRuntime:
        return invalid_argument("template error at ", where(e.pos()), ": ", e.message());
    }
    return internal_error("unreachable");
  } catch (const std::bad_alloc&) {
    return invalid_argument("template resource limit: out of memory while rendering");
  } catch (const std::exception& e) {  // a bug in the interpreter, kept inside the module
    return internal_error("template renderer failed: ", e.what());
  }
}

}  // namespace arbor::chat::jinja
