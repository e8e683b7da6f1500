#include "chain_drafts.h"
#include "spec/suffix_proposer.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "naive_reference.h"

namespace arbor::spec {
namespace {

using Tokens = std::vector<int32_t>;

Tokens propose_one(Proposer& p, RequestId id, const Tokens& tokens, int32_t max_num_tokens,
                   int32_t num_prompt_tokens = 0) {
  const DraftRequest r{id, tokens, num_prompt_tokens, max_num_tokens};
  std::vector<Tokens> out;
  propose_chains(p, std::span<const DraftRequest>(&r, 1), out);
  EXPECT_EQ(out.size(), 1u);
  return out[0];
}

SuffixProposerOptions local_only(int32_t max_depth, double factor = 1.0) {
  return {.max_depth = max_depth,
          .num_speculative_tokens = 8,
          .max_spec_factor = factor,
          .max_spec_offset = 0.0,
          .min_token_prob = 0.1,
          .global_max_tokens = 0};
}

TEST(SuffixProposer, ContinuesARepeatInTheRequestItself) {
  // "1 2 3" occurred before, followed by 4 5 9; the latest "1 2 3" counts too, so the first
  // continuation token has probability 1/2. m = 3 caps the draft at 3 tokens (score 1.5) and
  // beats m = 2 (2 tokens, 1.0) and m = 1.
  SuffixProposer p(local_only(8));
  const Tokens t{1, 2, 3, 4, 5, 9, 1, 2, 3};
  EXPECT_EQ(propose_one(p, 1, t, 8), (Tokens{4, 5, 9}));
  std::vector<DraftCandidate> c;
  p.candidates({1, t, 0, 8}, 8, c);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].token_ids, (Tokens{4, 5, 9}));
  EXPECT_DOUBLE_EQ(c[0].score, 1.5);
  EXPECT_EQ(c[1].token_ids, (Tokens{4, 5}));
  EXPECT_DOUBLE_EQ(c[1].score, 1.0);
  EXPECT_EQ(c[2].token_ids, (Tokens{4}));
  p.candidates({1, t, 0, 8}, 1, c);
  ASSERT_EQ(c.size(), 1u);
}

TEST(SuffixProposer, SpecFactorAndDepthBoundTheDraft) {
  // Factor 2: m = 3 may propose 6, but "1 2 3" + 6 tokens is deeper than 8: 5 tokens.
  SuffixProposer p(local_only(8, 2.0));
  EXPECT_EQ(propose_one(p, 1, {1, 2, 3, 4, 5, 9, 1, 2, 3}, 8), (Tokens{4, 5, 9, 1, 2}));
  // max_num_tokens and num_speculative_tokens cap it.
  SuffixProposer q(local_only(8, 2.0));
  EXPECT_EQ(propose_one(q, 1, {1, 2, 3, 4, 5, 9, 1, 2, 3}, 2), (Tokens{4, 5}));
  SuffixProposerOptions o = local_only(8, 2.0);
  o.num_speculative_tokens = 1;
  SuffixProposer r(o);
  EXPECT_EQ(propose_one(r, 1, {1, 2, 3, 4, 5, 9, 1, 2, 3}, 8), (Tokens{4}));
}

TEST(SuffixProposer, MinTokenProbStopsUnlikelyContinuations) {
  // After "7": 1, 2, 3 once each and the final 7: probability 1/4 each.
  const Tokens t{7, 1, 7, 2, 7, 3, 7};
  SuffixProposerOptions o = local_only(4);
  o.max_spec_offset = 1.0;  // m = 1 may propose 2
  o.min_token_prob = 0.3;
  SuffixProposer strict(o);
  EXPECT_TRUE(propose_one(strict, 1, t, 8).empty());
  o.min_token_prob = 0.2;
  SuffixProposer loose(o);
  EXPECT_EQ(propose_one(loose, 1, t, 8), (Tokens{1, 7}));  // tie: the smaller token
}

TEST(SuffixProposer, NothingForMaxNumTokensZeroOrNoMatch) {
  SuffixProposer p(local_only(8));
  EXPECT_TRUE(propose_one(p, 1, {1, 2, 3, 1, 2}, 0).empty());
  EXPECT_EQ(p.request_trie(1), nullptr);  // not even indexed
  EXPECT_TRUE(propose_one(p, 2, {1, 2, 3, 4}, 8).empty());
  EXPECT_TRUE(propose_one(p, 3, {}, 8).empty());
  std::vector<DraftCandidate> c;
  p.candidates({2, Tokens{1, 2, 3, 4}, 0, 8}, 4, c);
  EXPECT_TRUE(c.empty());
}

TEST(SuffixProposer, LearnsFinishedOutputsAcrossRequests) {
  SuffixProposerOptions o = local_only(8);
  o.global_max_tokens = 1000;
  SuffixProposer p(o);
  // Request 1: prompt 1 2, output 10 11 12 13 14.
  const Tokens a{1, 2, 10, 11, 12, 13, 14};
  EXPECT_TRUE(propose_one(p, 1, a, 8, 2).empty());
  p.forget(1, a, 2);
  EXPECT_EQ(p.num_requests(), 0);
  EXPECT_EQ(p.global_trie().num_tokens(), 5);
  // Request 2 ends with "11 12": the global trie continues it (m = 2 -> 2 tokens).
  EXPECT_EQ(propose_one(p, 2, {5, 6, 11, 12}, 8, 4), (Tokens{13, 14}));
  EXPECT_EQ(propose_one(p, 2, {5, 6, 11, 12, 13}, 8, 4), (Tokens{14}));
  // The prompt was not learned: "1" continues nothing.
  EXPECT_TRUE(propose_one(p, 3, {9, 1}, 8, 2).empty());

  o.global_index_prompts = true;
  SuffixProposer q(o);
  q.forget(1, a, 2);  // never proposed for: fine
  EXPECT_EQ(q.global_trie().num_tokens(), 7);
  EXPECT_EQ(propose_one(q, 3, {9, 1}, 8, 2), (Tokens{2}));
  EXPECT_EQ(propose_one(q, 3, {9, 1, 2}, 8, 2), (Tokens{10, 11}));
}

TEST(SuffixProposer, HigherScoreWinsAndTiesGoToTheRequestTrie) {
  SuffixProposerOptions o = local_only(8);
  o.global_max_tokens = 1000;
  const Tokens context{4, 5, 7, 4, 5};
  // Own: "4 5" seen once before, then 7 4: 0.5 + 0.5 = 1.0. Global "4 5 6": 6 alone, 1.0.
  SuffixProposer tie(o);
  tie.forget(1, Tokens{4, 5, 6}, 0);
  EXPECT_EQ(propose_one(tie, 2, context, 8), (Tokens{7, 4}));
  // Global "4 5 6 8": 6 8, 2.0.
  SuffixProposer global_wins(o);
  global_wins.forget(1, Tokens{4, 5, 6, 8}, 0);
  EXPECT_EQ(propose_one(global_wins, 2, context, 8), (Tokens{6, 8}));
  std::vector<DraftCandidate> c;
  global_wins.candidates({2, context, 0, 8}, 8, c);
  ASSERT_EQ(c.size(), 4u);  // global m=2, own m=2, global m=1 (6), own m=1 (7)
  EXPECT_EQ(c[0].token_ids, (Tokens{6, 8}));
  EXPECT_EQ(c[1].token_ids, (Tokens{7, 4}));
  EXPECT_EQ(c[2].token_ids, (Tokens{6}));
  EXPECT_EQ(c[3].token_ids, (Tokens{7}));
}

TEST(SuffixProposer, EvictsOldestOutputsToStayWithinTheBudget) {
  SuffixProposerOptions o = local_only(4);
  o.global_max_tokens = 10;
  SuffixProposer p(o);
  p.forget(1, Tokens{0, 20, 21, 22, 23}, 1);  // 4 tokens
  p.forget(2, Tokens{0, 30, 31, 32, 33}, 1);  // 8
  EXPECT_EQ(p.global_trie().num_tokens(), 8);
  EXPECT_EQ(p.global_trie().num_sequences(), 2);
  EXPECT_EQ(propose_one(p, 9, {20, 21}, 8), (Tokens{22, 23}));
  p.forget(3, Tokens{0, 40, 41, 42, 43}, 1);  // 12 > 10: request 1's output goes
  EXPECT_EQ(p.global_trie().num_tokens(), 8);
  EXPECT_EQ(p.global_trie().num_sequences(), 2);
  EXPECT_TRUE(propose_one(p, 10, {20, 21}, 8).empty());
  EXPECT_EQ(propose_one(p, 11, {40, 41}, 8), (Tokens{42, 43}));
  p.global_trie().check_invariants();
  // Exactly the trie of the two retained outputs.
  SuffixTrie fresh(4);
  for (const Tokens& s : {Tokens{30, 31, 32, 33}, Tokens{40, 41, 42, 43}}) {
    fresh.open_sequence();
    for (int32_t t : s) fresh.append(t);
    fresh.close_sequence();
  }
  EXPECT_EQ(p.global_trie().num_nodes(), fresh.num_nodes());
  // An output longer than the budget keeps its last 10 tokens and evicts everything else.
  Tokens long_output{0};
  for (int32_t i = 0; i < 15; ++i) long_output.push_back(100 + i);
  p.forget(4, long_output, 1);
  EXPECT_EQ(p.global_trie().num_tokens(), 10);
  EXPECT_EQ(p.global_trie().num_sequences(), 1);
  EXPECT_EQ(p.global_trie().count(Tokens{104}), 0);
  EXPECT_EQ(p.global_trie().count(Tokens{105}), 1);
  p.global_trie().check_invariants();
}

TEST(SuffixProposerDeathTest, CommittedTokensMayNotShrinkWithoutForget) {
  SuffixProposer p(local_only(8));
  propose_one(p, 1, {1, 2, 3, 4}, 8);
  EXPECT_DEATH(propose_one(p, 1, {1, 2, 3}, 8), "shrank without forget");
  EXPECT_DEATH(propose_one(p, 1, {1, 2, 3, 5, 6}, 8), "changed without forget");
  p.forget(1, Tokens{1, 2, 3, 4}, 4);
  EXPECT_TRUE(propose_one(p, 1, {1, 2, 3}, 8).empty());  // a fresh start after forget
}

// Fed one token per call or the whole sequence at once, the proposals are the same.
TEST(SuffixProposer, IncrementalEqualsFromScratch) {
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    SuffixProposerOptions o{.max_depth = 2 + static_cast<int32_t>(rng() % 7),
                            .num_speculative_tokens = 1 + static_cast<int32_t>(rng() % 6),
                            .max_spec_factor = 1.0 + (rng() % 2),
                            .global_max_tokens = 0};
    SuffixProposer incremental(o);
    Tokens t;
    for (int step = 0; step < 60; ++step) {
      t.push_back(static_cast<int32_t>(rng() % 3));
      SuffixProposer scratch(o);
      ASSERT_EQ(propose_one(incremental, 5, t, 8), propose_one(scratch, 5, t, 8))
          << "step " << step;
    }
    incremental.request_trie(5)->check_invariants();
  }
}

// Requests over a tiny vocabulary, finishing into a small global budget, against the
// brute-force counting reference; per case random options. Drafts are partly "accepted" so
// that text repeats the way speculation makes it.
TEST(SuffixProposer, MatchesNaiveReferenceOnRandomRequests) {
  int64_t num_nonempty = 0;
  int64_t num_proposals = 0;
  for (uint32_t seed = 1; seed <= 2000; ++seed) {
    std::mt19937 rng(seed);
    const double factors[] = {0.5, 1.0, 2.0};
    const double min_probs[] = {0.0, 0.1, 0.3, 0.6};
    const SuffixProposerOptions o{.max_depth = 1 + static_cast<int32_t>(rng() % 8),
                                  .num_speculative_tokens = static_cast<int32_t>(rng() % 9),
                                  .max_spec_factor = factors[rng() % 3],
                                  .max_spec_offset = static_cast<double>(rng() % 2),
                                  .min_token_prob = min_probs[rng() % 4],
                                  .global_max_tokens = static_cast<int64_t>(rng() % 60),
                                  .global_index_prompts = rng() % 2 == 0};
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 3);
    const naive::SuffixParams params{o.max_depth, o.max_spec_factor, o.max_spec_offset,
                                     o.min_token_prob, vocab};
    SuffixProposer p(o);
    naive::GlobalSequences global{o.global_max_tokens, o.global_index_prompts, {}};
    for (RequestId id = 1; id <= 5; ++id) {
      Tokens t;
      const auto prompt_len = static_cast<int32_t>(rng() % 12);
      for (int32_t i = 0; i < prompt_len; ++i) t.push_back(static_cast<int32_t>(rng() % vocab));
      const int num_steps = static_cast<int>(rng() % 12);
      for (int step = 0; step < num_steps; ++step) {
        const auto max_num_tokens = static_cast<int32_t>(rng() % 9);
        const Tokens got = propose_one(p, id, t, max_num_tokens, prompt_len);
        const Tokens want = naive::suffix_draft(
            t, global.seqs, std::min(o.num_speculative_tokens, max_num_tokens), params);
        ASSERT_EQ(got, want) << "seed " << seed << " request " << id << " step " << step;
        ++num_proposals;
        num_nonempty += !got.empty();
        // Accept a prefix of the draft, then one token of the target's own.
        const size_t accepted = got.empty() ? 0 : rng() % (got.size() + 1);
        t.insert(t.end(), got.begin(), got.begin() + static_cast<std::ptrdiff_t>(accepted));
        t.push_back(static_cast<int32_t>(rng() % vocab));
      }
      if (rng() % 4 != 0) {
        p.forget(id, t, prompt_len);
        global.add(t, prompt_len);
      }
      ASSERT_EQ(p.global_trie().num_tokens(), global.num_tokens) << "seed " << seed;
      ASSERT_EQ(p.global_trie().num_sequences(), static_cast<int32_t>(global.seqs.size()))
          << "seed " << seed;
    }
    p.global_trie().check_invariants();
  }
  EXPECT_GT(num_nonempty, num_proposals / 4);
}

}  // namespace
}  // namespace arbor::spec
