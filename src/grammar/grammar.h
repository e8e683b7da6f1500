// A context-free grammar over Unicode text, as written in GBNF (llama.cpp's grammar format),
// and its parser. Every structured-output request (JSON Schema, regex, choice, GBNF) becomes one
// of these before compile() turns it into a byte-level automaton (automaton.h).
//
// GBNF, as parse_gbnf() accepts it (llama.cpp's grammars/README.md):
//   rule      ::= name "::=" alternatives            one rule per line; newlines are allowed
//                                                      inside ( ) and after |
//   name      ::= [a-zA-Z0-9_-]+                       the start rule is `root`
//   atom      ::= "literal" | [class] | [^class] | . | name | ( alternatives )
//   postfix   ::= atom ( * | + | ? | {m} | {m,} | {m,n} )?     m, n <= kMaxRepeat
//   escapes   ::= \n \r \t \\ \" \' \[ \] \- \^ \/ \xHH \uHHHH \UHHHHHHHH (in literals and
//                 classes)
//   comments  ::= # to the end of the line
// Literals and classes are sequences of Unicode code points (UTF-8 in the grammar text); `.` is
// any code point. Surrogates (U+D800..U+DFFF) are never matched.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace arbor::grammar {

inline constexpr int32_t kMaxRepeat = 1000;
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

struct CodepointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;  // inclusive
};

struct Expr {
  enum class Kind : uint8_t {
    kEmpty,    // matches ""
    kLiteral,  // `literal`: UTF-8 bytes, matched exactly
    kClass,    // one code point in `ranges` (or, negated, outside them)
    kRule,     // rules[rule]
    kSeq,      // children in order
    kAlt,      // one of children
    kRepeat,   // children[0], between min and max times (max = -1: unbounded)
  };
  Kind kind = Kind::kEmpty;
  std::string literal;
  std::vector<CodepointRange> ranges;  // kClass: sorted, disjoint after normalise_class()
  bool negated = false;
  int32_t rule = -1;
  std::vector<Expr> children;
  int32_t min = 0;
  int32_t max = -1;
};

struct Rule {
  std::string name;
  Expr body;
};

struct Grammar {
  std::vector<Rule> rules;
  int32_t root = 0;  // index into rules
};

// Parses GBNF text. Errors name the line and column and what was expected ("line 3, column 7:
// expected '::=' after rule name 'value'"), undefined rules ("rule 'string' is used in rule
// 'value' but never defined"), rules defined twice, and a missing start rule.
Result<Grammar> parse_gbnf(std::string_view text, std::string_view root = "root");

// The code points of a class as sorted, disjoint, merged ranges (negation applied, surrogates
// removed). Empty when the class matches nothing.
std::vector<CodepointRange> normalise_class(const std::vector<CodepointRange>& ranges,
                                            bool negated);

// Appends the UTF-8 encoding of `cp` (<= kMaxCodepoint) to `out`.
void append_utf8(uint32_t cp, std::string& out);

}  // namespace arbor::grammar
