// Regular expression -> GBNF grammar text, for regex-guided decoding (vLLM's `guided_regex`,
// Outlines' regex) and for JSON Schema's `pattern`.
//
// The pattern must match the WHOLE output (Python's re.fullmatch): a leading `^` and a trailing
// `$` are accepted and ignored. Patterns are UTF-8 and match code points.
//
// Supported subset (Python / ECMAScript syntax, the constructs those users send):
//   * literals; `\` before any ASCII punctuation or space is that character;
//   * escapes \n \t \r \f \v \0 \xHH \uHHHH \u{H...} \UHHHHHHHH;
//   * . (any code point except \n, as in Python without DOTALL);
//   * \d [0-9], \w [A-Za-z0-9_], \s [ \t\n\r\f\v] and their negations \D \W \S; ASCII-only, as in
//     ECMAScript (Python's str patterns would also match non-ASCII digits and spaces);
//   * classes [...] and [^...] with ranges, escapes and \d \w \s \D \W \S inside; a `]` right
//     after `[` or `[^` is literal; \b inside a class is backspace;
//   * groups ( ), (?: ), named groups (?P<name> ) and (?<name> ) (as plain groups), alternation |;
//   * quantifiers * + ? {m} {m,} {m,n}, each optionally lazy (*? +? ?? {m,n}?: the same
//     language); counts up to 1,000,000; a `{` that does not start one of these forms is literal.
//   * `^` only at the start of a top-level alternative, `$` only at its end.
// Rejected with kInvalidArgument naming the construct and its byte offset: backreferences (\1,
// \k<..>, (?P=..)), lookahead/lookbehind, atomic groups, possessive quantifiers, inline flags,
// \b \B \A \Z \z \G outside classes, \p{..}, POSIX classes [[:alpha:]], `{,n}` (Python reads it
// as {0,n}, ECMAScript as literal text), `^`/`$` elsewhere, classes that match nothing, malformed
// syntax, invalid UTF-8.
//
// Pure functions; any thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::grammar {

enum class RegexTarget {
  // The grammar matches the text itself.
  kText,
  // The grammar matches the *contents* of a JSON string literal (without the quotes) whose
  // decoded value matches the pattern. Characters that JSON must escape are produced as escapes:
  // \" \\ \b \f \n \r \t, other controls as \u00xx (lowercase hex); everything else raw.
  kJsonStringContent,
};

struct RegexGbnfOptions {
  RegexTarget target = RegexTarget::kText;  // default: plain text
  // Default empty: everything inline. When set, an atom repeated a bounded number of times (2 or
  // more copies) that costs the automaton several states per code point (a group, a class with
  // members >= U+0080, a set that needs JSON escapes) goes into a rule of its own: this is called
  // with the rule's body and returns the rule's name (the caller defines the rule). A rule call
  // per copy keeps X{0,1000} at about 1000 automaton states instead of 1000 times the states of
  // X (for [^a]: 1021 instead of 19001).
  std::function<std::string(const std::string& body)> define_rule;
};

// A complete grammar: "root ::= <expression>\n", then the rules define_rule made, named
// repeat-1, repeat-2, ... (identical bodies share one rule).
Result<std::string> regex_to_gbnf(std::string_view pattern);

// A GBNF expression, safe to juxtapose with other terms inside a rule; it refers to no rules
// unless options.define_rule is set. The empty pattern gives "".
Result<std::string> regex_to_gbnf_expression(std::string_view pattern,
                                             const RegexGbnfOptions& options = {});

}  // namespace arbor::grammar
