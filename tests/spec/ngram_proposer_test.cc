// NgramProposer: exact proposals on crafted sequences, incremental == from scratch, and a naive
// reference over random sequences of a tiny vocabulary.
#include <gtest/gtest.h>

#include <random>

#include "spec/ngram_proposer.h"

namespace arbor::spec {
namespace {

std::vector<int32_t> propose(NgramProposer& p, RequestId id, const std::vector<int32_t>& tokens,
                             int32_t k) {
  return p.propose_one({.request_id = id, .token_ids = tokens, .num_prompt_tokens = 0,
                        .max_num_tokens = k});
}

TEST(NgramProposer, ProposesWhatFollowedTheMostRecentLongestMatch) {
  NgramProposer p({.min_n = 1, .max_n = 3});
  // "1 2 3 9 9 | 1 2 3 7 8 | 1 2 3": the longest suffix (3 tokens) last occurred before 7 8.
  EXPECT_EQ(propose(p, 1, {1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3}, 4),
            (std::vector<int32_t>{7, 8, 1, 2}));
  EXPECT_EQ(propose(p, 2, {1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3}, 1), (std::vector<int32_t>{7}));
  EXPECT_EQ(propose(p, 3, {5, 6, 7}, 4), (std::vector<int32_t>{})) << "no earlier occurrence";
  // Only a 1-gram matches: "4" occurred before 5.
  EXPECT_EQ(propose(p, 4, {4, 5, 6, 7, 4}, 3), (std::vector<int32_t>{5, 6, 7}));
  // The continuation runs into the end: fewer than k tokens.
  EXPECT_EQ(propose(p, 5, {8, 8, 8}, 5), (std::vector<int32_t>{8})) << "3-gram no, 2-gram at 0..2";
  EXPECT_EQ(propose(p, 6, {1, 2, 1, 2}, 0), (std::vector<int32_t>{})) << "k = 0";
  NgramProposer only3({.min_n = 3, .max_n = 3});
  EXPECT_EQ(propose(only3, 7, {4, 5, 6, 7, 4}, 3), (std::vector<int32_t>{})) << "min_n = 3";
}

// The reference: for n from max_n down, the latest start s < N - n with tokens[s, s+n) equal to
// the last n tokens; propose tokens[s+n, s+n+k) cut at N.
std::vector<int32_t> naive(const std::vector<int32_t>& t, int32_t min_n, int32_t max_n, int32_t k) {
  const auto N = static_cast<int64_t>(t.size());
  for (int64_t n = std::min<int64_t>(max_n, N - 1); n >= min_n; --n) {
    for (int64_t s = N - n - 1; s >= 0; --s) {
      if (std::equal(t.end() - n, t.end(), t.begin() + s)) {
        const int64_t end = s + n;
        return std::vector<int32_t>(t.begin() + end, t.begin() + std::min<int64_t>(N, end + k));
      }
    }
  }
  return {};
}

TEST(NgramProposer, IncrementalEqualsNaiveOnRandomSequences) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto u = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const int32_t min_n = u(1, 3), max_n = min_n + u(0, 3), vocab = u(2, 6);
    NgramProposer inc({.min_n = min_n, .max_n = max_n});
    std::vector<int32_t> tokens(u(1, 5));
    for (int32_t& t : tokens) t = u(0, vocab - 1);
    for (int step = 0; step < 60; ++step) {
      const int32_t k = u(0, 6);
      ASSERT_EQ(propose(inc, 1, tokens, k), naive(tokens, min_n, max_n, k)) << "step " << step;
      NgramProposer scratch({.min_n = min_n, .max_n = max_n});
      ASSERT_EQ(propose(scratch, 1, tokens, k), naive(tokens, min_n, max_n, k));
      for (int a = u(1, 3); a > 0; --a) tokens.push_back(u(0, vocab - 1));
    }
  }
}

TEST(NgramProposer, ForgetDropsTheState) {
  NgramProposer p({});
  propose(p, 1, {1, 2, 1}, 2);
  propose(p, 2, {1, 2, 1}, 2);
  EXPECT_EQ(p.num_requests(), 2u);
  p.forget(1, {}, 0);
  EXPECT_EQ(p.num_requests(), 1u);
  // A preempted request comes back with the same tokens: proposals are as before.
  EXPECT_EQ(propose(p, 1, {1, 2, 1}, 2), (std::vector<int32_t>{2, 1}));
}

}  // namespace
}  // namespace arbor::spec
