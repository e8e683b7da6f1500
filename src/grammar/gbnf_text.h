// Building blocks for writing GBNF grammar text: UTF-8 decoding, quoted literals, character
// classes over code-point sets, and bounded repetition.
//
// The dialect is llama.cpp's GBNF as arbor's grammar parser accepts it: literals and classes are
// sequences/sets of Unicode code points; escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH denote
// code points; inside a class \] \- \^ are literal; quantifier counts are at most 1000.
// Everything this file writes is pure ASCII: code points >= U+0080 are written as \u / \U
// escapes, so the grammar text never depends on the reader's encoding.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"  // CodepointRange, kMaxCodepoint, kMaxRepeat, append_utf8

namespace arbor::grammar {

// The largest count GBNF accepts inside {m,n}.
inline constexpr uint64_t kMaxGbnfRepeat = kMaxRepeat;

// The code points of `utf8`, or nullopt when it is not valid UTF-8 (truncated or overlong
// sequences, surrogates, values above U+10FFFF).
std::optional<std::u32string> decode_utf8(std::string_view utf8);

// A quoted GBNF literal that matches exactly the code points of `text`: "ab\"c".
// An empty `text` gives "" (which matches the empty string).
std::string gbnf_literal(std::u32string_view text);
// The same for ASCII text (CHECKs that every byte is < 0x80).
std::string gbnf_literal_ascii(std::string_view text);

// A set of code points kept as sorted, disjoint, non-adjacent inclusive ranges.
class CodepointSet {
 public:
  CodepointSet() = default;
  static CodepointSet single(char32_t cp) { return range(cp, cp); }
  static CodepointSet range(char32_t lo, char32_t hi);

  // Precondition: lo <= hi <= kMaxCodepoint. O(number of ranges).
  void add(char32_t lo, char32_t hi);
  void add(const CodepointSet& other);
  // Every code point in [0, kMaxCodepoint] not in this set.
  CodepointSet complement() const;
  // This set without the code points of `other`.
  CodepointSet minus(const CodepointSet& other) const;

  bool empty() const { return ranges_.empty(); }
  bool contains(char32_t cp) const;
  bool is_single() const { return ranges_.size() == 1 && ranges_[0].lo == ranges_[0].hi; }
  bool is_full() const;
  const std::vector<CodepointRange>& ranges() const { return ranges_; }

 private:
  std::vector<CodepointRange> ranges_;
};

// GBNF for one code point of `set`: a literal for a single code point, `.` for the full set, a
// negated class [^...] when the set contains U+10FFFF (it is then the complement of a small set),
// else a class [...]. Precondition: !set.empty().
std::string gbnf_char_class(const CodepointSet& set);

// GBNF for `atom` repeated between `min` and `max` times (`max` nullopt: unbounded). `atom` must
// be a single GBNF atom (a literal, class, rule name or parenthesised group) without quantifier.
// Counts above 1000 are split into nested repetitions of 1000-blocks, so the result keeps every
// count within GBNF's limit and stays unambiguous up to a bounded look-ahead. Returns "" when
// max == 0 (the caller drops the term). kInvalidArgument when min or max exceeds 1,000,000 or
// min > max.
Result<std::string> gbnf_repeat(std::string_view atom, uint64_t min, std::optional<uint64_t> max);

// `alternatives` joined by " | ", wrapped in parentheses when there is more than one.
// Precondition: non-empty.
std::string gbnf_group(const std::vector<std::string>& alternatives);

// `parts` joined by single spaces, skipping empty parts.
std::string gbnf_sequence(const std::vector<std::string>& parts);

// When `expr` is exactly one parenthesised group "( ... )" (nothing after the closing
// parenthesis), its contents; else `expr`. Used to keep rule bodies free of redundant parentheses.
std::string gbnf_strip_outer_group(const std::string& expr);

// Whether `s` is a valid GBNF rule name ([a-zA-Z0-9_-]+).
bool is_gbnf_rule_name(std::string_view s);

}  // namespace arbor::grammar
