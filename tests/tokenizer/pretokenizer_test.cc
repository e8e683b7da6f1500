// RegexSplitter and the pattern rewriting it does (internal API).
#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

namespace arbor::tokenizer::internal {
namespace {

const std::string kW =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

TEST(SpellOutWhiteSpace, ReplacesBackslashSInAndOutsideClasses) {
  EXPECT_EQ(spell_out_white_space("\\s+(?!\\S)"), "[" + kW + "]+(?![^" + kW + "])");
  EXPECT_EQ(spell_out_white_space("[^\\s\\p{L}\\p{N}]+"), "[^" + kW + "\\p{L}\\p{N}]+");
  // ']' first in a class is a member; an escaped backslash before 's' is not \s.
  EXPECT_EQ(spell_out_white_space("[]\\s]x[^]a]\\s"), "[]" + kW + "]x[^]a][" + kW + "]");
  EXPECT_EQ(spell_out_white_space("\\\\s\\d\\[\\s"), "\\\\s\\d\\[[" + kW + "]");
}

std::vector<std::string> pieces(const std::vector<std::string>& patterns, std::string_view text) {
  auto splitter = RegexSplitter::create(patterns);
  EXPECT_TRUE(splitter.ok()) << splitter.status().to_string();
  std::vector<std::string> out;
  for (const Span& s : splitter->split(text)) out.emplace_back(text.substr(s.first, s.second - s.first));
  return out;
}

// U+180E (MONGOLIAN VOWEL SEPARATOR) is a format character for llama.cpp: it joins the space
// before it like punctuation. PCRE2's own \s would make it white space: " ", "\u180E", "x".
TEST(RegexSplitter, MongolianVowelSeparatorIsNotWhiteSpace) {
  const auto gpt2 = bpe_pre_tokenizer("gpt-2")->patterns;
  EXPECT_EQ(pieces(gpt2, " \xe1\xa0\x8ex"), (std::vector<std::string>{" \xe1\xa0\x8e", "x"}));
  // U+3000 and U+00A0 still are.
  EXPECT_EQ(pieces(gpt2, "a \xe3\x80\x80 b"),
            (std::vector<std::string>{"a", " \xe3\x80\x80", " b"}));
  EXPECT_EQ(pieces(gpt2, "a\xc2\xa0\xc2\xa0"), (std::vector<std::string>{"a", "\xc2\xa0\xc2\xa0"}));
}

}  // namespace
}  // namespace arbor::tokenizer::internal
