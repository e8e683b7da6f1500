// TokenTree: structure, positions, paths, the packed ancestor mask (read back with the attention
// kernel's own kernels::mask_bit, against a naive ancestor walk), merging and the best-first
// builder (exact expectations on a hand-made example; a naive top-budget reference on random
// ones).
#include "sampling/token_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "kernels/attention.h"  // kernels::mask_bit (inline): the reader the kernel uses

namespace arbor::sampling {
namespace {

struct Shape {
  int32_t parent;
  int32_t token;
};

TokenTree make_tree(const std::vector<Shape>& shape) {
  TokenTree tree;
  for (const Shape& s : shape) tree.add_node(s.parent, s.token);
  return tree;
}

// Slot j is slot i or one of its ancestors, by walking parent pointers.
bool naive_visible(const TokenTree& tree, int32_t i, int32_t j) {
  for (int32_t slot = i;; slot = tree.node(slot - 1).parent + 1) {
    if (slot == j) return true;
    if (slot == 0) return false;
  }
}

std::vector<std::vector<int>> read_mask(const std::vector<uint8_t>& bits, int64_t offset,
                                        int n) {
  std::vector<std::vector<int>> out(static_cast<size_t>(n), std::vector<int>(n));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) out[i][j] = kernels::mask_bit(bits.data(), offset, n, i, j);
  }
  return out;
}

// The mask at offsets 0, 5 and 13 over buffers filled with ones and with zeros: every bit of
// the segment is the naive one and every bit outside it untouched.
void expect_mask_matches_naive(const TokenTree& tree, const char* what) {
  const int n = tree.num_slots();
  ASSERT_EQ(tree.num_mask_bits(), static_cast<int64_t>(n) * n);
  for (int64_t offset : {0, 5, 13}) {
    for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}}) {
      const int64_t total_bits = offset + tree.num_mask_bits() + 11;
      std::vector<uint8_t> bits(static_cast<size_t>((total_bits + 7) / 8), fill);
      tree.write_mask(bits, offset);
      const auto mask = read_mask(bits, offset, n);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          ASSERT_EQ(mask[i][j], naive_visible(tree, i, j) ? 1 : 0)
              << what << " offset " << offset << " slot (" << i << ", " << j << ")";
        }
      }
      for (int64_t b = 0; b < total_bits; ++b) {
        if (b >= offset && b < offset + tree.num_mask_bits()) continue;
        ASSERT_EQ((bits[static_cast<size_t>(b >> 3)] >> (b & 7)) & 1, fill & 1)
            << what << " bit " << b << " outside the segment changed";
      }
    }
  }
  const std::vector<uint8_t> packed = tree.packed_mask();
  EXPECT_EQ(packed.size(), static_cast<size_t>((tree.num_mask_bits() + 7) / 8));
  EXPECT_EQ(read_mask(packed, 0, n), read_mask([&] {
              std::vector<uint8_t> b(packed.size(), 0);
              tree.write_mask(b, 0);
              return b;
            }(), 0, n));
}

TEST(TokenTreeTest, TheBatchLayoutExampleHasTheDocumentedMask) {
  // docs/batch_layout.md, seq 2: c0 the root (last committed token), c1 and c2 children of c0,
  // c3 child of c1.
  const TokenTree tree = make_tree({{-1, 11}, {-1, 12}, {0, 13}});
  const std::vector<std::vector<int>> expected = {
      {1, 0, 0, 0}, {1, 1, 0, 0}, {1, 0, 1, 0}, {1, 1, 0, 1}};
  EXPECT_EQ(read_mask(tree.packed_mask(), 0, 4), expected);
  // Bytes: row-major bits 0..15, little-endian within each byte.
  EXPECT_EQ(tree.packed_mask(), (std::vector<uint8_t>{0b0011'0001, 0b1011'0101}));
  EXPECT_EQ(tree.positions(2), (std::vector<int32_t>{2, 3, 3, 4}));
  EXPECT_EQ(tree.slot_tokens(10), (std::vector<int32_t>{10, 11, 12, 13}));
}

TEST(TokenTreeTest, AChainTreeMaskIsCausal) {
  for (int k : {0, 1, 2, 5, 9}) {
    std::vector<int32_t> tokens(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) tokens[static_cast<size_t>(i)] = 3 * i + 1;
    const TokenTree tree = TokenTree::from_chain(tokens);
    ASSERT_EQ(tree.num_nodes(), k);
    const auto mask = read_mask(tree.packed_mask(), 0, k + 1);
    for (int i = 0; i <= k; ++i) {
      for (int j = 0; j <= k; ++j) EXPECT_EQ(mask[i][j], j <= i ? 1 : 0) << k << " " << i << j;
    }
    EXPECT_EQ(tree.max_depth(), k);
    EXPECT_EQ(tree.root_to_leaf_paths().size(), k == 0 ? 0u : 1u);
  }
}

TEST(TokenTreeTest, MasksOfSeveralShapesMatchANaiveAncestorWalk) {
  expect_mask_matches_naive(TokenTree(), "empty");
  expect_mask_matches_naive(make_tree({{-1, 1}, {-1, 2}, {-1, 3}, {-1, 4}, {-1, 5}}), "star");
  expect_mask_matches_naive(
      make_tree({{-1, 1}, {-1, 2}, {0, 3}, {0, 4}, {1, 5}, {1, 6}, {2, 7}, {2, 8}, {5, 9}}),
      "binary");
  expect_mask_matches_naive(make_tree({{-1, 1}, {0, 2}, {1, 3}, {-1, 4}, {3, 5}, {1, 6}}),
                            "two chains, non-BFS order");
  const uint64_t seed = 20240615;
  std::mt19937_64 gen(seed);
  for (int t = 0; t < 200; ++t) {
    const int n = static_cast<int>(gen() % 40);
    TokenTree tree;
    for (int i = 0; i < n; ++i) {
      tree.add_node(static_cast<int32_t>(gen() % static_cast<uint64_t>(i + 1)) - 1,
                    static_cast<int32_t>(gen() % 7));
    }
    SCOPED_TRACE(testing::Message() << "seed " << seed << " tree " << t);
    expect_mask_matches_naive(tree, "random");
  }
}

TEST(TokenTreeTest, StructurePositionsAndPaths) {
  // root -> 0:5 -> 3:8 -> 6:1
  //           \--> 4:9
  //      -> 1:6 -> 5:8
  //      -> 2:7
  TokenTree tree;
  const int32_t dist = tree.add_draft_dist({{6, 0.5}, {2, 0.5}});
  tree.add_node(-1, 5, 0.5);
  tree.add_node(-1, 6, 0.25, dist);
  tree.add_node(-1, 7, 0.125);
  tree.add_node(0, 8, 0.5);
  tree.add_node(0, 9, 0.25);
  tree.add_node(1, 8, 1.0);
  tree.add_node(3, 1, 0.5);
  EXPECT_EQ(tree.num_nodes(), 7);
  EXPECT_EQ(tree.num_slots(), 8);
  EXPECT_EQ(tree.max_depth(), 3);
  EXPECT_EQ(std::vector<int32_t>(tree.children(-1).begin(), tree.children(-1).end()),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(std::vector<int32_t>(tree.children(0).begin(), tree.children(0).end()),
            (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(tree.children(6).empty());
  EXPECT_EQ(tree.node(6).depth, 3);
  EXPECT_EQ(tree.node(1).draft_dist, dist);
  EXPECT_EQ(tree.node(0).draft_dist, TokenTree::kOneHot);
  EXPECT_EQ(tree.positions(40), (std::vector<int32_t>{40, 41, 41, 41, 42, 42, 42, 43}));
  EXPECT_EQ(tree.path_to(6), (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(tree.path_tokens(6), (std::vector<int32_t>{5, 8, 1}));
  EXPECT_TRUE(tree.path_to(-1).empty());
  EXPECT_DOUBLE_EQ(tree.path_prob(6), 0.5 * 0.5 * 0.5);
  EXPECT_DOUBLE_EQ(tree.path_prob(-1), 1.0);
  EXPECT_EQ(tree.leaves(), (std::vector<int32_t>{2, 4, 5, 6}));
  EXPECT_EQ(tree.root_to_leaf_paths(),
            (std::vector<std::vector<int32_t>>{{2}, {0, 4}, {1, 5}, {0, 3, 6}}));
  EXPECT_EQ(tree.find_child(0, 9), std::optional<int32_t>(4));
  EXPECT_EQ(tree.find_child(-1, 8), std::nullopt);
}

TEST(TokenTreeTest, FromChainWithDraftDistributions) {
  const std::vector<int32_t> tokens = {3, 1};
  const std::vector<std::vector<Candidate>> qs = {{{3, 0.75}, {1, 0.25}}, {{1, 0.5}, {0, 0.5}}};
  const TokenTree tree = TokenTree::from_chain(tokens, qs);
  ASSERT_EQ(tree.num_nodes(), 2);
  EXPECT_EQ(tree.node(0).draft_dist, 0);
  EXPECT_EQ(tree.node(1).draft_dist, 1);
  EXPECT_EQ(tree.node(1).parent, 0);
  EXPECT_DOUBLE_EQ(tree.node(0).draft_prob, 0.75);
  EXPECT_DOUBLE_EQ(tree.node(1).draft_prob, 0.5);
  EXPECT_EQ(tree.num_draft_dists(), 2);
}

TEST(TokenTreeTest, MergeDeduplicatesSharedPrefixesOfOneHotProposals) {
  TokenTree tree = TokenTree::from_chain(std::vector<int32_t>{5, 6, 7});
  EXPECT_EQ(tree.merge(TokenTree::from_chain(std::vector<int32_t>{5, 6, 8})),
            (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(tree.merge(TokenTree::from_chain(std::vector<int32_t>{5, 9})),
            (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(tree.merge(TokenTree::from_chain(std::vector<int32_t>{4})),
            (std::vector<int32_t>{5}));
  EXPECT_EQ(tree.merge(TokenTree::from_chain(std::vector<int32_t>{5, 6, 7})),
            (std::vector<int32_t>{0, 1, 2}));
  TokenTree expected = make_tree({{-1, 5}, {0, 6}, {1, 7}, {1, 8}, {0, 9}, {-1, 4}});
  EXPECT_TRUE(tree == expected);
  // A tree merged into an empty one is itself.
  TokenTree empty;
  empty.merge(expected);
  EXPECT_TRUE(empty == expected);
}

TEST(TokenTreeTest, MergeKeepsEverySampledNodeAndRenumbersDistributions) {
  TokenTree tree = TokenTree::from_chain(std::vector<int32_t>{2, 3});  // one-hot
  TokenTree sampled;
  const int32_t q0 = sampled.add_draft_dist({{2, 0.5}, {4, 0.5}});
  sampled.add_node(-1, 2, 0.5, q0);  // same token as a one-hot node: still its own node
  sampled.add_node(-1, 2, 0.5, q0);  // a repeat draw: its own node too
  const int32_t q1 = sampled.add_draft_dist({{3, 1.0}});
  sampled.add_node(0, 3, 1.0, q1);
  TokenTree onehot_after = TokenTree::from_chain(std::vector<int32_t>{2, 3, 9});
  EXPECT_EQ(tree.merge(sampled), (std::vector<int32_t>{2, 3, 4}));
  // One-hot nodes merge into the first child with their token, sampled or not.
  EXPECT_EQ(tree.merge(onehot_after), (std::vector<int32_t>{0, 1, 5}));
  ASSERT_EQ(tree.num_nodes(), 6);
  EXPECT_EQ(tree.num_draft_dists(), 2);
  EXPECT_EQ(tree.node(2).draft_dist, 0);
  EXPECT_EQ(tree.node(3).draft_dist, 0);
  EXPECT_EQ(tree.node(4).draft_dist, 1);
  EXPECT_EQ(tree.node(4).parent, 2);
  EXPECT_EQ(tree.node(5).parent, 1);
  TokenTree more;
  const int32_t q = more.add_draft_dist({{7, 1.0}});
  more.add_node(-1, 7, 1.0, q);
  tree.merge(more);
  EXPECT_EQ(tree.node(6).draft_dist, 2);
  EXPECT_EQ(tree.draft_dist(2).size(), 1u);
  EXPECT_EQ(tree.draft_dist(2)[0].token_id, 7);
}

// Hand-made draft: dyadic probabilities, so path products are exact and ties are real ties.
std::vector<Candidate> hand_candidates(const TokenTree& tree, int32_t node) {
  const std::vector<int32_t> path = tree.path_tokens(node);
  static const std::map<std::vector<int32_t>, std::vector<Candidate>> table = {
      {{}, {{3, 0.125}, {1, 0.5}, {2, 0.25}}},
      {{1}, {{4, 0.5}, {5, 0.375}, {6, 0.125}}},
      {{2}, {{7, 0.75}, {8, 0.25}}},
      {{1, 4}, {{9, 0.75}, {10, 0.25}}},
  };
  const auto it = table.find(path);
  if (it != table.end()) return it->second;
  return {{12, 0.5}, {11, 0.5}, {13, 0.0}};
}

std::vector<Shape> shape_of(const TokenTree& tree) {
  std::vector<Shape> out;
  for (const TreeNode& n : tree.nodes()) out.push_back({n.parent, n.token_id});
  return out;
}

bool operator==(const Shape& a, const Shape& b) {
  return a.parent == b.parent && a.token == b.token;
}

TEST(TokenTreeTest, BuilderSpendsTheBudgetOnTheHighestPathProbabilities) {
  std::vector<std::vector<int32_t>> calls;
  auto top = [&](const TokenTree& tree, int32_t node) {
    calls.push_back(tree.path_tokens(node));
    return hand_candidates(tree, node);
  };
  // budget 5, width 2: 1 (.5); 2 (.25, offered before 4 at .25); 4 (.25); 5 (.1875, before 7
  // and 9 at .1875); 7. Token 3 is cut by the width, and 7 is not expanded: the budget is spent.
  const TokenTree tree = build_tree({.budget = 5, .max_width = 2, .max_depth = 8}, top);
  EXPECT_EQ(shape_of(tree), (std::vector<Shape>{{-1, 1}, {-1, 2}, {0, 4}, {0, 5}, {1, 7}}));
  EXPECT_EQ(calls, (std::vector<std::vector<int32_t>>{{}, {1}, {2}, {1, 4}, {1, 5}}));
  std::vector<double> probs;
  for (const TreeNode& n : tree.nodes()) probs.push_back(n.draft_prob);
  EXPECT_EQ(probs, (std::vector<double>{0.5, 0.25, 0.5, 0.375, 0.75}));
  for (const TreeNode& n : tree.nodes()) EXPECT_EQ(n.draft_dist, TokenTree::kOneHot);

  // Width 1: the greedy chain (ties to the lower id: 11 before 12).
  calls.clear();
  EXPECT_EQ(shape_of(build_tree({.budget = 5, .max_width = 1, .max_depth = 8}, top)),
            (std::vector<Shape>{{-1, 1}, {0, 4}, {1, 9}, {2, 11}, {3, 11}}));
  // Depth 2, width 3, budget 10: exactly every node up to depth 2, in path-probability order.
  calls.clear();
  EXPECT_EQ(shape_of(build_tree({.budget = 10, .max_width = 3, .max_depth = 2}, top)),
            (std::vector<Shape>{{-1, 1}, {-1, 2}, {0, 4}, {0, 5}, {1, 7}, {-1, 3}, {0, 6},
                                {1, 8}, {5, 11}, {5, 12}}));
  // Nodes at max_depth are never expanded.
  for (const std::vector<int32_t>& c : calls) EXPECT_LT(c.size(), 2u);
  // A large budget stops when nothing is left (depth 1, width 2: two nodes).
  EXPECT_EQ(build_tree({.budget = 50, .max_width = 2, .max_depth = 1}, top).num_nodes(), 2);
  EXPECT_EQ(build_tree({.budget = 0, .max_width = 2, .max_depth = 3}, top).num_nodes(), 0);
}

// Every node of the full width-capped tree to max_depth, as (path probability, path tokens).
void full_tree(const std::vector<int32_t>& path, double prob, int max_width, int max_depth,
               const std::function<std::vector<Candidate>(const std::vector<int32_t>&)>& top,
               std::vector<std::pair<double, std::vector<int32_t>>>& out) {
  if (static_cast<int>(path.size()) == max_depth) return;
  std::vector<Candidate> c = top(path);
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.prob != b.prob ? a.prob > b.prob : a.token_id < b.token_id;
  });
  if (c.size() > static_cast<size_t>(max_width)) c.resize(static_cast<size_t>(max_width));
  for (const Candidate& x : c) {
    std::vector<int32_t> next = path;
    next.push_back(x.token_id);
    out.push_back({prob * x.prob, next});
    full_tree(next, prob * x.prob, max_width, max_depth, top, out);
  }
}

TEST(TokenTreeTest, BuilderEqualsTheNaiveTopBudgetOfTheFullTree) {
  const uint64_t seed = 777;
  for (int t = 0; t < 60; ++t) {
    const int width = 1 + t % 3;
    const int depth = 1 + (t / 3) % 4;
    const int budget = 1 + t % 17;
    // Random distributions over 6 tokens, a function of the path.
    auto top_of_path = [&](const std::vector<int32_t>& path) {
      uint64_t h = seed * 1000003 + static_cast<uint64_t>(t);
      for (int32_t x : path) h = (h ^ static_cast<uint64_t>(x + 1)) * 0x9e3779b97f4a7c15ULL;
      std::mt19937_64 gen(h);
      std::vector<Candidate> c;
      double total = 0.0;
      for (int32_t id = 0; id < 6; ++id) {
        c.push_back({id, std::uniform_real_distribution<double>(0.01, 1.0)(gen)});
        total += c.back().prob;
      }
      for (Candidate& x : c) x.prob /= total;
      return c;
    };
    const TokenTree tree = build_tree(
        {.budget = budget, .max_width = width, .max_depth = depth},
        [&](const TokenTree& tr, int32_t node) { return top_of_path(tr.path_tokens(node)); });
    std::vector<std::pair<double, std::vector<int32_t>>> all;
    full_tree({}, 1.0, width, depth, top_of_path, all);
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    if (all.size() > static_cast<size_t>(budget)) all.resize(static_cast<size_t>(budget));
    std::vector<std::vector<int32_t>> want, got;
    for (const auto& a : all) want.push_back(a.second);
    for (int32_t i = 0; i < tree.num_nodes(); ++i) {
      got.push_back(tree.path_tokens(i));
      EXPECT_NEAR(tree.path_prob(i), all[static_cast<size_t>(i)].first, 1e-15);
    }
    // Same nodes, added in non-increasing path probability.
    EXPECT_EQ(got, want) << "seed " << seed << " case " << t;
  }
}

}  // namespace
}  // namespace arbor::sampling
