// A token tree: the draft tokens one request offers for verification in one step, as a tree
// rooted at the request's last committed token (SpecInfer, Medusa, EAGLE-2, Sequoia). A chain of
// k drafts is the width-1 tree. docs/sampling.md ("Tree verification") has a picture.
//
// Slots and nodes. A request contributes [last committed token + tree nodes] to a step: slot 0
// is the root (the last committed token, query row 0), slot 1 + i is node i. Node indices are
// what every method takes and returns; TokenTree::kRoot (-1) names the root where a node is
// expected, so slot = node + 1 everywhere.
//
// Order. Nodes are stored in insertion order and a parent is always inserted before its
// children (parent index < child index): a topological order. Children of one node are listed
// in insertion order, which is the order the verifier tries them in (rejection_sampler.h).
//
// Positions. depth(root) = 0, depth(node) = depth(parent) + 1; the token of a node at depth d
// sits at absolute position root_position + d (siblings share a position).
//
// Mask. ancestor-or-self over the slots: bit (i, j) is set iff slot j is slot i or one of its
// ancestors (the root is everyone's ancestor), (num_nodes + 1)^2 bits, row-major, little-endian
// bits within bytes: exactly a sequence's segment in docs/batch_layout.md (kernels::mask_bit
// reads it), for a request whose new tokens are [last token + nodes].
//
// Draft distributions. A node whose token was *drawn* from a distribution q (a sampled tree)
// names q through draft_dist, an index into the tree's list of distributions; siblings drawn
// from the same q share the index (a "group"). A node whose token is a fixed function of its
// path (model-free proposers, top-k trees) has draft_dist ==
// kOneHot and is verified with q = one-hot(token). Which rule is exact for which tree is
// explained in rejection_sampler.h.
//
// Not thread-safe; a value type (copyable). Sizes are int32: a tree has at most a few hundred
// nodes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sampling/sampler.h"

namespace arbor::sampling {

struct TreeNode {
  int32_t token_id = 0;
  int32_t parent = -1;      // TokenTree::kRoot or an earlier node's index
  int32_t depth = 1;        // depth(parent) + 1; the root has depth 0
  double draft_prob = 1.0;  // the proposer's probability of token_id at the parent (ranking)
  int32_t draft_dist = -1;  // TokenTree::kOneHot, or the index of the q token_id was drawn from
};

class TokenTree {
 public:
  static constexpr int32_t kRoot = -1;
  static constexpr int32_t kOneHot = -1;

  TokenTree() : children_(1) {}  // just the root

  // The chain d_0 -> d_1 -> ... (node i = d_i, child of node i-1), one-hot, draft_prob 1 or
  // probs[i] (probs: [k], or empty).
  static TokenTree from_chain(std::span<const int32_t> token_ids,
                              std::span<const float> probs = {});
  // The chain of a model draft: node i drawn from draft_probs[i] (its own group), draft_prob =
  // q_i(d_i). draft_probs: [k], one per token (CHECKed).
  static TokenTree from_chain(std::span<const int32_t> token_ids,
                              std::span<const std::vector<Candidate>> draft_probs);

  // The one-hot tree of k drafts with the step protocol's parents ([k]; kRoot or an earlier
  // index; CHECKed), draft_prob from probs ([k], or empty: 1).
  static TokenTree from_parents(std::span<const int32_t> token_ids,
                                std::span<const int32_t> parents,
                                std::span<const float> probs = {});
  // The tree of the first n nodes (n <= num_nodes(); parents come first, so it is a tree), with
  // every draft distribution kept.
  TokenTree prefix(int32_t n) const;
  // The tree of the nodes with keep[i] != 0 whose parent is kept too (or the root), in order,
  // parents renumbered, every draft distribution kept. keep: [num_nodes] (CHECKed).
  TokenTree kept(std::span<const uint8_t> keep) const;
  // Each node's parent: [num_nodes] (kRoot or an index), the step protocol's draft parents.
  std::vector<int32_t> parents() const;

  // Appends a distribution siblings may be drawn from; returns its index. dist: sparse, sums to
  // 1 within rounding, any order.
  int32_t add_draft_dist(std::vector<Candidate> dist);
  // Appends a node as the last child of `parent` (kRoot or an existing node) and returns its
  // index. draft_dist: kOneHot or an existing distribution index (CHECKed). O(1) amortised.
  int32_t add_node(int32_t parent, int32_t token_id, double draft_prob = 1.0,
                   int32_t draft_dist = kOneHot);

  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t num_slots() const { return num_nodes() + 1; }
  bool empty() const { return nodes_.empty(); }
  const TreeNode& node(int32_t i) const;
  std::span<const TreeNode> nodes() const { return nodes_; }
  // Children of `node` (kRoot allowed) in insertion order.
  std::span<const int32_t> children(int32_t node) const;
  int32_t depth(int32_t node) const { return node == kRoot ? 0 : this->node(node).depth; }
  int32_t max_depth() const;  // 0 for an empty tree
  int32_t num_draft_dists() const { return static_cast<int32_t>(draft_dists_.size()); }
  std::span<const Candidate> draft_dist(int32_t index) const;

  // The first child of `parent` (kRoot allowed) with that token, if any. O(children).
  std::optional<int32_t> find_child(int32_t parent, int32_t token_id) const;
  // Nodes from the root's child down to `node`: [depth(node)]; empty for kRoot. O(depth).
  std::vector<int32_t> path_to(int32_t node) const;
  // Their tokens: [depth(node)].
  std::vector<int32_t> path_tokens(int32_t node) const;
  // Product of draft_prob along path_to(node); 1 for kRoot. O(depth).
  double path_prob(int32_t node) const;

  // [num_slots]: root_position, then root_position + depth(i) for node i.
  std::vector<int32_t> positions(int32_t root_position) const;

  // num_slots^2: the size of the request's mask segment.
  int64_t num_mask_bits() const;
  // Writes the ancestor mask's num_mask_bits() bits (ones and zeros) into `bits` starting at bit
  // `bit_offset` (the request's mask_indptr entry); other bits are left alone. bits must hold
  // bit_offset + num_mask_bits() bits (CHECKed). O(num_slots * max_depth + num_mask_bits).
  void write_mask(std::span<uint8_t> bits, int64_t bit_offset) const;
  // The mask alone: [ceil(num_mask_bits() / 8)] bytes, segment at bit 0.
  std::vector<uint8_t> packed_mask() const;

  // Adds `other` to this tree, other's root being this root; returns where each node of other
  // went: [other.num_nodes()]. Nodes of other are taken in index order; a one-hot node whose
  // (mapped) parent already has a child with the same token is merged into the first such
  // child (so shared prefixes of several proposals appear once and their continuations become
  // siblings); every other node is appended as a new last child, a sampled node always (a
  // drawn token must keep its own try, see rejection_sampler.h). Other's distributions are appended
  // and renumbered. Merging keeps every verification rule exact (docs/sampling.md).
  std::vector<int32_t> merge(const TokenTree& other);

  friend bool operator==(const TokenTree& a, const TokenTree& b);

 private:
  std::vector<TreeNode> nodes_;
  std::vector<std::vector<int32_t>> children_;  // [num_slots] children of slot s
  std::vector<std::vector<Candidate>> draft_dists_;
};

}  // namespace arbor::sampling
