#include "spec/suffix_trie.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "naive_reference.h"

namespace arbor::spec {
namespace {

using Tokens = std::vector<int32_t>;

void add_sequence(SuffixTrie& trie, const Tokens& s) {
  trie.open_sequence();
  for (int32_t t : s) trie.append(t);
  trie.close_sequence();
}

int32_t count(const SuffixTrie& trie, const Tokens& s) { return trie.count(s); }

TEST(SuffixTrie, CountsOccurrencesAndStaysCompressed) {
  SuffixTrie trie(4);
  add_sequence(trie, {0, 1, 0, 1});
  trie.check_invariants();
  EXPECT_EQ(count(trie, {0}), 2);
  EXPECT_EQ(count(trie, {1}), 2);
  EXPECT_EQ(count(trie, {0, 1}), 2);
  EXPECT_EQ(count(trie, {1, 0}), 1);
  EXPECT_EQ(count(trie, {0, 1, 0}), 1);
  EXPECT_EQ(count(trie, {0, 1, 0, 1}), 1);
  EXPECT_EQ(count(trie, {1, 1}), 0);
  EXPECT_EQ(count(trie, {0, 1, 0, 1, 0}), 0);  // deeper than max_depth
  // Nodes: root, "0 1" (a suffix ends there), "0 1 0 1", "1", "1 0 1"; "0", "1 0" and
  // "0 1 0" lie inside edges.
  EXPECT_EQ(trie.num_nodes(), 5);
  EXPECT_EQ(trie.num_tokens(), 4);
  const std::optional<SuffixTrie::Position> p = trie.find(Tokens{0, 1, 0});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->up, 1);
}

TEST(SuffixTrie, DepthLimitTruncatesSuffixes) {
  SuffixTrie trie(2);
  add_sequence(trie, {5, 6, 7, 5, 6, 8});
  trie.check_invariants();
  EXPECT_EQ(count(trie, {5, 6}), 2);
  EXPECT_EQ(count(trie, {5}), 2);
  EXPECT_EQ(count(trie, {6, 7}), 1);
  EXPECT_EQ(count(trie, {5, 6, 7}), 0);
  // "5 6" (2) is a node, its two continuations are cut at depth 2: nothing below it.
  std::vector<int32_t> out;
  EXPECT_EQ(trie.continue_greedy(*trie.find(Tokens{5, 6}), 4, 0.0, out), 0.0);
  EXPECT_TRUE(out.empty());
}

TEST(SuffixTrie, GreedyContinuationFollowsCountsAndStopsBelowMinProb) {
  SuffixTrie trie(8);
  // After "1": 2 twice, 3 once; after "1 2": 4 twice.
  add_sequence(trie, {1, 2, 4, 1, 3, 1, 2, 4});
  trie.check_invariants();
  std::vector<int32_t> out;
  const SuffixTrie::Position one = *trie.find(Tokens{1});
  // prob 2/3, then "1 2" -> "1 2 4" 2/2, then "1 2 4" -> "1 2 4 1" 1/2, then 1/1 ...
  EXPECT_DOUBLE_EQ(trie.continue_greedy(one, 4, 0.0, out), 2.0 / 3 + 2.0 / 3 + 1.0 / 3 + 1.0 / 3);
  EXPECT_EQ(out, (Tokens{2, 4, 1, 3}));
  // Up to the depth limit: "1 2 4 1 3 1 2 4" is 8 tokens.
  trie.continue_greedy(one, 100, 0.0, out);
  EXPECT_EQ(out, (Tokens{2, 4, 1, 3, 1, 2, 4}));
  EXPECT_DOUBLE_EQ(trie.continue_greedy(one, 8, 0.5, out), 2.0 / 3 + 2.0 / 3);
  EXPECT_EQ(out, (Tokens{2, 4}));
  EXPECT_DOUBLE_EQ(trie.continue_greedy(one, 1, 0.0, out), 2.0 / 3);
  EXPECT_EQ(out, (Tokens{2}));
  EXPECT_EQ(trie.continue_greedy(one, 8, 0.7, out), 0.0);
  EXPECT_TRUE(out.empty());
}

TEST(SuffixTrie, TiesGoToTheSmallerToken) {
  SuffixTrie trie(4);
  add_sequence(trie, {9, 7, 9, 3});
  std::vector<int32_t> out;
  trie.continue_greedy(*trie.find(Tokens{9}), 1, 0.0, out);
  EXPECT_EQ(out, (Tokens{3}));
}

TEST(SuffixTrie, RemovingTheOldestSequenceRestoresTheTrieOfTheRest) {
  SuffixTrie trie(3);
  add_sequence(trie, {0, 1, 2});
  add_sequence(trie, {0, 1, 3});
  trie.check_invariants();
  EXPECT_EQ(count(trie, {0, 1}), 2);
  EXPECT_EQ(count(trie, {0, 1, 2}), 1);
  EXPECT_EQ(trie.num_sequences(), 2);
  trie.remove_oldest_sequence();
  trie.check_invariants();
  EXPECT_EQ(count(trie, {0, 1}), 1);
  EXPECT_EQ(count(trie, {0, 1, 2}), 0);
  EXPECT_EQ(count(trie, {0, 1, 3}), 1);
  EXPECT_EQ(count(trie, {2}), 0);
  EXPECT_EQ(trie.num_tokens(), 3);
  EXPECT_EQ(trie.num_sequences(), 1);
  // root, "0 1 3", "1 3", "3".
  EXPECT_EQ(trie.num_nodes(), 4);
  trie.remove_oldest_sequence();
  trie.check_invariants();
  EXPECT_EQ(trie.num_nodes(), 1);
  EXPECT_EQ(trie.num_tokens(), 0);
}

TEST(SuffixTrie, OpenSuffixesAreTheLastTokens) {
  SuffixTrie trie(3);
  trie.open_sequence();
  for (int32_t t : {1, 2, 1, 2, 1}) trie.append(t);
  trie.check_invariants();
  EXPECT_EQ(trie.count(trie.open_suffix(1)), 3);  // "1"
  EXPECT_EQ(trie.count(trie.open_suffix(2)), 2);  // "2 1"
  EXPECT_EQ(trie.count(trie.open_suffix(3)), 2);  // "1 2 1"
}

// Canonical node count of the trie over seqs, from the naive counts: the root plus every
// present string that branches, ends a suffix, or is a leaf.
int64_t naive_num_nodes(const naive::Sequences& seqs, int32_t max_depth) {
  std::set<Tokens> strings;
  for (const Tokens& q : seqs) {
    for (size_t i = 0; i < q.size(); ++i) {
      for (size_t len = 1; len <= static_cast<size_t>(max_depth) && i + len <= q.size(); ++len) {
        strings.emplace(q.begin() + i, q.begin() + i + len);
      }
    }
  }
  int64_t nodes = 1;
  for (const Tokens& s : strings) {
    const int64_t c = naive::count(seqs, s);
    int32_t num_ext = 0;
    int64_t ext_count = 0;
    for (const Tokens& t : strings) {
      if (t.size() == s.size() + 1 && std::equal(s.begin(), s.end(), t.begin())) {
        ++num_ext;
        ext_count = naive::count(seqs, t);
      }
    }
    nodes += !(num_ext == 1 && ext_count == c);
  }
  return nodes;
}

void expect_matches_naive(const SuffixTrie& trie, const naive::Sequences& seqs, int32_t vocab,
                          int32_t max_depth) {
  trie.check_invariants();
  // Every string over the vocabulary up to max_depth (vocab^depth of them, kept small).
  Tokens s;
  std::vector<Tokens> frontier{{}};
  for (int32_t len = 1; len <= max_depth; ++len) {
    std::vector<Tokens> next;
    for (const Tokens& f : frontier) {
      for (int32_t t = 0; t < vocab; ++t) {
        Tokens g = f;
        g.push_back(t);
        const int64_t want = naive::count(seqs, g);
        ASSERT_EQ(trie.count(g), want) << "string of length " << len;
        if (want > 0) next.push_back(std::move(g));
      }
    }
    frontier = std::move(next);
  }
  ASSERT_EQ(trie.num_nodes(), naive_num_nodes(seqs, max_depth));
}

// Random opens, appends, closes and removals over a tiny vocabulary: counts equal brute-force
// occurrence counts, the shape is canonical (node count equals the naive one), and the
// structural invariants hold after every operation.
TEST(SuffixTrie, MatchesNaiveCountsUnderRandomOperations) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 2);
    const int32_t max_depth = 1 + static_cast<int32_t>(rng() % 5);
    SuffixTrie trie(max_depth);
    naive::Sequences seqs;
    for (int op = 0; op < 80; ++op) {
      const uint32_t r = rng() % 10;
      if (trie.has_open_sequence()) {
        if (r < 8) {
          const auto t = static_cast<int32_t>(rng() % vocab);
          trie.append(t);
          seqs.back().push_back(t);
        } else {
          trie.close_sequence();
        }
      } else if (r < 3 && !seqs.empty()) {
        trie.remove_oldest_sequence();
        seqs.erase(seqs.begin());
      } else {
        trie.open_sequence();
        seqs.emplace_back();
      }
      expect_matches_naive(trie, seqs, vocab, max_depth);
      if (HasFatalFailure()) return;
      int64_t total = 0;
      for (const Tokens& q : seqs) total += static_cast<int64_t>(q.size());
      ASSERT_EQ(trie.num_tokens(), total);
      ASSERT_EQ(trie.num_sequences(), static_cast<int32_t>(seqs.size()));
    }
  }
}

// Long sequences with repeats: the trie stays within 2 nodes per token.
TEST(SuffixTrie, NodeCountStaysLinear) {
  std::mt19937 rng(7);
  SuffixTrie trie(32);
  trie.open_sequence();
  Tokens t;
  for (int i = 0; i < 20000; ++i) {
    // Copy an earlier span now and then, otherwise fresh tokens from a mid-size vocabulary.
    if (t.size() > 100 && rng() % 50 == 0) {
      const size_t from = rng() % (t.size() - 60);
      for (size_t j = 0; j < 40; ++j) t.push_back(t[from + j]);
    } else {
      t.push_back(static_cast<int32_t>(rng() % 50));
    }
  }
  for (int32_t x : t) trie.append(x);
  trie.check_invariants();
  EXPECT_LE(trie.num_nodes(), 2 * trie.num_tokens() + 1);
  EXPECT_LT(trie.memory_bytes(), 250 * static_cast<size_t>(trie.num_tokens()));
}

}  // namespace
}  // namespace arbor::spec
