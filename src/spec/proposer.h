// Proposer: the drafting half of speculative decoding, one interface for every drafter (the
// n-gram and suffix proposers here, the draft model in executor/draft_proposer.h). Each step
// the executor asks a proposer for a TokenTree of drafts per request (a chain is the width-1
// tree); the target verifies it in one forward and the RejectionSampler accepts a path.
// docs/proposers.md describes the proposers built on this.
//
// Lifecycle of one request, as the executor drives it:
//   propose()  every step the request may speculate; its token_ids are the committed tokens
//              (prompt + accepted output, including the tokens this step emits), which only
//              grow between calls
//   observe()  after verification: how many of the drafted tokens the target accepted
//   forget()   once, when the request finishes, is preempted or is reset to its prompt
// A preemption that keeps the committed tokens and only recomputes their KV needs no forget()
// for correctness (the executor still sends one; model-free proposers then rebuild their index).
//
// Threading: engine thread only; a proposer holds no locks. Ownership: the proposer copies what
// it keeps; spans passed in need to live only for the call.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "sampling/rejection_sampler.h"
#include "sampling/sampling_params.h"
#include "sampling/token_tree.h"

namespace arbor::spec {

using RequestId = uint64_t;

struct DraftRequest {
  RequestId request_id = 0;
  std::span<const int32_t> token_ids;  // [num_tokens] committed prompt + generated tokens
  int32_t num_prompt_tokens = 0;       // token_ids[0, num_prompt_tokens) is the prompt
  int32_t max_depth = 0;               // levels (a chain's length), >= 0; 0: propose nothing
  // > 0: a tree of at most this many nodes and max_width children per node; 0: a chain.
  int32_t max_nodes = 0;
  int32_t max_width = 1;
  // Model drafters only (ignored by model-free ones):
  const sampling::SamplingParams* sampling = nullptr;  // the request's own
  uint64_t seed = 0;
  // [num_blocks] the request's group-0 block table, covering N - 1 + the lookahead slots.
  std::span<const int32_t> block_ids;
  // Set: draw every node from the drafter's q and keep q in the tree (a chain's nodes one group
  // each; a tree's siblings with or without replacement), for the stochastic rule. Unset: the
  // nodes are chosen (a chain sampled with the request's params, a tree of the most probable
  // children) and one-hot.
  std::optional<sampling::SiblingDraws> draw;
  // Drafters that read the target's hidden states (Proposer::reads_hidden()): the target's final
  // hidden rows (after its output norm) the step just run computed for this request's committed
  // positions [hidden_position, hidden_position + rows), [rows, dim]; empty when none.
  std::span<const float> hidden;
  int64_t hidden_position = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;

  // out is resized to requests.size(); out[i] = requests[i]'s drafts: at most max_depth levels
  // and (a tree) max_nodes nodes or (a chain) max_depth nodes, parents first; possibly empty.
  // Precondition: for a request id seen before (and not forgotten since), token_ids extends
  // the tokens of the previous call. Errors come from a model's forward.
  virtual Status propose(std::span<const DraftRequest> requests,
                         std::vector<sampling::TokenTree>& out) = 0;

  // The target accepted num_accepted of the num_drafted tokens last proposed for `id`.
  virtual void observe(RequestId id, int32_t num_drafted, int32_t num_accepted) {}

  // The request finished (or was reset to its prompt); drops its per-request state. token_ids is
  // its final committed sequence ([num_tokens], the first num_prompt_tokens the prompt), which a
  // proposer with a cross-request index learns from. Unknown ids are fine.
  virtual void forget(RequestId id, std::span<const int32_t> token_ids,
                      int32_t num_prompt_tokens) = 0;

  // A model drafter: draws from a distribution q (DraftRequest::draw means something), writes
  // K/V into the request's slots past its committed tokens (the scheduler reserves lookahead),
  // mirrors the target's copy-on-write copies, and costs token_cost() seconds per draft token.
  virtual bool is_model() const { return false; }
  // A drafter that reads the target's hidden states (an MTP head): it is called every step for
  // every running request the step computed rows of, with those rows (DraftRequest::hidden) and
  // max_depth 0 where the request is not to draft, so that it keeps up with every request.
  virtual bool reads_hidden() const { return false; }
  virtual void copy_block(int32_t src_block, int32_t dst_block) {}
  virtual double token_cost() const { return 0.0; }
};

// One candidate continuation of a request (model-free proposers).
struct DraftCandidate {
  std::vector<int32_t> token_ids;  // [num_draft_tokens] first draft token first
  double score = 0.0;              // the proposer's estimate of the tokens the target accepts
};

// A model-free proposer: its drafts are candidate continuations, merged into one tree.
class CandidateProposer : public Proposer {
 public:
  // A chain: the best candidate. A tree: the max_width best candidates merged by
  // tree_from_candidates, cut to max_nodes.
  Status propose(std::span<const DraftRequest> requests,
                 std::vector<sampling::TokenTree>& out) final;

  // Up to max_branches distinct candidate continuations for one request, best (highest score)
  // first, each at most request.max_depth long (and the proposer's own cap); max_branches 1
  // may take a faster path with the same first candidate. Same preconditions and state
  // updates as propose().
  virtual void candidates(const DraftRequest& request, int32_t max_branches,
                          std::vector<DraftCandidate>& out) = 0;

 private:
  std::vector<DraftCandidate> scratch_;
};

// The candidates ([best first]) as one one-hot tree: shared prefixes once, continuations as
// siblings (TokenTree::merge). The first candidate's nodes get draft_prob 1, each further
// candidate's new nodes its score relative to the first's (clamped to [0, 1]). At most
// max_nodes nodes (the tree's first ones, parents first).
sampling::TokenTree tree_from_candidates(std::span<const DraftCandidate> candidates,
                                         int32_t max_nodes);

}  // namespace arbor::spec
