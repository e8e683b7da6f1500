// Drafter: the executor's speculation state. It owns the proposer (n-gram, suffix or draft model:
// one spec::Proposer interface), asks it for drafts after each step for the requests the
// scheduler asked (ScheduledRequest::max_next_draft_tokens / max_next_draft_nodes), keeps each
// request's TokenTree (with the q of drawn nodes) until the next step, and hands the first k
// nodes back for verification (ScheduledRequest::num_drafts). Only the drafts' shape leaves the
// executor (step::DraftShape): tokens and distributions never travel to the scheduler.
//
// Which verification rule a request's drafts get is decided here, once (rule()):
//   * drafts drawn from a draft model's q — unseeded sampling requests; chains always, trees with
//     --spec-tree-sampling specinfer|sequoia — the stochastic rule with their q (highest
//     acceptance);
//   * every other draft (greedy and seeded requests, model-free proposers, top-k trees) is
//     one-hot and verified by sample-and-compare, whose output is token for token what the
//     request produces without speculation.
// Drafts are cut to what the request's grammar accepts (structured output) unless drawn from q
// (dropping a drawn node would change the law of its siblings).
//
// Threading: the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "executor/executor_options.h"
#include "executor/grammar_states.h"
#include "executor/request_states.h"
#include "sampling/rejection_sampler.h"
#include "sampling/token_tree.h"
#include "spec/proposer.h"
#include "step/step.h"

namespace arbor::executor {

// The target's hidden rows of one scheduled request's committed positions the step computed,
// for a proposer that reads them (spec::Proposer::reads_hidden): [rows, dim] at positions
// [position, position + rows); empty when none.
struct TargetHidden {
  std::span<const float> rows;
  int64_t position = 0;
};

// Proposers may propose this many levels; the scheduler asks for at most --spec-k.
inline constexpr int32_t kMaxProposedTokens = 16;

struct DrafterOptions {
  int32_t tree_budget = 0;  // most nodes of a tree, 0: chains only
  int32_t tree_width = 4;   // most children per node
  TreeSampling tree_sampling = TreeSampling::kTopK;
  std::vector<int32_t> tree_static_widths;  // a draft model's static tree shape (empty: dynamic)
};

// ok when the options are within the flags' limits (the message names the flag and the limit).
Status check_drafter_options(const DrafterOptions& options);

class Drafter {
 public:
  Drafter(std::unique_ptr<spec::Proposer> proposer, DrafterOptions options);

  const spec::Proposer& proposer() const { return *proposer_; }
  const DrafterOptions& options() const { return options_; }

  // The drafts to verify for `s`: the first s.num_drafts nodes of the tree kept for it (empty
  // when 0). kInternal when fewer are kept.
  Result<sampling::TokenTree> drafts_to_verify(const step::ScheduledRequest& s) const;

  // The token of kept draft k for `id` when drafts 0 .. k form a chain (draft i's parent is
  // draft i - 1): the draft after the first k, which a step that verified those k (all
  // accepted) did not verify. None when fewer are kept or they branch. k = 0: the proposer's
  // best first token.
  std::optional<int32_t> chain_draft(step::RequestId id, int32_t k) const;

  // The stochastic rule's sibling draws when `tree` holds drafts drawn from q; none: verify by
  // sample-and-compare.
  std::optional<sampling::SiblingDraws> rule(const sampling::TokenTree& tree) const;

  // Proposes for every request of `output` that asks for drafts and has a successful result in
  // `result` (its context: st.token_ids + the result's tokens), keeps the trees and writes each
  // result's next_drafts; every other request's kept tree is dropped. Tells the proposer how
  // many drafts each verification accepted first. A proposer that reads the target's hidden
  // states also gets every other running (non-pooling) request the step ran without an error,
  // with max_depth 0, and each request's rows of `hidden` ([output.requests]).
  Status propose(const step::SchedulerOutput& output, step::StepResult& result,
                 RequestStates& states, GrammarStates& grammars,
                 std::span<const TargetHidden> hidden = {});

  void forget(step::RequestId id, const RequestState& st);
  void copy_block(int32_t src, int32_t dst) { proposer_->copy_block(src, dst); }

 private:
  spec::DraftRequest request(const step::ScheduledRequest& s, const RequestState& st,
                             std::span<const int32_t> context) const;
  std::optional<sampling::SiblingDraws> draws_for(const RequestState& st, bool tree) const;
  // Cuts `tree` to the nodes whose whole path the request's grammar accepts after `emitted`.
  static Status constrain(sampling::TokenTree& tree, const RequestState& st, step::RequestId id,
                          std::span<const int32_t> emitted, GrammarStates& grammars);

  std::unique_ptr<spec::Proposer> proposer_;
  DrafterOptions options_;
  std::unordered_map<step::RequestId, sampling::TokenTree> trees_;
};

// The shape of `tree` as the scheduler sees it; probabilities only for one-hot trees, and only
// when some node's is below 1 (step::DraftShape::probs).
step::DraftShape draft_shape(const sampling::TokenTree& tree);

}  // namespace arbor::executor
