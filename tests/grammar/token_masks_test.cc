// Token masks against brute force: at every state a seeded random walk reaches, the mask equals
// the set of tokens GrammarState::allows() (which runs each token's bytes through the matcher),
// for vocabularies built to stress the precomputation (tokens that cross rule ends, share
// prefixes, split UTF-8 characters).
#include "grammar/token_masks.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/automaton.h"

namespace arbor::grammar {
namespace {

// A vocabulary of every string of length 1..3 over `alphabet`, plus some longer ones, plus two
// end ids and a control token (empty bytes).
std::shared_ptr<const TokenVocabulary> make_vocab(const std::string& alphabet,
                                                  const std::vector<std::string>& extra) {
  std::vector<std::string> bytes = {"", "", ""};  // 0: control, 1 and 2: end ids
  std::vector<std::string> level = {""};
  for (int len = 1; len <= 3; ++len) {
    std::vector<std::string> next;
    for (const std::string& p : level) {
      for (char c : alphabet) next.push_back(p + c);
    }
    bytes.insert(bytes.end(), next.begin(), next.end());
    level = std::move(next);
  }
  bytes.insert(bytes.end(), extra.begin(), extra.end());
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int32_t>{2, 1});
}

std::shared_ptr<CompiledGrammar> compile_for(std::string_view gbnf,
                                             std::shared_ptr<const TokenVocabulary> vocab) {
  auto a = compile_gbnf(gbnf);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return std::make_shared<CompiledGrammar>(std::make_shared<const Automaton>(std::move(*a)),
                                           std::move(vocab));
}

// Walks `steps` random allowed tokens (restarting when the grammar ends), checking the mask
// against brute force at every state; rolls back now and then to revisit states.
void check_random_walk(std::shared_ptr<CompiledGrammar> grammar, uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  GrammarState state(grammar);
  const int32_t vocab = grammar->vocab().size();
  for (int step = 0; step < steps; ++step) {
    const TokenBitmask mask = state.mask();
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab; ++t) {
      const bool brute = state.allows(t);
      ASSERT_EQ(mask.test(t), brute) << "seed " << seed << " step " << step << " token " << t
                                     << " '" << grammar->vocab().bytes(t) << "'";
      if (brute) allowed.push_back(t);
    }
    ASSERT_FALSE(allowed.empty()) << "seed " << seed << " step " << step << ": dead end";
    if (state.ended() || (state.num_accepted() > 0 && rng() % 8 == 0)) {
      state.rollback(std::min<size_t>(state.num_accepted(), 1 + rng() % 3));
      continue;
    }
    const int32_t t = allowed[rng() % allowed.size()];
    ASSERT_TRUE(state.accept(t));
  }
}

TEST(TokenMasks, EqualBruteForceOnJsonLikeGrammar) {
  const std::string gbnf = R"g(root ::= obj
obj ::= "{" ( pair ( "," pair )* )? "}"
pair ::= str ":" value
value ::= str | num | obj | "[" ( value ( "," value )* )? "]" | "true"
str ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\""
num ::= "-"? [0-9]+)g";
  auto vocab =
      make_vocab("{}[]\":,1a-\\", {"\":\"", "\"},{\"", "true", "tr", "\":1}", "],\"a\":"});
  auto grammar = compile_for(gbnf, vocab);
  for (uint64_t seed = 1; seed <= 6; ++seed) check_random_walk(grammar, seed, 150);
  EXPECT_GT(grammar->stats().cache_hits, 0);
  EXPECT_GT(grammar->stats().uncertain_checked, 0);
}

TEST(TokenMasks, EqualBruteForceWithNullableRulesAndNesting) {
  const std::string gbnf = R"g(root ::= ws item ( ws "," ws item )* ws
ws ::= " "{0,2}
item ::= "(" root? ")" | [ab] x
x ::= "" | "b" x)g";
  auto vocab = make_vocab(" (),ab", {" ( ", "b)", "),(", "bb,", "a ,", ")  "});
  auto grammar = compile_for(gbnf, vocab);
  for (uint64_t seed = 1; seed <= 6; ++seed) check_random_walk(grammar, seed, 150);
}

TEST(TokenMasks, UnicodeTokensSplittingCharacters) {
  // "é" is C3 A9 and "€" E2 82 AC; tokens hold whole, partial and straddling pieces.
  auto vocab = make_vocab("a\"",
                          {"\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC\"", "\xA9\xE2",
                           "\xE2\x82\xAC", "\x82", "\xFF"});
  auto grammar = compile_for(R"g(root ::= "\"" [^"a]* "\"")g", vocab);
  for (uint64_t seed = 1; seed <= 4; ++seed) check_random_walk(grammar, seed, 100);
}

TEST(TokenMasks, EndIdsOnlyWhenTheRootCanComplete) {
  auto vocab = make_vocab("ab", {});
  auto grammar = compile_for(R"g(root ::= "a" "b"?)g", vocab);
  GrammarState state(grammar);
  EXPECT_FALSE(state.mask().test(1));
  EXPECT_FALSE(state.accept(1));
  ASSERT_TRUE(state.accept(3));  // "a"
  EXPECT_TRUE(state.mask().test(1) && state.mask().test(2));
  ASSERT_TRUE(state.accept(4));  // "b": nothing can follow but an end id
  TokenBitmask only_end(vocab->size());
  only_end.set(1);
  only_end.set(2);
  EXPECT_EQ(state.mask().count(), 2);
  EXPECT_TRUE(state.mask().test(1) && state.mask().test(2));
  ASSERT_TRUE(state.accept(2));
  EXPECT_TRUE(state.ended());
  EXPECT_FALSE(state.accept(3));
  EXPECT_EQ(state.mask().count(), 2);
  state.rollback(2);
  EXPECT_FALSE(state.ended());
  EXPECT_TRUE(state.mask().test(4));
}

TEST(TokenMasks, ApplyMaskSetsMinusInfinityOutsideTheMask) {
  TokenBitmask mask(70);
  mask.set(0);
  mask.set(64);
  mask.set(69);
  std::vector<float> logits(70, 1.5f);
  apply_mask(mask, logits);
  for (int i = 0; i < 70; ++i) {
    if (i == 0 || i == 64 || i == 69) {
      EXPECT_EQ(logits[i], 1.5f);
    } else {
      EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0) << i;
    }
  }
}

}  // namespace
}  // namespace arbor::grammar
