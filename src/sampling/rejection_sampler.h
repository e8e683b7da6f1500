// Speculative decoding's verification step, one rule set for every draft shape (vocabulary of
// vLLM, SpecInfer and Sequoia). The drafts are a TokenTree rooted at the request's last committed
// token; a chain of k drafts is the width-1 tree (TokenTree::from_chain). Given the target's
// distribution at every visited node, the verifier walks down one root-to-node path, accepting
// one child per level, and emits one more token: a *recovered* token when every child of the
// last accepted node was rejected, a *bonus* token when that node is a leaf. The emitted tokens
// are distributed exactly as tokens sampled one by one from the target, over the joint
// randomness of drafting and verifying, provided the tree was drafted as its nodes say (below).
// Proofs and pictures: docs/sampling.md ("Rejection sampling", "Tree verification");
// tests/sampling enumerate every outcome.
//
// Distributions are sparse std::vector<Candidate> as Sampler::distribution() returns them, after
// the request's own transforms (penalties, temperature, top-k / top-p / min-p) for the target,
// and whatever the proposer drew from for a draft model; each sums to 1 within rounding, any
// order (CandidateOrder::kById is cheapest).
//
// Stochastic rule, verify() (Leviathan et al. and Chen et al. 2023 for a chain; SpecInfer's
// multi-step speculative sampling and Sequoia's variant for siblings). At the current node u (the
// root first) with target p_u: r = p_u; try u's children c_0, c_1, ... in stored order; try i
// accepts c_i with probability min(1, r(c_i) / q_i(c_i)) and descends to it; a rejection sets
// r = norm(max(0, r - q_i)). When all are rejected the recovered token is drawn from r. q_i, the
// distribution child i's token came from given everything before it:
//   * one-hot node (draft_dist == kOneHot; a fixed function of its path): q_i = one-hot(c_i), so
//     the try accepts with r(c_i) and a rejection zeroes c_i in r.
//   * sampled node of group g (draft_dist == g):
//       SiblingDraws::kWithReplacement (SpecInfer): the group's tokens were drawn i.i.d. from
//         q_g, and every draw is its own node (repeats included): q_i = q_g. A model-drafted
//         chain (one node per group) is verified this way.
//       SiblingDraws::kWithoutReplacement (Sequoia): drawn without replacement from q_g, in the
//         stored order: q_i = q_g with the tokens of the earlier children of group g removed,
//         renormalised.
// Exactness needs exactly that: conditional on the path and on every earlier try at u, child
// i's token has law q_i. Top-k trees choose rather than draw, so they
// are one-hot trees. Degenerate tries (q_i(c_i) = 0, impossible for a drawn token) reject; a
// rejection whose residual has no mass (only reachable that way, or by rounding) leaves r
// unchanged.
//
// Sample-and-compare, verify_sample_and_compare(): at the current node draw x from its target
// at the site plain decoding draws that position with; descend to the first child with token x,
// else emit x. Lossless for any tree, and for a seeded request token for token what it produces
// without speculation (given bitwise-equal logits rows); greedy targets make it the greedy rule.
//
// Draw sites (Rng::at(seed, position, stream)); `position` is the absolute position of the
// root's children; the node being verified sits at depth d, its children at position + d:
//   tree_accept_stream(i)  the coin of the i-th child tried at that node (kAccept for i = 0)
//   kRecover               the recovered token after all children of that node were rejected
//   kSample                the bonus token at a leaf; every draw of sample-and-compare. This is
//                          the site a non-speculative step samples that position with, and
//                          CounterDrawSource::categorical(distribution(row), pos, kSample) is
//                          the token Sampler::sample(row, ..., Rng::at(seed, pos, kSample))
//                          returns (tested), so the executor may take the verdict's token and
//                          call Sampler::score() for its logprobs.
//   kDraft / tree_draft_stream(j)  a model proposer's draws (append_sampled_children)
// One node is verified per depth, so no site is drawn twice in one verification (tested).
//
// Thread-safety: a RejectionSampler is scratch space like Sampler: one per engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/token_tree.h"

namespace arbor::sampling {

// The randomness of one verification. Each draw names its site; a source must treat distinct
// sites as independent draws.
class DrawSource {
 public:
  virtual ~DrawSource() = default;
  // True with probability `prob`: prob <= 0 (or NaN) never, prob >= 1 always.
  virtual bool bernoulli(double prob, int64_t position, RngStream stream) = 0;
  // A token of `dist` with probability prob / (sum of the positive probs); entries with
  // prob <= 0 never. dist: distinct ids, any order, positive total (CHECKed).
  virtual int32_t categorical(std::span<const Candidate> dist, int64_t position,
                              RngStream stream) = 0;
};

// The real draws of a request with seed `seed`: site (position, stream) takes
// u = Rng::at(seed, position, stream).next_double(); bernoulli is u < prob, categorical is
// inverse_cdf(dist, u).
class CounterDrawSource final : public DrawSource {
 public:
  explicit CounterDrawSource(uint64_t seed) : seed_(seed) {}
  bool bernoulli(double prob, int64_t position, RngStream stream) override;
  int32_t categorical(std::span<const Candidate> dist, int64_t position,
                      RngStream stream) override;

 private:
  uint64_t seed_;
};

enum class SiblingDraws {
  kWithReplacement,     // SpecInfer: sampled siblings i.i.d. from their group's q
  kWithoutReplacement,  // Sequoia: sampled siblings without replacement from their group's q
};

// The target's distributions at the nodes of one tree, computed on demand.
class TargetDistributions {
 public:
  virtual ~TargetDistributions() = default;
  // p at `node` (TokenTree::kRoot or a node index): the target's distribution for the token
  // after node's path, after the request's transforms with history = prompt + outputs +
  // path_tokens(node). Called at most once per node, only for the root or for a node whose
  // whole path was accepted (greedy: matches the argmax). The span must stay valid until the
  // next call or the end of the verification.
  virtual std::span<const Candidate> at(int32_t node) = 0;
};

// TargetDistributions over a verification pass's logits rows, one per slot: p(node) =
// distribution(row slot(node) after apply_penalties with history prompt + outputs +
// path_tokens(node), CandidateOrder::kById). Borrows everything; one per verification.
class LogitsTarget final : public TargetDistributions {
 public:
  struct Rows {
    std::span<const float> logits;  // [tree->num_slots(), vocab_size] rows by slot, row-major
    int64_t vocab_size = 0;
    const SamplingParams* params = nullptr;
    TokenHistory history;  // prompt and outputs up to and including the root token
    const TokenTree* tree = nullptr;
  };
  LogitsTarget(Sampler& sampler, const Rows& rows);
  std::span<const Candidate> at(int32_t node) override;

 private:
  Sampler& sampler_;
  Rows rows_;
  std::vector<int32_t> outputs_;  // history.output_ids + the path
  std::vector<float> row_;        // [vocab_size]
  std::vector<Candidate> dist_;
};

// TargetDistributions of a greedy request whose transforms cannot move its argmax (no
// logit_bias, penalties, grammar or min_tokens mask): p(node) = one-hot(argmax_ids[slot(node)]),
// slot(root) = 0, slot(i) = 1 + i, which is what LogitsTarget gives for such a request
// (Sampler::distribution of greedy params is the argmax, ties to the lowest id, with probability
// 1). The argmax comes from the device (ForwardOps::argmax_rows), so the rows' logits need not
// reach the host. Borrows argmax_ids.
class ArgmaxTarget final : public TargetDistributions {
 public:
  explicit ArgmaxTarget(std::span<const int32_t> argmax_ids) : ids_(argmax_ids) {}
  std::span<const Candidate> at(int32_t node) override;

 private:
  std::span<const int32_t> ids_;  // [num_slots]
  Candidate one_;
};

struct Verdict {
  std::vector<int32_t> accepted_nodes;  // [num_accepted] a path from a child of the root
  int32_t next_token = 0;  // emitted after them, at position + num_accepted
  bool is_bonus = false;   // the last accepted node (or the root) has no children
  int32_t num_accepted() const { return static_cast<int32_t>(accepted_nodes.size()); }
};

class RejectionSampler {
 public:
  // The stochastic rule (header comment). position: absolute position of depth-1 tokens.
  Verdict verify(const TokenTree& tree, int64_t position, TargetDistributions& target,
                 DrawSource& draws, SiblingDraws sibling_draws);

  // Sample-and-compare (header comment). Accepts less than verify() with drawn siblings.
  Verdict verify_sample_and_compare(const TokenTree& tree, int64_t position,
                                    TargetDistributions& target, DrawSource& draws);

  // The greedy rule: accepted = the longest argmax-consistent path (the first of equally long
  // ones in child order), next_token = the argmax at its end. Asks `target` for every node
  // whose path is argmax-consistent. Needs no draws.
  Verdict verify_greedy(const TokenTree& tree, TargetDistributions& target);

 private:
  // Fills q_ (increasing id) with q_i of the i-th child of `children`; returns its mass (q_i =
  // q_ / mass), 0 when nothing is left to draw from.
  double draft_for(const TokenTree& tree, std::span<const int32_t> children, size_t i,
                   SiblingDraws sibling_draws);
  void greedy_from(const TokenTree& tree, int32_t node, TargetDistributions& target,
                   Verdict& out);

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

// dist(token), or 0 when the token is not listed. O(n).
double prob_of(std::span<const Candidate> dist, int32_t token_id);

// The standard rule's acceptance probability for one draft: min(1, p(token) / q(token)); 0 when
// q(token) <= 0 (the draft cannot have come from q).
double acceptance_probability(std::span<const Candidate> p, std::span<const Candidate> q,
                              int32_t token_id);

// The standard rule's residual: the tokens x of p with max(0, p(x) - q(x)) > 0 and that weight,
// unnormalised, in increasing id; tokens outside q's support keep p(x), tokens outside p's
// support never appear. Its mass sum(max(0, p - q)) equals the probability of a rejection.
// O(n log n), O(n) when p and q are in id order. Writes into `out`.
void residual(std::span<const Candidate> p, std::span<const Candidate> q,
              std::vector<Candidate>& out);

}  // namespace arbor::sampling
