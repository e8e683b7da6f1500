// Recursive-descent parser for the Jinja subset. Operator precedence follows Jinja2's parser:
// ternary < or < and < not < comparison/in < + - < ~ < * / // % < ** < unary - + < filter/test
// < postfix (. [] ()).
#include <initializer_list>

#include "chat/jinja_ast.h"

namespace arbor::chat::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_all() {
    std::string stopped;
    return parse_body({}, &stopped);
  }

 private:
  struct DepthGuard {
    DepthGuard(Parser& p, SourcePos pos) : p_(p) {
      if (++p_.depth_ > kMaxNestingDepth) {
        p_.error(pos,
                 "template nesting is deeper than " + std::to_string(kMaxNestingDepth) + " levels");
      }
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  [[noreturn]] void error(SourcePos pos, std::string message) const {
    throw TemplateError(TemplateError::Kind::kSyntax, pos, std::move(message));
  }

  const Token& peek(size_t ahead = 0) const {
    const size_t i = pos_ + ahead;
    return i < t_.size() ? t_[i] : t_.back();
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < t_.size() - 1) ++pos_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokKind::kOp && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokKind::kName && peek(ahead).text == name;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokKind::kEof: return "end of template";
      case TokKind::kText: return "template text";
      case TokKind::kString: return "string literal";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!is_op(op))
      error(peek().pos, "expected '" + std::string(op) + "', got " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().kind != TokKind::kName)
      error(peek().pos, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_block_end(std::string_view tag) {
    if (peek().kind != TokKind::kBlockEnd) {
      error(peek().pos,
            "expected '%}' to close '" + std::string(tag) + "', got " + describe(peek()));
    }
    next();
  }

  static ExprPtr make(ExprKind kind, SourcePos pos, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) const {
    auto e = make(ExprKind::kBinary, l->pos, std::move(op));
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return sized(std::move(e));
  }
  // Records the height of `e` and rejects trees deeper than kMaxExprDepth: operator chains
  // (`a + a + ...`, `x.a.a...`) are built by loops, not recursion, so the guard alone misses them.
  ExprPtr sized(ExprPtr e) const {
    int d = 0;
    for (const auto& a : e->args) d = a && a->depth > d ? a->depth : d;
    for (const auto& [k, a] : e->kwargs) d = a->depth > d ? a->depth : d;
    e->depth = d + 1;
    if (e->depth > kMaxExprDepth) {
      error(e->pos,
            "expression nesting is deeper than " + std::to_string(kMaxExprDepth) + " levels");
    }
    return e;
  }

  // ---- statements ----

  // Parses until `{% <stop> ...` for one of `stops` (consumes `{%` and the stop name) or the end.
  Body parse_body(std::initializer_list<std::string_view> stops, std::string* stopped_at) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokKind::kEof) {
        if (stops.size() == 0) return body;
        error(t.pos, "unexpected end of template, expected '{% " + std::string(*(stops.end() - 1)) +
                         " %}'");
      }
      if (t.kind == TokKind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->pos = t.pos;
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokKind::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->pos = next().pos;
        s->expr = parse_expression();
        if (peek().kind != TokKind::kVarEnd)
          error(peek().pos, "expected '}}', got " + describe(peek()));
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokKind::kBlockBegin) {
        for (std::string_view stop : stops) {
          if (is_name(stop, 1)) {
            next();
            *stopped_at = next().text;
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        error(t.pos, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const SourcePos pos = next().pos;  // {%
    DepthGuard guard(*this, pos);
    if (peek().kind != TokKind::kName)
      error(peek().pos, "expected a tag name after '{%', got " + describe(peek()));
    const std::string tag = next().text;
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    if (tag == "if") {
      parse_if(*s);
    } else if (tag == "for") {
      parse_for(*s);
    } else if (tag == "set") {
      parse_set(*s);
    } else if (tag == "macro") {
      parse_macro(*s);
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      expect_block_end(tag);
    } else if (tag == "filter") {
      parse_filter_block(*s);
    } else if (tag == "generation") {
      s->kind = StmtKind::kScope;
      expect_block_end(tag);
      std::string stopped;
      s->body = parse_body({"endgeneration"}, &stopped);
      expect_block_end(stopped);
    } else {
      error(pos, "unknown or unsupported tag '" + tag + "'");
    }
    return s;
  }

  void parse_if(Stmt& s) {
    s.kind = StmtKind::kIf;
    std::string stopped = "if";
    while (stopped == "if" || stopped == "elif") {
      ExprPtr cond = parse_expression();
      expect_block_end(stopped);
      Body body = parse_body({"elif", "else", "endif"}, &stopped);
      s.branches.emplace_back(std::move(cond), std::move(body));
    }
    if (stopped == "else") {
      expect_block_end("else");
      s.else_body = parse_body({"endif"}, &stopped);
    }
    expect_block_end("endif");
  }

  void parse_for(Stmt& s) {
    s.kind = StmtKind::kFor;
    s.targets.push_back(expect_name());
    while (is_op(",")) {
      next();
      s.targets.push_back(expect_name());
    }
    if (!is_name("in")) error(peek().pos, "expected 'in' in for loop, got " + describe(peek()));
    next();
    s.expr = parse_expression(/*allow_ternary=*/false);
    if (is_name("if")) {
      next();
      s.filter = parse_expression();
    }
    if (is_name("recursive")) error(peek().pos, "recursive for loops are not supported");
    expect_block_end("for");
    std::string stopped;
    s.body = parse_body({"else", "endfor"}, &stopped);
    if (stopped == "else") {
      expect_block_end("else");
      s.else_body = parse_body({"endfor"}, &stopped);
    }
    expect_block_end("endfor");
  }

  void parse_set(Stmt& s) {
    s.kind = StmtKind::kSet;
    s.targets.push_back(expect_name());
    if (is_op(".")) {
      next();
      s.attr = expect_name();
    }
    while (is_op(",") && s.attr.empty()) {
      next();
      s.targets.push_back(expect_name());
    }
    if (is_op("=")) {
      next();
      s.expr = parse_tuple_or_expression();
      expect_block_end("set");
      return;
    }
    if (s.targets.size() != 1 || !s.attr.empty())
      error(peek().pos, "expected '=' in set, got " + describe(peek()));
    s.kind = StmtKind::kSetBlock;
    expect_block_end("set");
    std::string stopped;
    s.body = parse_body({"endset"}, &stopped);
    expect_block_end("endset");
  }

  // {% filter name(args) | name2 %}: a chain of filters applied to the rendered body.
  void parse_filter_block(Stmt& s) {
    s.kind = StmtKind::kFilterBlock;
    ExprPtr e = make(ExprKind::kBlockText, s.pos);
    do {
      if (is_op("|")) next();
      auto f = make(ExprKind::kFilter, peek().pos);
      f->name = expect_name();
      f->args.push_back(std::move(e));
      if (is_op("(")) parse_call_args(*f);
      e = sized(std::move(f));
    } while (is_op("|"));
    s.expr = std::move(e);
    expect_block_end("filter");
    std::string stopped;
    s.body = parse_body({"endfilter"}, &stopped);
    expect_block_end("endfilter");
  }

  void parse_macro(Stmt& s) {
    s.kind = StmtKind::kMacro;
    s.macro = std::make_unique<MacroNode>();
    s.macro->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      s.macro->params.push_back(expect_name());
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression();
      }
      s.macro->defaults.push_back(std::move(def));
      if (!is_op(")")) expect_op(",");
    }
    next();
    expect_block_end("macro");
    std::string stopped;
    s.macro->body = parse_body({"endmacro"}, &stopped);
    expect_block_end("endmacro");
  }

  // ---- expressions ----

  // `a, b` (as in `{% set x = a, b %}`) is a list; a single expression is itself.
  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto list = make(ExprKind::kList, first->pos, "tuple");
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (peek().kind == TokKind::kBlockEnd) break;
      list->args.push_back(parse_expression());
    }
    return list;
  }

  ExprPtr parse_expression(bool allow_ternary = true) {
    DepthGuard guard(*this, peek().pos);
    ExprPtr e = parse_or();
    while (allow_ternary && is_name("if")) {
      next();
      auto t = make(ExprKind::kTernary, e->pos);
      t->args.push_back(std::move(e));
      t->args.push_back(parse_or());
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = parse_expression();
      }
      t->args.push_back(std::move(otherwise));
      e = sized(std::move(t));
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      next();
      l = binary("or", std::move(l), parse_and());
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      next();
      l = binary("and", std::move(l), parse_not());
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const SourcePos pos = next().pos;
      DepthGuard guard(*this, pos);
      auto e = make(ExprKind::kUnary, pos, "not");
      e->args.push_back(parse_not());
      return sized(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr l = parse_math1();
    while (true) {
      std::string op;
      if (peek().kind == TokKind::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return l;
      }
      l = binary(op, std::move(l), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = binary(op, std::move(l), parse_concat());
    }
    return l;
  }

  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      next();
      l = binary("~", std::move(l), parse_math2());
    }
    return l;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      l = binary(op, std::move(l), parse_pow());
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary();
    while (is_op("**")) {
      next();
      l = binary("**", std::move(l), parse_unary());
    }
    return l;
  }

  // As in Jinja2, filters bind to the whole unary expression: `-x|abs` is `(-x)|abs`.
  ExprPtr parse_unary(bool with_filters = true) {
    DepthGuard guard(*this, peek().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(ExprKind::kUnary, t.pos, t.text);
      e->args.push_back(parse_unary(/*with_filters=*/false));
      e = sized(std::move(e));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filters ? parse_filters_and_tests(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokKind::kName: {
        next();
        auto e = make(ExprKind::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokKind::kString: {
        auto e = make(ExprKind::kLiteral, t.pos);
        std::string s;
        while (peek().kind == TokKind::kString) s += next().text;  // adjacent literals concatenate
        e->literal = Value(std::move(s));
        return e;
      }
      case TokKind::kInt:
      case TokKind::kFloat: {
        next();
        auto e = make(ExprKind::kLiteral, t.pos);
        e->literal = t.kind == TokKind::kInt ? Value(t.int_value) : Value(t.float_value);
        return e;
      }
      default: break;
    }
    if (is_op("(")) return parse_paren();
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    error(t.pos, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parse_paren() {
    const SourcePos pos = next().pos;
    if (is_op(")")) {
      next();
      return make(ExprKind::kList, pos, "tuple");
    }
    ExprPtr e = parse_expression();
    if (is_op(",")) {
      auto list = make(ExprKind::kList, pos, "tuple");
      list->args.push_back(std::move(e));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        list->args.push_back(parse_expression());
      }
      e = sized(std::move(list));
    }
    expect_op(")");
    return e;
  }

  ExprPtr parse_list() {
    auto e = make(ExprKind::kList, next().pos);
    while (!is_op("]")) {
      e->args.push_back(parse_expression());
      if (!is_op("]")) expect_op(",");
    }
    next();
    return sized(std::move(e));
  }

  ExprPtr parse_dict() {
    auto e = make(ExprKind::kDict, next().pos);
    while (!is_op("}")) {
      e->args.push_back(parse_expression());
      expect_op(":");
      e->args.push_back(parse_expression());
      if (!is_op("}")) expect_op(",");
    }
    next();
    return sized(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const SourcePos pos = next().pos;
        if (peek().kind == TokKind::kInt) {
          auto item = make(ExprKind::kGetItem, pos);
          auto index = make(ExprKind::kLiteral, pos);
          index->literal = Value(next().int_value);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(index));
          e = sized(std::move(item));
          continue;
        }
        auto attr = make(ExprKind::kGetAttr, pos, expect_name());
        attr->args.push_back(std::move(e));
        e = sized(std::move(attr));
      } else if (is_op("[")) {
        e = sized(parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        auto call = make(ExprKind::kCall, peek().pos);
        call->args.push_back(std::move(e));
        parse_call_args(*call);
        e = sized(std::move(call));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const SourcePos pos = next().pos;  // [
    ExprPtr first;
    if (!is_op(":")) first = parse_expression();
    if (is_op("]")) {
      next();
      auto item = make(ExprKind::kGetItem, pos);
      item->args.push_back(std::move(obj));
      item->args.push_back(std::move(first));
      return item;
    }
    auto slice = make(ExprKind::kSlice, pos);
    slice->args.push_back(std::move(obj));
    slice->args.push_back(std::move(first));
    expect_op(":");
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(":")) stop = parse_expression();
    if (is_op(":")) {
      next();
      if (!is_op("]")) step = parse_expression();
    }
    expect_op("]");
    slice->args.push_back(std::move(stop));
    slice->args.push_back(std::move(step));
    return slice;
  }

  // ( positional..., name=value... ); appends to e.args and e.kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == TokKind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) error(peek().pos, "positional argument follows keyword argument");
        e.args.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        auto f = make(ExprKind::kFilter, peek().pos);
        f->name = expect_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = sized(std::move(f));
      } else if (is_name("is")) {
        next();
        auto t = make(ExprKind::kTest, peek().pos);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (takes_bare_test_arg()) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = sized(std::move(t));
      } else {
        return e;
      }
    }
  }

  // `x is divisibleby 3`: Jinja takes one primary argument unless the next token ends the test.
  bool takes_bare_test_arg() const {
    const Token& t = peek();
    const bool starts = t.kind == TokKind::kName || t.kind == TokKind::kString ||
                        t.kind == TokKind::kInt || t.kind == TokKind::kFloat || is_op("[") ||
                        is_op("{");
    return starts && !is_name("else") && !is_name("or") && !is_name("and");
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_tokens(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace arbor::chat::jinja
