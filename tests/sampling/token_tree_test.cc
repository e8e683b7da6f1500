// TokenTree: structure, positions, paths, the packed ancestor mask (read back with the attention
// kernel's own kernels::mask_bit, against a naive ancestor walk) and merging.
#include "sampling/token_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace arbor::sampling
