// The GBNF parser, the automaton and the matcher, against a naive reference matcher over the
// grammar's expressions (every string up to a length, exhaustively), plus the errors.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "grammar/automaton.h"
#include "grammar/matcher.h"

namespace arbor::grammar {
namespace {

// The end positions of every match of `e` starting at `pos` in `s` (naive, exponential, fine for
// the short strings used here). Left recursion is not supported (the grammars here have none).
std::set<size_t> ends(const Grammar& g, const Expr& e, const std::string& s, size_t pos,
                      int depth = 0) {
  if (depth > 64) return {};
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      return {pos};
    case Expr::Kind::kLiteral:
      if (s.compare(pos, e.literal.size(), e.literal) == 0) return {pos + e.literal.size()};
      return {};
    case Expr::Kind::kClass: {
      if (pos >= s.size()) return {};
      // Decode one UTF-8 code point.
      const auto b = static_cast<unsigned char>(s[pos]);
      const size_t len = b < 0x80         ? 1
                         : (b >> 5) == 6  ? 2
                         : (b >> 4) == 14 ? 3
                         : (b >> 3) == 30 ? 4
                                          : 0;
      if (len == 0 || pos + len > s.size()) return {};
      uint32_t cp = len == 1 ? b : b & (0x7F >> len);
      for (size_t i = 1; i < len; ++i) {
        const auto c = static_cast<unsigned char>(s[pos + i]);
        if ((c & 0xC0) != 0x80) return {};
        cp = (cp << 6) | (c & 0x3F);
      }
      // Overlong encodings are not UTF-8.
      const size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      if (want != len || (cp >= 0xD800 && cp <= 0xDFFF) || cp > kMaxCodepoint) return {};
      // Membership straight from the class as written (not normalise_class: it is under test).
      bool listed = false;
      for (const CodepointRange& r : e.ranges) listed = listed || (cp >= r.lo && cp <= r.hi);
      if (listed != e.negated) return {pos + len};
      return {};
    }
    case Expr::Kind::kRule:
      return ends(g, g.rules[static_cast<size_t>(e.rule)].body, s, pos, depth + 1);
    case Expr::Kind::kSeq: {
      std::set<size_t> cur = {pos};
      for (const Expr& c : e.children) {
        std::set<size_t> next;
        for (size_t p : cur) {
          for (size_t q : ends(g, c, s, p, depth + 1)) next.insert(q);
        }
        cur = std::move(next);
      }
      return cur;
    }
    case Expr::Kind::kAlt: {
      std::set<size_t> out;
      for (const Expr& c : e.children) {
        for (size_t q : ends(g, c, s, pos, depth + 1)) out.insert(q);
      }
      return out;
    }
    case Expr::Kind::kRepeat: {
      // Iterate past the point where a non-empty child could still advance.
      std::set<size_t> out, cur = {pos};
      if (e.min == 0) out.insert(pos);
      const int32_t limit = e.max >= 0 ? e.max : e.min + static_cast<int32_t>(s.size() - pos) + 1;
      for (int32_t i = 1; i <= limit && !cur.empty(); ++i) {
        std::set<size_t> next;
        for (size_t p : cur) {
          for (size_t q : ends(g, e.children[0], s, p, depth + 1)) next.insert(q);
        }
        if (i >= e.min) out.insert(next.begin(), next.end());
        cur = std::move(next);
      }
      return out;
    }
  }
  return {};
}

bool in_language(const Grammar& g, const std::string& s) {
  return ends(g, g.rules[static_cast<size_t>(g.root)].body, s, 0).contains(s.size());
}

// Every string over `alphabet` of length <= max_len: the matcher ends exactly on the strings of
// the language, and accepts exactly the prefixes of the language's strings up to max_len
// (prefix viability checked against the naive matcher on all extensions up to max_len).
void check_exhaustive(const std::string& gbnf, const std::string& alphabet, size_t max_len) {
  SCOPED_TRACE(gbnf);
  auto parsed = parse_gbnf(gbnf);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  auto compiled = compile(*parsed);
  ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
  auto automaton = std::make_shared<const Automaton>(std::move(*compiled));
  std::vector<std::string> all = {""};
  for (size_t len = 1; len <= max_len; ++len) {
    const size_t before = all.size();
    for (size_t i = 0; i < before; ++i) {
      if (all[i].size() != len - 1) continue;
      for (char c : alphabet) all.push_back(all[i] + c);
    }
  }
  std::set<std::string> members, viable;
  for (const std::string& s : all) {
    if (!in_language(*parsed, s)) continue;
    members.insert(s);
    for (size_t k = 0; k <= s.size(); ++k) viable.insert(s.substr(0, k));
  }
  int checked = 0;
  for (const std::string& s : all) {
    Matcher m(automaton);
    const bool accepted = m.accept(s);
    // Viability beyond max_len is unknown to the reference: only prefixes it proves viable must
    // be accepted, and accepted strings that end must be members.
    if (viable.contains(s)) {
      EXPECT_TRUE(accepted) << "viable prefix '" << s << "' rejected";
    }
    if (accepted) {
      EXPECT_EQ(m.can_end(), members.contains(s)) << "'" << s << "'";
      ++checked;
    } else {
      EXPECT_FALSE(members.contains(s)) << "member '" << s << "' rejected";
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Gbnf, ExhaustiveAgainstNaiveMatcher) {
  check_exhaustive(R"g(root ::= "ab" | "a" "c"*)g", "abc", 5);
  check_exhaustive(R"g(root ::= ("a" | "b")* "a" ("a" | "b"){2})g", "ab", 7);
  check_exhaustive(R"g(root ::= "(" root ")" | "x" | "")g", "()x", 7);
  check_exhaustive(R"g(root ::= item ("," item)*
item ::= [a-b]+ | "[" root? "]")g",
                   "ab,[]", 6);
  check_exhaustive(R"g(root ::= [^a]{1,3} "a"?)g", "abc", 5);
  check_exhaustive(R"g(root ::= x{2,} y
x ::= "a" | ""
y ::= "b" | x "c")g",
                   "abc", 5);
  check_exhaustive(R"g(root ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\"")g", "\"\\na", 6);
}

TEST(Gbnf, Utf8ClassesAcceptExactlyTheirCodePoints) {
  // Every 1..3-byte string over a byte alphabet that includes UTF-8 lead and continuation bytes.
  const std::string alphabet = {'a', '\xC3', '\xA9', '\xE2', '\x82', '\xAC', '\x80', '\xED'};
  check_exhaustive(R"g(root ::= [^a]+)g", alphabet, 4);
  check_exhaustive(R"g(root ::= [a\u00e9-\u20ac]*)g", alphabet, 4);
  check_exhaustive("root ::= .", alphabet, 3);
}

TEST(Gbnf, ParsesEscapesCommentsAndMultilineGroups) {
  auto g = parse_gbnf(
      "# a comment\n"
      "root ::= (\n"
      "  \"\\x41\\u00e9\\n\" | # inside\n"
      "  [\\]\\-] )\n");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto a = compile(*g);
  ASSERT_TRUE(a.ok());
  auto automaton = std::make_shared<const Automaton>(std::move(*a));
  for (std::string s : {std::string("A\xC3\xA9\n"), std::string("]"), std::string("-")}) {
    Matcher m(automaton);
    EXPECT_TRUE(m.accept(s) && m.can_end()) << s;
  }
  Matcher m(automaton);
  EXPECT_FALSE(m.accept("B"));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  auto expect_error = [](std::string_view text, std::string_view message) {
    auto a = compile_gbnf(text);
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_EQ(a.status().message(), message) << text;
  };
  expect_error("root ::= value", "grammar: rule 'value' is used in rule 'root' but never defined");
  expect_error("start ::= \"a\"", "grammar: no start rule 'root' (define `root ::= ...`)");
  expect_error("root ::= \"a\"\nroot ::= \"b\"",
               "grammar: line 2, column 10: rule 'root' is defined twice");
  expect_error("root \"a\"", "grammar: line 1, column 6: expected '::=' after rule name 'root'");
  expect_error("root ::= \"abc", "grammar: line 1, column 14: unterminated literal");
  expect_error("root ::= [a-", "grammar: line 1, column 13: unterminated character class");
  expect_error("root ::= \"a\"{3,2}", "grammar: line 1, column 17: {m,n} with n < m");
  expect_error("root ::= \"a\"{1001}", "grammar: line 1, column 17: repetition count above 1000");
  expect_error("root ::= (\"a\"", "grammar: line 1, column 14: expected ')'");
  expect_error("root ::= \"\\q\"", "grammar: line 1, column 12: unknown escape '\\q'");
  expect_error("root ::= root \"a\" | \"b\"",
               "grammar: rule 'root' is left-recursive (it can reach itself without matching a "
               "character); rewrite it with repetition, e.g. x ::= y (\",\" y)*");
  expect_error("root ::= x \"a\" | \"b\"\nx ::= \"\"? root",
               "grammar: rule 'root' is left-recursive (it can reach itself without matching a "
               "character); rewrite it with repetition, e.g. x ::= y (\",\" y)*");
  expect_error("root ::= \"a\" root",
               "grammar: rule 'root' can never complete (every "
               "alternative recurses forever)");
  expect_error("root ::= [ab]* \"a\" [ab]{15}",
               "grammar is too complex: its automaton has more than 20000 states");
}

TEST(Matcher, RollbackRestoresEarlierStates) {
  auto a = compile_gbnf(R"g(root ::= "{" ( "\"k\":" [0-9]+ )? "}")g");
  ASSERT_TRUE(a.ok());
  Matcher m(std::make_shared<const Automaton>(std::move(*a)));
  const auto key0 = m.state_key();
  ASSERT_TRUE(m.accept("{\"k"));
  const auto key1 = m.state_key();
  ASSERT_TRUE(m.accept("\":1"));
  EXPECT_FALSE(m.accept("x"));
  EXPECT_EQ(m.num_accepted(), 2u);
  ASSERT_TRUE(m.accept("2}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.can_continue());
  m.rollback(2);
  EXPECT_EQ(m.state_key(), key1);
  m.rollback(1);
  EXPECT_EQ(m.state_key(), key0);
  EXPECT_FALSE(m.accept("{}}"));
  EXPECT_TRUE(m.accept("{}"));
  EXPECT_TRUE(m.can_end());
}

TEST(Matcher, DeepRecursionSurvivesGarbageCollection) {
  auto a = compile_gbnf(R"g(root ::= "[" root? "]")g");
  ASSERT_TRUE(a.ok());
  Matcher m(std::make_shared<const Automaton>(std::move(*a)));
  // 2^18 frames trigger a collection; nesting 200000 deep creates more than that.
  constexpr int kDepth = 200000;
  for (int i = 0; i < kDepth; ++i) ASSERT_TRUE(m.accept("["));
  for (int i = 0; i < kDepth - 1; ++i) ASSERT_TRUE(m.accept("]"));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept("]"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accepts("]"));
  m.rollback(3);
  EXPECT_TRUE(m.accepts("]]]"));
  EXPECT_FALSE(m.accepts("]]]]"));
}

}  // namespace
}  // namespace arbor::grammar
