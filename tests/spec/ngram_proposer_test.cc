#include "chain_drafts.h"
#include "spec/ngram_proposer.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "naive_reference.h"

namespace arbor::spec {
namespace {

using Tokens = std::vector<int32_t>;

Tokens propose_one(Proposer& p, RequestId id, const Tokens& tokens, int32_t max_num_tokens) {
  const DraftRequest r{id, tokens, 0, max_num_tokens};
  std::vector<Tokens> out;
  propose_chains(p, std::span<const DraftRequest>(&r, 1), out);
  EXPECT_EQ(out.size(), 1u);
  return out[0];
}

Tokens draft(const Tokens& tokens, NgramProposerOptions o, int32_t max_num_tokens = 100) {
  NgramProposer p(o);
  return propose_one(p, 1, tokens, max_num_tokens);
}

TEST(NgramProposer, ContinuesTheLongestMatch) {
  // A B C D X B C D E A B C: "A B C" ended at 3 -> D X B.
  const Tokens t{1, 2, 3, 4, 9, 2, 3, 4, 5, 1, 2, 3};
  EXPECT_EQ(draft(t, {.min_n = 2, .max_n = 3, .num_speculative_tokens = 3}), (Tokens{4, 9, 2}));
  // Only bigrams: "B C" ended last at 7 -> D E A.
  EXPECT_EQ(draft(t, {.min_n = 2, .max_n = 2, .num_speculative_tokens = 3}), (Tokens{4, 5, 1}));
}

TEST(NgramProposer, PrefersLongerNOverMoreRecent) {
  const Tokens t{5, 1, 2, 9, 3, 1, 2, 8, 5, 1, 2};
  EXPECT_EQ(draft(t, {.min_n = 2, .max_n = 3, .num_speculative_tokens = 3}), (Tokens{9, 3, 1}));
  EXPECT_EQ(draft(t, {.min_n = 2, .max_n = 2, .num_speculative_tokens = 3}), (Tokens{8, 5, 1}));
  EXPECT_EQ(draft(t, {.min_n = 1, .max_n = 1, .num_speculative_tokens = 3}), (Tokens{8, 5, 1}));
}

TEST(NgramProposer, PrefersTheMostRecentOccurrence) {
  const Tokens t{1, 2, 7, 1, 2, 8, 1, 2};
  EXPECT_EQ(draft(t, {.min_n = 2, .max_n = 2, .num_speculative_tokens = 3}), (Tokens{8, 1, 2}));
}

TEST(NgramProposer, OverlappingMatchRepeatsThePeriod) {
  EXPECT_EQ(draft({4, 4, 4, 4}, {.min_n = 2, .max_n = 3, .num_speculative_tokens = 5}),
            (Tokens{4, 4, 4, 4, 4}));
  EXPECT_EQ(draft({1, 2, 1, 2, 1}, {.min_n = 2, .max_n = 2, .num_speculative_tokens = 5}),
            (Tokens{2, 1, 2, 1, 2}));
  // The match may run into the final n-gram itself: "3 1 2 3 1 2" period 3.
  EXPECT_EQ(draft({3, 1, 2, 3, 1, 2}, {.min_n = 3, .max_n = 4, .num_speculative_tokens = 4}),
            (Tokens{3, 1, 2, 3}));
}

TEST(NgramProposer, NoMatchNoDraft) {
  EXPECT_TRUE(draft({1, 2, 3, 4}, {.min_n = 1, .max_n = 4}).empty());
  EXPECT_TRUE(draft({}, {.min_n = 1, .max_n = 4}).empty());
  EXPECT_TRUE(draft({5}, {.min_n = 1, .max_n = 4}).empty());
  // The final n-gram alone is not an earlier occurrence.
  EXPECT_TRUE(draft({1, 2}, {.min_n = 2, .max_n = 2}).empty());
}

TEST(NgramProposer, MinNAndMaxNBoundTheMatch) {
  const Tokens t{1, 2, 3, 1};
  EXPECT_TRUE(draft(t, {.min_n = 2, .max_n = 4, .num_speculative_tokens = 3}).empty());
  EXPECT_EQ(draft(t, {.min_n = 1, .max_n = 4, .num_speculative_tokens = 3}), (Tokens{2, 3, 1}));
}

TEST(NgramProposer, KAndMaxNumTokensCapTheDraft) {
  const Tokens t{1, 2, 3, 4, 5, 6, 1, 2};
  const NgramProposerOptions o{.min_n = 2, .max_n = 2, .num_speculative_tokens = 3};
  EXPECT_EQ(draft(t, o), (Tokens{3, 4, 5}));
  EXPECT_EQ(draft(t, o, 2), (Tokens{3, 4}));
  EXPECT_EQ(draft(t, o, 1), (Tokens{3}));
  // max_num_tokens 0: nothing, and no index is built.
  NgramProposer p(o);
  EXPECT_TRUE(propose_one(p, 9, t, 0).empty());
  EXPECT_EQ(p.num_requests(), 0);
  NgramProposer zero_k({.min_n = 2, .max_n = 2, .num_speculative_tokens = 0});
  EXPECT_TRUE(propose_one(zero_k, 9, t, 5).empty());
}

TEST(NgramProposer, BatchKeepsRequestsApartAndForgetResets) {
  NgramProposer p({.min_n = 2, .max_n = 2, .num_speculative_tokens = 2});
  const Tokens a{1, 2, 3, 1, 2};
  const Tokens b{7, 8, 9, 7, 8};
  const DraftRequest reqs[] = {{1, a, 2, 5}, {2, b, 2, 5}};
  std::vector<Tokens> out;
  propose_chains(p, reqs, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], (Tokens{3, 1}));
  EXPECT_EQ(out[1], (Tokens{9, 7}));
  EXPECT_EQ(p.num_requests(), 2);
  p.forget(1, a, 2);
  EXPECT_EQ(p.num_requests(), 1);
  // After forget the id starts over with any tokens.
  EXPECT_EQ(propose_one(p, 1, {4, 5, 6, 4, 5}, 5), (Tokens{6, 4}));
}

TEST(NgramProposer, ProposeCandidatesWrapsTheChain) {
  NgramProposer p({.min_n = 2, .max_n = 2, .num_speculative_tokens = 2});
  const Tokens t{1, 2, 3, 1, 2};
  std::vector<DraftCandidate> c;
  p.candidates({1, t, 0, 5}, 4, c);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].token_ids, (Tokens{3, 1}));
  EXPECT_EQ(c[0].score, 2.0);
}

// Token trees: one candidate per match length, distinct continuations only, longest first.
TEST(NgramProposer, CandidatesOnePerMatchLengthLongestFirst) {
  // 5 1 2 9 3 1 2 8 5 1 2: "5 1 2" -> 9 3; "1 2" (latest) -> 8 5; "2" (latest) -> 8 5 (same).
  const Tokens t{5, 1, 2, 9, 3, 1, 2, 8, 5, 1, 2};
  NgramProposer p({.min_n = 1, .max_n = 3, .num_speculative_tokens = 2});
  std::vector<DraftCandidate> c;
  p.candidates({1, t, 0, 5}, 4, c);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].token_ids, (Tokens{9, 3}));
  EXPECT_EQ(c[0].score, 3.0);
  EXPECT_EQ(c[1].token_ids, (Tokens{8, 5}));
  EXPECT_EQ(c[1].score, 2.0);
  EXPECT_EQ(c[0].token_ids, propose_one(p, 1, t, 5)) << "the first candidate is the chain";
  p.candidates({1, t, 0, 5}, 1, c);
  EXPECT_EQ(c.size(), 1u) << "max_branches caps the candidates";
  p.candidates({1, t, 0, 0}, 4, c);
  EXPECT_TRUE(c.empty()) << "max_num_tokens 0 proposes nothing";
}

// Fed one token per call or the whole sequence at once, the proposals are the same.
TEST(NgramProposer, IncrementalEqualsFromScratch) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const NgramProposerOptions o{.min_n = 1 + static_cast<int32_t>(rng() % 2),
                                 .max_n = 2 + static_cast<int32_t>(rng() % 3),
                                 .num_speculative_tokens = 1 + static_cast<int32_t>(rng() % 6)};
    NgramProposer incremental(o);
    Tokens t;
    for (int step = 0; step < 60; ++step) {
      t.push_back(static_cast<int32_t>(rng() % 3));
      NgramProposer scratch(o);
      ASSERT_EQ(propose_one(incremental, 5, t, 8), propose_one(scratch, 5, t, 8))
          << "step " << step;
    }
  }
}

// Random sequences over a tiny vocabulary, several tokens appended per step, against the
// brute-force scan.
TEST(NgramProposer, MatchesNaiveReferenceOnRandomSequences) {
  int64_t num_nonempty = 0;
  for (uint32_t seed = 1; seed <= 3000; ++seed) {
    std::mt19937 rng(seed);
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 4);
    const int32_t min_n = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t max_n = min_n + static_cast<int32_t>(rng() % 4);
    const int32_t k = static_cast<int32_t>(rng() % 7);
    NgramProposer p({.min_n = min_n, .max_n = max_n, .num_speculative_tokens = k});
    Tokens t;
    for (int step = 0; step < 12; ++step) {
      const int32_t add = static_cast<int32_t>(rng() % 4);
      for (int32_t i = 0; i < add; ++i) t.push_back(static_cast<int32_t>(rng() % vocab));
      const int32_t max_num_tokens = static_cast<int32_t>(rng() % 8);
      const Tokens got = propose_one(p, 3, t, max_num_tokens);
      const Tokens want = naive::ngram_draft(t, min_n, max_n, std::min(k, max_num_tokens));
      ASSERT_EQ(got, want) << "seed " << seed << " step " << step;
      num_nonempty += !got.empty();
    }
  }
  EXPECT_GT(num_nonempty, 10000);  // the cases exercise matches, not just misses
}

}  // namespace
}  // namespace arbor::spec
