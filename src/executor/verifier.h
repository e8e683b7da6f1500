// Verifier: one request's sampling after the forward — masks its logits rows (grammar,
// min_tokens), verifies its drafts (a TokenTree; none: plain sampling is the empty tree's
// verification) with sampling::RejectionSampler, and reports every emitted token with the
// logprobs a plain step would report for it (docs/sampling.md, "Rejection sampling" and "Tree
// verification"). The rule is the Drafter's: the stochastic rule for drafts drawn from q, else
// sample-and-compare (lossless for every request, and token for token what a greedy or seeded
// request produces without speculation).
//
// Logits rows: row 0 after the last committed token, row 1 + i after draft i's path
// ([tree.num_slots(), vocab]); greedy requests whose transforms cannot move the argmax come as
// each row's argmax only (executor/readback.h).
//
// Threading: scratch space like sampling::Sampler: one per engine thread.
#pragma once

#include <cstdint>
#include <optional>

#include "executor/grammar_states.h"
#include "executor/readback.h"
#include "executor/request_states.h"
#include "sampling/rejection_sampler.h"
#include "sampling/sampler.h"
#include "sampling/token_tree.h"
#include "step/step.h"

namespace arbor::executor {

class Verifier {
 public:
  explicit Verifier(int32_t vocab_size) : vocab_(vocab_size) {}

  // The request's result: error set (and nothing emitted) when its grammar fails; otherwise
  // the accepted path, its tokens and the next one. `rule`: Drafter::rule(tree).
  step::RequestResult verify(const step::ScheduledRequest& s, const RequestState& st,
                             const sampling::TokenTree& tree,
                             std::optional<sampling::SiblingDraws> rule, const RequestRows& rows,
                             GrammarStates& grammars);

  sampling::Sampler& sampler() { return sampler_; }

 private:
  // Grammar and min_tokens masks, in place; kFailedPrecondition when the grammar is stuck.
  Status mask(const step::ScheduledRequest& s, const RequestState& st,
              const sampling::TokenTree& tree, float* logits, GrammarStates& grammars);
  void mask_min_tokens(const RequestState& st, const sampling::TokenTree& tree, float* logits);
  // The token emitted from row `row` and, when logits are there, what Sampler::sample()
  // reports of it.
  step::SampledToken emitted(const RequestRows& rows, int32_t row, int32_t token,
                             const RequestState& st);

  int32_t vocab_;
  sampling::Sampler sampler_;
  sampling::RejectionSampler rejection_;
};

}  // namespace arbor::executor
