// Internal to the Jinja interpreter: tokens, the syntax tree, and the error that unwinds a parse or
// a render. Nothing here is part of the public API (see jinja.h).
//
// Errors: the lexer, parser and evaluator are recursive and stop at the first error, so they throw
// TemplateError, and the two entry points in jinja.cc (Template::parse, Template::render) catch it
// and return a Status. No exception leaves this module.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace arbor::chat::jinja {

struct SourcePos {
  int line = 1;
  int column = 1;
};

class TemplateError {
 public:
  enum class Kind : uint8_t { kSyntax, kRuntime, kRaised, kLimit };
  TemplateError(Kind kind, SourcePos pos, std::string message)
      : kind_(kind), pos_(pos), message_(std::move(message)) {}
  Kind kind() const { return kind_; }
  SourcePos pos() const { return pos_; }
  const std::string& message() const { return message_; }

 private:
  Kind kind_;
  SourcePos pos_;
  std::string message_;
};

[[noreturn]] inline void fail(SourcePos pos, std::string message) {
  throw TemplateError(TemplateError::Kind::kRuntime, pos, std::move(message));
}

// ---- Tokens ----

enum class TokKind : uint8_t {
  kText,        // literal template text (whitespace control already applied)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOp,  // punctuation and operators: text holds it ("==", "(", "|", ...)
  kEof,
};

struct Token {
  TokKind kind = TokKind::kEof;
  std::string text;
  SourcePos pos;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Splits a template into tokens with Jinja2's whitespace rules as transformers configures them:
// trim_blocks and lstrip_blocks on, `-` and `+` modifiers on tags, \r\n and \r read as \n, one
// trailing newline of the source dropped (keep_trailing_newline=False). Throws TemplateError(kSyntax).
std::vector<Token> tokenize(std::string_view source);

// ---- Syntax tree ----

enum class ExprKind : uint8_t {
  kLiteral,    // literal
  kName,       // name
  kList,       // args: items; name "tuple" for (a, b)
  kDict,       // args: key, value, key, value, ...
  kGetAttr,    // args[0] . name
  kGetItem,    // args[0] [ args[1] ]
  kSlice,      // args[0] [ args[1] : args[2] : args[3] ], each bound may be null
  kCall,       // args[0] ( args[1..] , kwargs )
  kFilter,     // args[0] | name ( args[1..], kwargs )
  kTest,       // args[0] is [not] name ( args[1..] )
  kUnary,      // name (op) args[0]
  kBinary,     // args[0] name (op) args[1]
  kTernary,    // args[0] if args[1] else args[2] (args[2] may be null)
  kBlockText,  // the rendered body of the enclosing {% filter %} block
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  SourcePos pos;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
  int depth = 1;  // height of this subtree; bounded by kMaxExprDepth
};

enum class StmtKind : uint8_t {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches, else_body
  kFor,       // for targets in expr [if filter]: body [else: else_body]
  kSet,       // set targets = expr, or set targets[0].attr = expr
  kSetBlock,  // set targets[0] %} body {% endset
  kMacro,     // macro definition
  kBreak,
  kContinue,
  kScope,        // a block that only groups its body ({% generation %})
  kFilterBlock,  // {% filter f | g %} body {% endfilter %}: expr applies the filters to kBlockText
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroNode {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null when the param has none
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::unique_ptr<MacroNode> macro;
};

// Parses tokens into a statement list. Throws TemplateError(kSyntax). Nesting of expressions
// and blocks deeper than kMaxNestingDepth is a syntax error, which bounds the recursion of the
// parser and of the evaluator.
inline constexpr int kMaxNestingDepth = 128;
inline constexpr int kMaxExprDepth = 256;
Body parse_tokens(const std::vector<Token>& tokens);

}  // namespace arbor::chat::jinja
