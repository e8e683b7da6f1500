#include "chat/jinja.h"

#include <algorithm>
#include <exception>
#include <new>
#include <unordered_map>

#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"

namespace arbor::chat::jinja {

struct Program {
  Body body;
};

using Scope = std::unordered_map<std::string, Value>;

// The scopes (below the top level) that were open where a macro was defined: the macro reads
// their variables when it runs, as a Python closure does (late binding). Weak, so that a macro
// stored in the scope it captures does not keep that scope alive after the render.
struct MacroClosure {
  std::vector<std::weak_ptr<Scope>> scopes;
};

namespace {

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

[[noreturn]] void limit_error(SourcePos pos, std::string message) {
  throw TemplateError(TemplateError::Kind::kLimit, pos, std::move(message));
}

class Renderer {
 public:
  Renderer(const Value& globals, const RenderLimits& limits, const RenderEnvironment& env)
      : globals_(globals), limits_(limits), env_(env) {
    push_scope();
  }

  std::string render(const Body& body) {
    std::string out;
    out_ = &out;
    if (render_body(body) != Flow::kNormal)
      fail(SourcePos{}, "'break' or 'continue' outside of a loop");
    return out;
  }

 private:
  void push_scope() { scopes_.push_back(std::make_shared<Scope>()); }
  // The open scopes below the top level, for a macro defined here.
  std::shared_ptr<const MacroClosure> closure() const {
    if (scopes_.size() == 1) return nullptr;
    auto c = std::make_shared<MacroClosure>();
    for (size_t i = 1; i < scopes_.size(); ++i) c->scopes.push_back(scopes_[i]);
    return c;
  }
  Scope& top() { return *scopes_.back(); }

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
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    if (const Value* g = globals_.find(std::string_view(name))) return *g;
    return is_global_function(name) ? Value::callable(name) : Value();
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
        top()[s.macro->name] = Value::macro(s.macro.get(), closure());
        return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return render_body(s.body);
      case StmtKind::kFilterBlock: {
        Value saved = std::move(block_text_);
        block_text_ = Value(capture(s.body));
        const Value filtered = eval(*s.expr);
        block_text_ = std::move(saved);
        emit(filtered.str(), s.pos);
        return Flow::kNormal;
      }
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
    const ValueList items = iterate(v, pos);
    if (items.size() != targets.size()) {
      fail(pos, "ValueError: cannot unpack " + std::to_string(items.size()) + " values into " +
                    std::to_string(targets.size()) + " variables");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = items[i];
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
        push_scope();
        bind_targets(top(), s.targets, item, s.pos);
        const bool keep = eval(*s.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      step(s.pos);
      push_scope();
      bind_targets(top(), s.targets, items[i], s.pos);
      top()["loop"] = loop_value(items, i);
      const Flow f = render_body(s.body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    if (items.empty()) return render_body(s.else_body);
    return Flow::kNormal;
  }

  void assign(const Stmt& s, Value v) {
    if (s.attr.empty()) {
      bind_targets(top(), s.targets, v, s.pos);
      return;
    }
    const Value ns = lookup(s.targets[0]);
    if (!ns.is_namespace()) {
      fail(s.pos, "TemplateRuntimeError: cannot assign attribute '" + s.attr + "' on " +
                      std::string(ns.type_name()) + " '" + s.targets[0] +
                      "': only namespace() objects allow it");
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
      case ExprKind::kGetAttr: return attribute(eval(*e.args[0]), e);
      case ExprKind::kGetItem: return item(eval(*e.args[0]), eval(*e.args[1]), e);
      case ExprKind::kSlice: return eval_slice(e);
      case ExprKind::kCall: return eval_call(e);
      case ExprKind::kFilter: return eval_filter(e);
      case ExprKind::kTest: return eval_test(e);
      case ExprKind::kUnary: return eval_unary(e);
      case ExprKind::kBinary: return eval_binary(e);
      case ExprKind::kTernary:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      case ExprKind::kBlockText: return block_text_;
    }
    return Value();
  }

  Value eval_dict(const Expr& e) {
    Value d = Value::dict();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      const Value key = eval(*e.args[i]);
      if (key.is_list() && !key.is_tuple())
        fail(e.args[i]->pos, "TypeError: unhashable type: 'list'");
      if (key.is_dict()) fail(e.args[i]->pos, "TypeError: unhashable type: 'dict'");
      d.set_key(key, eval(*e.args[i + 1]));
    }
    return d;
  }

  static std::string describe(const Expr& e) {
    if (e.kind == ExprKind::kName) return "'" + e.name + "'";
    if (e.kind == ExprKind::kGetAttr) return describe(*e.args[0]) + "." + e.name;
    return "value";
  }

  // `obj.name`: Jinja2's getattr (a method first, then the key), failing on undefined.
  static Value attribute(const Value& obj, const Expr& e) {
    if (obj.is_undefined()) {
      fail(e.pos, "UndefinedError: " + describe(*e.args[0]) + " is undefined (reading attribute '" +
                      e.name + "')");
    }
    return get_attr(obj, e.name, e.pos);
  }

  // `obj[key]`: Jinja2's getitem (the item first, then the attribute), failing on undefined.
  static Value item(const Value& obj, const Value& key, const Expr& e) {
    if (obj.is_undefined()) {
      fail(e.pos, "UndefinedError: " + describe(*e.args[0]) + " is undefined (reading an item)");
    }
    return get_item(obj, key, e.pos);
  }

  Value eval_slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    auto opt = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value(); };
    const Value start = opt(1), stop = opt(2), stride = opt(3);
    if (obj.is_undefined())
      fail(e.pos, "UndefinedError: " + describe(*e.args[0]) + " is undefined");
    if (obj.is_dict()) fail(e.pos, "TypeError: unhashable type: 'slice'");
    if ((!obj.is_list() && !obj.is_string()) || obj.is_iterator()) return Value();
    const ValueList items = obj.is_list() ? obj.items() : iterate(obj, e.pos);
    ValueList out;
    for (size_t i : slice_indices(items.size(), start, stop, stride, e.pos))
      out.push_back(items[i]);
    if (obj.is_tuple()) return Value::tuple(std::move(out));
    if (obj.is_list()) return Value::list(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return obj.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
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
    const Value fn = eval(callee);
    CallArgs a = eval_args(e, 1);
    switch (fn.kind()) {
      case Value::Kind::kMacro: return call_macro(*fn.macro_node(), fn.macro_closure(), a);
      case Value::Kind::kCallable:
        if (!fn.bound_self().is_undefined())
          return checked_size(call_method(fn.bound_self(), fn.callable_name(), a), e.pos);
        return call_global(fn.callable_name(), a, env_);
      case Value::Kind::kUndefined:
        fail(e.pos, "UndefinedError: " + describe(callee) + " is undefined");
      default:
        fail(e.pos, "TypeError: '" + std::string(fn.type_name()) + "' object is not callable");
    }
  }

  Value call_macro(const MacroNode& m, const MacroClosure* fn_closure, const CallArgs& a) {
    if (call_depth_ >= limits_.max_call_depth) {
      limit_error(a.pos,
                  "macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    }
    if (a.args.size() > m.params.size()) {
      fail(a.pos, "TypeError: macro '" + m.name + "' takes not more than " +
                      std::to_string(m.params.size()) + " argument(s)");
    }
    for (const auto& [k, v] : a.kwargs) {
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
        fail(a.pos, "TypeError: macro '" + m.name + "' takes no keyword argument '" + k + "'");
    }
    // A macro sees the top level, the scopes it was defined in and its parameters, not the
    // caller's locals; defaults are evaluated in that scope, after the parameters before them.
    std::vector<std::shared_ptr<Scope>> saved = std::move(scopes_);
    scopes_ = {saved.front()};
    if (const MacroClosure* c = fn_closure) {
      for (const std::weak_ptr<Scope>& w : c->scopes) {
        if (std::shared_ptr<Scope> open = w.lock()) scopes_.push_back(std::move(open));
      }
    }
    push_scope();
    for (size_t i = 0; i < m.params.size(); ++i) {
      const bool given = i < a.args.size() || a.kwarg(m.params[i]) != nullptr;
      top()[m.params[i]] = given           ? a.get(i, m.params[i])
                           : m.defaults[i] ? eval(*m.defaults[i])
                                           : Value();
    }
    ++call_depth_;
    std::string result = capture(m.body);
    --call_depth_;
    scopes_ = std::move(saved);
    return Value(std::move(result));
  }

  Value eval_filter(const Expr& e) {
    const Value subject = eval(*e.args[0]);
    const CallArgs a = eval_args(e, 1);
    std::optional<Value> r = call_filter(e.name, subject, a);
    if (!r) fail(e.pos, "TemplateRuntimeError: No filter named '" + e.name + "' found.");
    return checked_size(std::move(*r), e.pos);
  }

  Value eval_test(const Expr& e) {
    const Value subject = eval(*e.args[0]);
    const CallArgs a = eval_args(e, 1);
    std::optional<bool> r = call_test(e.name, subject, a);
    if (!r) fail(e.pos, "TemplateRuntimeError: No test named '" + e.name + "' found.");
    return Value(*r != e.negated);
  }

  Value eval_unary(const Expr& e) {
    const Value v = eval(*e.args[0]);
    if (e.name == "not") return Value(!v.truthy());
    if (v.is_undefined()) fail(e.pos, "UndefinedError: unary " + e.name + " of an undefined value");
    if (!v.is_number()) {
      fail(e.pos, "TypeError: bad operand type for unary " + e.name + ": '" +
                      std::string(v.type_name()) + "'");
    }
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
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      if (l.is_undefined() || r.is_undefined())
        fail(e.pos, "UndefinedError: an undefined value compared with '" + op + "'");
      const int c = compare_values(l, r, e.pos);
      return Value(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    return checked_size(binary_op(op, l, r, limits_.max_output_bytes, e.pos), e.pos);
  }

  const Value& globals_;
  const RenderLimits& limits_;
  const RenderEnvironment& env_;
  std::vector<std::shared_ptr<Scope>> scopes_;  // [0] is the template's top level
  std::string* out_ = nullptr;
  Value block_text_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

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

Result<std::string> Template::render(const Value& globals, const RenderLimits& limits,
                                     const RenderEnvironment& env) const {
  try {
    Renderer renderer(globals, limits, env);
    return renderer.render(program_->body);
  } catch (const TemplateError& e) {
    switch (e.kind()) {
      case TemplateError::Kind::kRaised: return invalid_argument(e.message());
      case TemplateError::Kind::kLimit:  // the request can never render: 400, not a retry
        return invalid_argument("template resource limit at ", where(e.pos()), ": ", e.message());
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
