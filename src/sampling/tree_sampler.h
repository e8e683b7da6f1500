// Token-tree verification: the tree counterpart of RejectionSampler (rejection_sampler.h, whose
// DrawSource, CounterDrawSource and draw-site conventions it shares). Given a TokenTree of
// drafts rooted at the request's last committed token and the target's distribution at every
// visited node, walk down one root-to-node path, accepting one child per level, and emit one
// more token: a *recovered* token when every child of the last accepted node was rejected, a
// *bonus* token when that node is a leaf. Lossless: the emitted tokens are distributed exactly as
// tokens sampled one by one from the target, over the joint randomness of drafting the tree and
// verifying it, provided the tree was drafted as its nodes say (below). Proofs and a picture:
// docs/sampling.md, "Tree verification"; tests/sampling/tree_* enumerate them.
//
// Stochastic rule (SpecInfer's multi-step speculative sampling; Sequoia's variant). At the
// current node u (the root first) with target p_u: r = p_u; try u's children c_0, c_1, ... in
// stored order; try i accepts c_i with probability min(1, r(c_i) / q_i(c_i)) and descends to
// it; a rejection sets r = norm(max(0, r - q_i)). When all are rejected the recovered token is
// drawn from r. q_i, the distribution child i's token came from given everything before it:
//   * one-hot node (draft_dist == kOneHot; a fixed function of its path): q_i = one-hot(c_i),
//     so the try accepts with r(c_i) and a rejection zeroes c_i in r. Both variants.
//   * sampled node of group g (draft_dist == g):
//       SiblingDraws::kWithReplacement (SpecInfer): the group's tokens were drawn i.i.d. from
//         q_g, and every draw is its own node (repeats included): q_i = q_g.
//       SiblingDraws::kWithoutReplacement (Sequoia): drawn without replacement from q_g, in the
//         stored order: q_i = q_g with the tokens of the earlier children of group g removed,
//         renormalised.
// Exactness needs exactly that: conditional on the path and on every earlier try at u, child
// i's token has law q_i. Top-k / best-first trees (build_tree) choose rather than draw, so they
// are one-hot trees; a model's q on them would not be exact. Degenerate tries (q_i(c_i) = 0,
// impossible for a drawn token) reject; a rejection whose residual has no mass (only reachable
// that way, or by rounding) leaves r unchanged.
//
// Greedy rule: the longest path whose every token is the argmax (ties to the lower id) of the
// target at its parent, then the argmax at its end. Needs no draws.
//
// Draw sites (Rng::at(seed, position, stream)); `position` is the absolute position of the
// root's children (the chain's DraftChain::position); the node being verified sits at depth d,
// its children at position + d:
//   tree_accept_stream(i)  the coin of the i-th child tried at that node (kAccept for i = 0)
//   kRecover               the recovered token after all children of that node were rejected
//   kSample                the bonus token at a leaf (the site plain decoding draws with)
// One node is verified per depth, so no site is drawn twice; a width-1 tree (a chain) draws the
// chain sampler's sites with its probabilities and gets its verdict (tested).
//
// Thread-safety: scratch space like RejectionSampler: one per engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/rejection_sampler.h"
#include "sampling/token_tree.h"

namespace arbor::sampling {

enum class SiblingDraws {
  kWithReplacement,     // SpecInfer: sampled siblings i.i.d. from their group's q
  kWithoutReplacement,  // Sequoia: sampled siblings without replacement from their group's q
};

// The target's distributions at the nodes of one tree, computed on demand.
class TreeTargetDistributions {
 public:
  virtual ~TreeTargetDistributions() = default;
  // p at `node` (TokenTree::kRoot or a node index): the target's distribution for the token
  // after node's path, after the request's transforms with history = prompt + outputs +
  // path_tokens(node). Called at most once per node, only for the root or for a node whose
  // whole path was accepted (greedy: matches the argmax). The span must stay valid until the
  // next call or the end of the verification.
  virtual std::span<const Candidate> at(int32_t node) = 0;
};

// TreeTargetDistributions over a verification pass's logits rows, one per slot: p(node) =
// distribution(row slot(node) after apply_penalties with history prompt + outputs +
// path_tokens(node), CandidateOrder::kById). Borrows everything; one per verification.
class TreeLogitsTarget final : public TreeTargetDistributions {
 public:
  struct Rows {
    std::span<const float> logits;  // [tree->num_slots(), vocab_size] rows by slot, row-major
    int64_t vocab_size = 0;
    const SamplingParams* params = nullptr;
    TokenHistory history;  // prompt and outputs up to and including the root token
    const TokenTree* tree = nullptr;
  };
  TreeLogitsTarget(Sampler& sampler, const Rows& rows);
  std::span<const Candidate> at(int32_t node) override;

 private:
  Sampler& sampler_;
  Rows rows_;
  std::vector<int32_t> outputs_;  // history.output_ids + the path
  std::vector<float> row_;        // [vocab_size]
  std::vector<Candidate> dist_;
};

// TreeTargetDistributions of a greedy request whose transforms cannot move its argmax (as
// ArgmaxTarget): p(node) = one-hot(argmax_ids[slot(node)]), slot(root) = 0, slot(i) = 1 + i.
// Borrows argmax_ids.
class TreeArgmaxTarget final : public TreeTargetDistributions {
 public:
  explicit TreeArgmaxTarget(std::span<const int32_t> argmax_ids) : ids_(argmax_ids) {}
  std::span<const Candidate> at(int32_t node) override;

 private:
  std::span<const int32_t> ids_;  // [num_slots]
  Candidate one_;
};

struct TreeVerdict {
  std::vector<int32_t> accepted_nodes;  // [num_accepted] a path from a child of the root
  int32_t next_token = 0;  // emitted after them, at position + num_accepted
  bool is_bonus = false;   // the last accepted node (or the root) has no children
  int32_t num_accepted() const { return static_cast<int32_t>(accepted_nodes.size()); }
};

class TreeRejectionSampler {
 public:
  // The stochastic rule (header comment). position: absolute position of depth-1 tokens.
  TreeVerdict verify(const TokenTree& tree, int64_t position, TreeTargetDistributions& target,
                     DrawSource& draws, SiblingDraws sibling_draws);

  // Sample-and-compare, the rule plain decoding's draws reproduce: at the current node (the root
  // first, depth d) draw x from its target at (position + d, kSample), the site plain decoding
  // draws the token at that position with; descend to the first child with token x, else emit x.
  // Lossless for any tree whatever its draft_dist (every token is the target's own draw), and
  // for a seeded request token for token what it produces without speculation; greedy targets
  // make it the greedy rule. Accepts less than verify() with drawn siblings.
  TreeVerdict verify_sample_and_compare(const TokenTree& tree, int64_t position,
                                        TreeTargetDistributions& target, DrawSource& draws);

  // The greedy rule: accepted = the longest argmax-consistent path (the first of equally long
  // ones in child order), next_token = the argmax at its end. Asks `target` for every node
  // whose path is argmax-consistent.
  TreeVerdict verify_greedy(const TokenTree& tree, TreeTargetDistributions& target);

 private:
  // Fills q_ (increasing id) with q_i of the i-th child of `children`; returns its mass (q_i =
  // q_ / mass), 0 when nothing is left to draw from.
  double draft_for(const TokenTree& tree, std::span<const int32_t> children, size_t i,
                   SiblingDraws sibling_draws);
  void greedy_from(const TokenTree& tree, int32_t node, TreeTargetDistributions& target,
                   TreeVerdict& out);

  // r = weights_ / mass (increasing id) during a verification; scratch otherwise.
  std::vector<Candidate> weights_, next_, q_;
  std::vector<int32_t> excluded_;
};

// Draws `count` children of `parent` from q, for a sampled tree: registers q as one new group
// and draws at (position + depth(parent), tree_draft_stream(draw_index++)) one token per child
// (kWithReplacement: from q each time, repeats become separate nodes; kWithoutReplacement: from
// q without the group's earlier tokens, stopping early when q's support is used up). Each node
// gets draft_prob = q(token). draw_index counts the draws at that depth over all parents (the
// caller keeps one per depth, from 0). Returns the number of children added.
int32_t append_sampled_children(TokenTree& tree, int32_t parent, std::vector<Candidate> q,
                                int32_t count, SiblingDraws sibling_draws, int64_t position,
                                int32_t& draw_index, DrawSource& draws);

// The most probable candidate of dist, ties to the lower id. dist non-empty (CHECKed).
int32_t argmax_token(std::span<const Candidate> dist);

}  // namespace arbor::sampling
