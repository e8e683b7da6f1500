// Test-only whole-string matchers built on PCRE2: a regex as is, or a GBNF grammar translated
// into one PCRE2 pattern (each rule a named group in a (?(DEFINE)...) block, rule references
// recursive calls), so tests can check which strings a grammar accepts without arbor's grammar
// engine.
//
// The GBNF subset understood is what src/grammar's converters write: rules `name ::= body` one
// per line, # comments, literals "..." and classes [...] / [^...] with the escapes \n \r \t
// \\ \" \] \- \^ \xHH \uHHHH \UHHHHHHHH, `.`, groups, |, and the quantifiers * + ? {m} {m,}
// {m,n}.
// The translation is literal, so it inherits PCRE2's backtracking: keep test inputs short.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::test {

class FullMatcher {
 public:
  // A PCRE2 pattern, compiled with UTF and DOLLAR_ENDONLY, matched against the whole text.
  static Result<FullMatcher> from_regex(std::string_view pattern);
  // The same with ECMAScript's \uHHHH and \u{H...} escapes (PCRE2 ALT_BSUX and
  // EXTRA_ALT_BSUX; \x then takes exactly two hex digits): for JSON Schema patterns and for
  // reference patterns in the converter tests.
  static Result<FullMatcher> from_ecmascript_regex(std::string_view pattern);
  // A GBNF grammar; the start rule is `root`.
  static Result<FullMatcher> from_gbnf_grammar(std::string_view grammar);
  // One GBNF expression without rule references.
  static Result<FullMatcher> from_gbnf_expression(std::string_view expression);

  // Whether the whole `text` (UTF-8) matches. A PCRE2 error (e.g. its match limit) is a test
  // failure (ADD_FAILURE naming the pattern and text) and returns false.
  bool matches(std::string_view text) const;

  // The PCRE2 pattern (translated, for GBNF).
  const std::string& pattern() const { return pattern_; }

 private:
  static Result<FullMatcher> compile(std::string_view pattern, bool ecmascript);

  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

// The PCRE2 translation of a GBNF grammar or expression (exposed for test messages).
Result<std::string> gbnf_grammar_to_pcre(std::string_view grammar);
Result<std::string> gbnf_expression_to_pcre(std::string_view expression);

}  // namespace arbor::test
