// regex_to_gbnf and choice_to_gbnf: exact grammar text, exact errors, and a cross-check of the
// produced GBNF (translated back to PCRE2 by tests/support/gbnf_matcher) against PCRE2 running
// the original pattern, over every short string of a small alphabet.
#include "grammar/regex_to_gbnf.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/choice_to_gbnf.h"
#include "support/gbnf_matcher.h"

namespace arbor::grammar {
namespace {

using test::FullMatcher;

std::string expr_of(std::string_view pattern, RegexTarget target = RegexTarget::kText) {
  RegexGbnfOptions options;
  options.target = target;
  Result<std::string> r = regex_to_gbnf_expression(pattern, options);
  return r.ok() ? *r : "ERROR " + r.status().to_string();
}

std::string error_of(std::string_view pattern) {
  Result<std::string> r = regex_to_gbnf_expression(pattern);
  EXPECT_FALSE(r.ok()) << pattern << " gave " << (r.ok() ? *r : "");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

// Every string over `alphabet` (code points given as UTF-8 pieces) of length <= max_len.
std::vector<std::string> all_strings(const std::vector<std::string>& alphabet, size_t max_len) {
  std::vector<std::string> out = {""};
  std::vector<std::string> frontier = {""};
  for (size_t len = 1; len <= max_len; ++len) {
    std::vector<std::string> next;
    for (const std::string& s : frontier) {
      for (const std::string& c : alphabet) next.push_back(s + c);
    }
    out.insert(out.end(), next.begin(), next.end());
    frontier = std::move(next);
  }
  return out;
}

// The GBNF for `pattern` accepts exactly the strings PCRE2 fully matches with `pattern`.
void expect_same_language(const std::string& pattern, const std::vector<std::string>& strings) {
  Result<std::string> expr = regex_to_gbnf_expression(pattern);
  ASSERT_TRUE(expr.ok()) << pattern << ": " << expr.status().to_string();
  Result<FullMatcher> gbnf = FullMatcher::from_gbnf_expression(*expr);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
  Result<FullMatcher> reference = FullMatcher::from_ecmascript_regex(pattern);
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  // The whole grammar, where costly repeated atoms are rules of their own.
  Result<std::string> grammar = regex_to_gbnf(pattern);
  ASSERT_TRUE(grammar.ok());
  Result<FullMatcher> gbnf_rules = FullMatcher::from_gbnf_grammar(*grammar);
  ASSERT_TRUE(gbnf_rules.ok()) << gbnf_rules.status().to_string();
  int num_matches = 0;
  for (const std::string& s : strings) {
    const bool want = reference->matches(s);
    num_matches += want;
    ASSERT_EQ(gbnf->matches(s), want)
        << "pattern " << pattern << " gbnf " << *expr << " text '" << s << "'";
    ASSERT_EQ(gbnf_rules->matches(s), want)
        << "pattern " << pattern << " grammar " << *grammar << " text '" << s << "'";
  }
  // Guards the test itself: a pattern that matches nothing proves little.
  EXPECT_GT(num_matches, 0) << pattern;
}

TEST(RegexToGbnf, ExactGrammarText) {
  EXPECT_EQ(*regex_to_gbnf("abc"), "root ::= \"abc\"\n");
  EXPECT_EQ(*regex_to_gbnf("^[a-z]+@(x|y)\\.com$"),
            "root ::= [a-z]+ \"@\" ( \"x\" | \"y\" ) \".com\"\n");
  EXPECT_EQ(*regex_to_gbnf("yes|no"), "root ::= \"yes\" | \"no\"\n");
  EXPECT_EQ(*regex_to_gbnf(""), "root ::= \"\"\n");
  EXPECT_EQ(expr_of("yes|no"), "( \"yes\" | \"no\" )");
  EXPECT_EQ(expr_of("\\d{3}-\\d{4}"), "[0-9]{3} \"-\" [0-9]{4}");
  EXPECT_EQ(expr_of("a|b|"), "( \"a\" | \"b\" )?");
  EXPECT_EQ(expr_of("(ab)*c?"), "\"ab\"* \"c\"?");
  EXPECT_EQ(expr_of("[^\"\\\\]"), "[^\"\\\\]");
  EXPECT_EQ(expr_of("."), "[^\\n]");
  EXPECT_EQ(expr_of("(a|)+b"), "( \"a\"? )+ \"b\"");
  EXPECT_EQ(expr_of("a{0}b"), "\"b\"");
  EXPECT_EQ(expr_of("[]a-]"), "[\\-\\]a]");
  EXPECT_EQ(expr_of("\\w\\W\\s\\S"), "[0-9A-Z_a-z] [^0-9A-Z_a-z] [\\t-\\r ] [^\\t-\\r ]");
  EXPECT_EQ(expr_of("\xC3\xA9+"), "\"\\u00E9\"+");
  EXPECT_EQ(expr_of("\\u{1F600}|\\U0001F600\\x41"), "( \"\\U0001F600\" | \"\\U0001F600A\" )");
  EXPECT_EQ(expr_of("\\v\\f\\0"), "\"\\x0B\\x0C\\x00\"");
  EXPECT_EQ(expr_of("a{"), "\"a{\"");
  EXPECT_EQ(expr_of("a{1,"), "\"a{1,\"");
  EXPECT_EQ(expr_of("a+?b??c{2,3}?"), "\"a\"+ \"b\"? \"c\"{2,3}");
  EXPECT_EQ(expr_of("(?P<x>a)(?<y>b)(?:c)"), "\"a\" \"b\" \"c\"");
}

TEST(RegexToGbnf, CostlyRepeatedAtomsBecomeRules) {
  EXPECT_EQ(*regex_to_gbnf("[^a]{2,3}x(ab|c){2}(d){3}\xC3\xA9{2}[a-z]{2}[^a]{4}(ab|c)*"),
            "root ::= repeat-1{2,3} \"x\" repeat-2{2} \"d\"{3} \"\\u00E9\"{2} [a-z]{2} "
            "repeat-1{4} ( \"ab\" | \"c\" )*\n"
            "repeat-1 ::= [^a]\n"
            "repeat-2 ::= \"ab\" | \"c\"\n");
  // Without define_rule, the same pattern stays one expression.
  EXPECT_EQ(expr_of("[^a]{2,3}(ab|c){2}"), "[^a]{2,3} ( \"ab\" | \"c\" ){2}");
  std::vector<std::string> bodies;
  RegexGbnfOptions options;
  options.target = RegexTarget::kJsonStringContent;
  options.define_rule = [&](const std::string& body) {
    bodies.push_back(body);
    return "r" + std::to_string(bodies.size());
  };
  EXPECT_EQ(*regex_to_gbnf_expression("[a-z\"]{3}[a-z]{3}", options), "r1{3} [a-z]{3}");
  EXPECT_EQ(bodies, std::vector<std::string>({"[a-z] | \"\\\\\\\"\""}));
}

TEST(RegexToGbnf, LargeCountsSplitIntoBlocksOfAThousand) {
  EXPECT_EQ(expr_of("x{1000}"), "\"x\"{1000}");
  EXPECT_EQ(expr_of("x{3000}"), "( \"x\"{1000} ){3}");
  EXPECT_EQ(expr_of("x{2,1500}"), "\"x\"{2} ( \"x\"{0,999} | ( \"x\"{1000} ) \"x\"{0,498} )");
  EXPECT_EQ(expr_of("x{0,2999}"), "( \"x\"{1000} ){0,2} \"x\"{0,999}");
  EXPECT_EQ(expr_of("x{1001,}"), "\"x\"{1000} \"x\" \"x\"*");
}

TEST(RegexToGbnf, JsonStringContentEscapesWhatJsonMustEscape) {
  constexpr RegexTarget kJson = RegexTarget::kJsonStringContent;
  EXPECT_EQ(expr_of("a\"b", kJson), "\"a\\\\\\\"b\"");
  EXPECT_EQ(expr_of("[a\"]", kJson), "( \"a\" | \"\\\\\\\"\" )");
  EXPECT_EQ(expr_of("\\n\\x01\\\\", kJson), "\"\\\\n\\\\u0001\\\\\\\\\"");
  EXPECT_EQ(expr_of("[\\x00-\\x1f]", kJson),
            "( \"\\\\b\" | \"\\\\t\" | \"\\\\n\" | \"\\\\f\" | \"\\\\r\" | \"\\\\u00\" ( \"0\" "
            "[0-7bef] | \"1\" [0-9a-f] ) )");
  EXPECT_EQ(expr_of("[\\x01\\x02]", kJson), "\"\\\\u00\" \"0\" [12]");
  EXPECT_EQ(expr_of("[a-c]+", kJson), "[a-c]+");
}

TEST(RegexToGbnf, ErrorsNameTheConstructAndByteOffset) {
  EXPECT_EQ(error_of("(?=a)"), "unsupported regex construct: lookahead at offset 0");
  EXPECT_EQ(error_of("a(?!b)"), "unsupported regex construct: lookahead at offset 1");
  EXPECT_EQ(error_of("\xC3\xA9(?<=a)"), "unsupported regex construct: lookbehind at offset 2");
  EXPECT_EQ(error_of("a\\1"), "unsupported regex construct: backreference at offset 1");
  EXPECT_EQ(error_of("(?P<n>a)(?P=n)"), "unsupported regex construct: backreference at offset 8");
  EXPECT_EQ(error_of("\\k<n>"), "unsupported regex construct: backreference at offset 0");
  EXPECT_EQ(error_of("(?>a)"), "unsupported regex construct: atomic group at offset 0");
  EXPECT_EQ(error_of("(?i)a"),
            "unsupported regex construct: inline flags or '(?' extension at offset 0");
  EXPECT_EQ(error_of("a*+"), "unsupported regex construct: possessive quantifier at offset 2");
  EXPECT_EQ(error_of("a{,3}"),
            "unsupported regex construct: '{,n}' quantifier (Python reads {0,n}, ECMAScript "
            "literal text) at offset 1");
  EXPECT_EQ(error_of("a^b"),
            "unsupported regex construct: '^' anywhere but the start of the pattern at offset 1");
  EXPECT_EQ(error_of("(^a)"),
            "unsupported regex construct: '^' anywhere but the start of the pattern at offset 1");
  EXPECT_EQ(error_of("a$b"),
            "unsupported regex construct: '$' anywhere but the end of the pattern at offset 1");
  EXPECT_EQ(error_of("\\bfoo"), "unsupported regex construct: word boundary '\\b' at offset 0");
  EXPECT_EQ(error_of("a\\Z"), "unsupported regex construct: assertion '\\Z' at offset 1");
  EXPECT_EQ(error_of("\\p{L}"), "unsupported regex construct: Unicode property escape at offset 0");
  EXPECT_EQ(error_of("[[:alpha:]]"),
            "unsupported regex construct: POSIX character class at offset 1");
  EXPECT_EQ(error_of("a{2000000}"),
            "unsupported regex construct: repetition count above 1000000 at offset 1");
  EXPECT_EQ(error_of("(a"), "invalid regex: missing ')' for the group opened at offset 0");
  EXPECT_EQ(error_of("a)"), "invalid regex: unbalanced ')' at offset 1");
  EXPECT_EQ(error_of("x[a"),
            "invalid regex: missing ']' for the character class opened at offset 1");
  EXPECT_EQ(error_of("[]"),
            "invalid regex: missing ']' for the character class opened at offset 0");
  EXPECT_EQ(error_of("*a"), "invalid regex: quantifier with nothing to repeat at offset 0");
  EXPECT_EQ(error_of("a|{2}"), "invalid regex: quantifier with nothing to repeat at offset 2");
  EXPECT_EQ(error_of("a**"), "invalid regex: multiple repeat at offset 2");
  EXPECT_EQ(error_of("[z-a]"), "invalid regex: character range out of order at offset 2");
  EXPECT_EQ(error_of("[a-\\d]"), "invalid regex: bad character range at offset 2");
  EXPECT_EQ(error_of("[^\\s\\S]"),
            "invalid regex: character class that matches nothing at offset 0");
  EXPECT_EQ(error_of("\\q"), "invalid regex: unknown escape '\\q' at offset 0");
  EXPECT_EQ(error_of("\\x4"), "invalid regex: escape needs 2 hex digits at offset 0");
  EXPECT_EQ(error_of("\\uD800"),
            "invalid regex: escape outside the Unicode scalar values at offset 0");
  EXPECT_EQ(error_of("a{5,2}"),
            "invalid regex: quantifier minimum greater than maximum at offset 1");
  EXPECT_EQ(error_of("ab\\"), "invalid regex: pattern ends with a backslash at offset 2");
  EXPECT_EQ(error_of("(?<1a>x)"), "invalid regex: bad group name at offset 0");
  EXPECT_EQ(error_of("a\xFF"), "invalid regex: the pattern is not valid UTF-8");
}

struct SameLanguageCase {
  std::string pattern;
  std::vector<std::string> alphabet;
  size_t max_len;
};

TEST(RegexToGbnf, SameLanguageAsPcre2OnEveryShortString) {
  const std::vector<SameLanguageCase> cases = {
      {"abc", {"a", "b", "c"}, 4},
      {"a|b|", {"a", "b", "c"}, 3},
      {"(ab)*c?", {"a", "b", "c"}, 6},
      {"[a-c]+x", {"a", "c", "d", "x"}, 5},
      {"[^a]b", {"a", "b", "\n", "\xC3\xA9"}, 3},
      {".a.", {"a", "\n", "\xC3\xA9", "\x01"}, 4},
      {"a{2,4}b{0,1}", {"a", "b"}, 7},
      {"(a|bc){1,3}d?", {"a", "b", "c", "d"}, 6},
      {"\\d{2}-\\d", {"1", "9", "-", "a"}, 5},
      {"\\w+\\s\\W", {"a", "_", " ", "-", "\t", "\v"}, 4},
      {"[\\d.]+", {"1", ".", "a"}, 5},
      {"(?:x|y)z", {"x", "y", "z"}, 3},
      {"(?P<n>a)b", {"a", "b"}, 3},
      {"[]a]+", {"]", "a", "b"}, 4},
      {"[a-]b", {"a", "-", "b"}, 3},
      {"x{2}y{0,1}z{1,}", {"x", "y", "z"}, 6},
      {"a+?b*?", {"a", "b"}, 5},
      {"^(a|b)$", {"a", "b"}, 3},
      {"^a|b$", {"a", "b"}, 3},
      {"\\xC3\\xA9|\xC3\xA9[\xC3\xA0-\xC3\xAF]",
       {"\xC3\xA9", "\xC3\xA0", "\xC3\xAF", "\xC3\xB0", "\xC3\x83"}, 3},
      {"\\u0041\\x42[\\u0043-\\u0045]", {"A", "B", "C", "E", "F"}, 4},
      {"a\\.b\\/c", {"a", ".", "b", "/", "c", "x"}, 5},
      {"[^\\d\\s]+", {"1", " ", "a", "\n", "\xC3\xA9"}, 4},
      {"(a|)+b", {"a", "b"}, 5},
      {"(a{1,2}){2}", {"a", "b"}, 6},
      {"[\\-\\]]\\{x\\}", {"-", "]", "{", "x", "}"}, 4},
      {"a{", {"a", "{"}, 3},
      {"(a|b)*abb", {"a", "b"}, 7},
      {"((a|b)(c|))+", {"a", "b", "c"}, 5},
      // (\v is left out: PCRE2 reads it as "vertical whitespace", Python and ECMAScript as U+000B.)
      {"[\\b\\t]\\f\\r\\n\\0", {"\b", "\t", "\f", "\r", "\n", std::string(1, '\0')}, 5},
  };
  for (const SameLanguageCase& c : cases) {
    SCOPED_TRACE(c.pattern);
    expect_same_language(c.pattern, all_strings(c.alphabet, c.max_len));
  }
}

// Random patterns over a tiny alphabet, each compared with PCRE2 on all strings up to length 5.
class RandomRegex {
 public:
  explicit RandomRegex(uint32_t seed) : rng_(seed) {}

  std::string alternation(int depth) {
    std::string out = sequence(depth);
    while (pick(4) == 0) out += "|" + sequence(depth);
    return out;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  std::string sequence(int depth) {
    std::string out;
    const int n = 1 + pick(3);
    for (int i = 0; i < n; ++i) out += quantified(depth);
    return out;
  }

  std::string quantified(int depth) {
    std::string out = atom(depth);
    static const char* const kQuantifiers[] = {"", "", "", "*", "+", "?", "{2}", "{0,2}",
                                               "{1,}", "{1,3}", "*?", "{0}"};
    return out + kQuantifiers[pick(12)];
  }

  std::string atom(int depth) {
    static const char* const kAtoms[] = {"a", "b", "1", ".", "[ab]", "[^a]", "\\d", "\\w",
                                         "[a-b1]", "\\s", "[^\\d]", "\\n"};
    if (depth < 3 && pick(5) == 0) {
      return (pick(2) == 0 ? "(" : "(?:") + alternation(depth + 1) + ")";
    }
    return kAtoms[pick(12)];
  }

  std::mt19937 rng_;
};

TEST(RegexToGbnf, RandomPatternsMatchPcre2) {
  const std::vector<std::string> strings = all_strings({"a", "b", "1", "\n", " "}, 5);
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    const std::string pattern = RandomRegex(seed).alternation(0);
    SCOPED_TRACE("seed " + std::to_string(seed) + " pattern " + pattern);
    Result<std::string> expr = regex_to_gbnf_expression(pattern);
    ASSERT_TRUE(expr.ok()) << expr.status().to_string();
    Result<FullMatcher> gbnf = FullMatcher::from_gbnf_expression(*expr);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
    Result<FullMatcher> with_rules = FullMatcher::from_gbnf_grammar(*regex_to_gbnf(pattern));
    ASSERT_TRUE(with_rules.ok()) << with_rules.status().to_string();
    Result<FullMatcher> reference = FullMatcher::from_regex(pattern);
    ASSERT_TRUE(reference.ok()) << reference.status().to_string();
    for (const std::string& s : strings) {
      const bool want = reference->matches(s);
      ASSERT_EQ(gbnf->matches(s), want) << "gbnf " << *expr << " text '" << s << "'";
      ASSERT_EQ(with_rules->matches(s), want) << "grammar " << *regex_to_gbnf(pattern) << " text '"
                                              << s << "'";
    }
  }
}

TEST(ChoiceToGbnf, OneLiteralPerChoice) {
  EXPECT_EQ(*choice_to_gbnf({"yes", "no"}), "root ::= \"yes\" | \"no\"\n");
  EXPECT_EQ(*choice_to_gbnf({"a\"b", "c\\d", "\n", "\xC3\xA9", ""}),
            "root ::= \"a\\\"b\" | \"c\\\\d\" | \"\\n\" | \"\\u00E9\" | \"\"\n");
  EXPECT_EQ(*choice_to_gbnf({"x", "y", "x"}), "root ::= \"x\" | \"y\"\n");
}

TEST(ChoiceToGbnf, AcceptsExactlyTheChoices) {
  Result<std::string> g = choice_to_gbnf({"red", "green", "re\"d\\"});
  ASSERT_TRUE(g.ok());
  Result<FullMatcher> m = FullMatcher::from_gbnf_grammar(*g);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->matches("red"));
  EXPECT_TRUE(m->matches("green"));
  EXPECT_TRUE(m->matches("re\"d\\"));
  EXPECT_FALSE(m->matches("re"));
  EXPECT_FALSE(m->matches("redgreen"));
  EXPECT_FALSE(m->matches(""));
}

TEST(ChoiceToGbnf, Errors) {
  EXPECT_EQ(choice_to_gbnf({}).status().message(), "guided choice list is empty");
  EXPECT_EQ(choice_to_gbnf({"ok", "bad\xFF"}).status().message(),
            "guided choice 1 is not valid UTF-8");
}

}  // namespace
}  // namespace arbor::grammar
