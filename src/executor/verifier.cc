#include "executor/verifier.h"

#include <algorithm>
#include <limits>
#include <span>

namespace arbor::executor {

step::RequestResult Verifier::verify(const step::ScheduledRequest& s, const RequestState& st,
                                     const sampling::TokenTree& tree,
                                     std::optional<sampling::SiblingDraws> rule,
                                     const RequestRows& rows, GrammarStates& grammars) {
  step::RequestResult r;
  r.request_id = s.request_id;
  r.num_draft_tokens = tree.num_nodes();
  if (rows.logits != nullptr) {  // argmax rows have nothing to mask (argmax_suffices)
    r.error = mask(s, st, tree, rows.logits, grammars);
    if (!r.error.ok()) return r;
  }
  std::optional<sampling::LogitsTarget> logits_target;
  std::optional<sampling::ArgmaxTarget> argmax_target;
  if (rows.logits != nullptr) {
    logits_target.emplace(
        sampler_, sampling::LogitsTarget::Rows{
                      .logits = std::span<const float>(
                          rows.logits, static_cast<size_t>(tree.num_slots()) * vocab_),
                      .vocab_size = vocab_,
                      .params = &st.sampling,
                      .history = {st.prompt_ids(), st.output_ids()},
                      .tree = &tree});
  } else {
    argmax_target.emplace(rows.argmax);
  }
  sampling::TargetDistributions& target =
      logits_target ? static_cast<sampling::TargetDistributions&>(*logits_target)
                    : *argmax_target;
  sampling::CounterDrawSource draws(st.seed);
  const auto position = static_cast<int64_t>(st.token_ids.size());
  const sampling::Verdict verdict =
      rule ? rejection_.verify(tree, position, target, draws, *rule)
           : rejection_.verify_sample_and_compare(tree, position, target, draws);
  r.num_accepted = verdict.num_accepted();
  r.accepted_draft_indices = verdict.accepted_nodes;
  for (int32_t i = 0; i <= r.num_accepted; ++i) {
    const bool accepted = i < r.num_accepted;
    const int32_t token =
        accepted ? tree.node(verdict.accepted_nodes[i]).token_id : verdict.next_token;
    const int32_t slot = i == 0 ? 0 : verdict.accepted_nodes[i - 1] + 1;  // the parent's row
    r.tokens.push_back(emitted(rows, slot, token, st));
  }
  return r;
}

Status Verifier::mask(const step::ScheduledRequest& s, const RequestState& st,
                      const sampling::TokenTree& tree, float* logits, GrammarStates& grammars) {
  ARBOR_ASSIGN_OR_RETURN(grammar::OutputGrammar* g, grammars.sync(s.request_id, st));
  if (g != nullptr) {
    ARBOR_RETURN_IF_ERROR(GrammarStates::mask_drafts(
        *g, tree,
        std::span<float>(logits, static_cast<size_t>(tree.num_slots()) *
                                     static_cast<size_t>(vocab_))));
  }
  if (st.sampling.min_tokens > 0) mask_min_tokens(st, tree, logits);
  return ok_status();
}

// min_tokens: rows whose token would be output number < min_tokens get -inf for the banned ids
// (row 0 is output number num_outputs, row 1 + i is at depth(i) after it). A row where nothing
// else is allowed (a completed grammar) keeps them.
void Verifier::mask_min_tokens(const RequestState& st, const sampling::TokenTree& tree,
                               float* logits) {
  const auto vocab = static_cast<size_t>(vocab_);
  const auto produced = static_cast<int64_t>(st.output_ids().size());
  for (int32_t row = 0; row < tree.num_slots(); ++row) {
    const int64_t output_index = produced + tree.depth(row - 1);
    if (output_index >= st.sampling.min_tokens) continue;
    float* r = logits + static_cast<size_t>(row) * vocab;
    bool other = false;
    for (size_t t = 0; t < vocab && !other; ++t) {
      other = r[t] != -std::numeric_limits<float>::infinity() &&
              !std::binary_search(st.sampling.min_tokens_banned.begin(),
                                  st.sampling.min_tokens_banned.end(), static_cast<int32_t>(t));
    }
    if (!other) continue;
    for (int32_t id : st.sampling.min_tokens_banned) {
      r[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    }
  }
}

step::SampledToken Verifier::emitted(const RequestRows& rows, int32_t row, int32_t token,
                                     const RequestState& st) {
  if (rows.logits == nullptr) return step::SampledToken{token, 0.0f, {}};  // no logprobs asked
  const auto vocab = static_cast<size_t>(vocab_);
  sampling::SampleResult sr = sampler_.score(
      std::span<const float>(rows.logits + static_cast<size_t>(row) * vocab, vocab), token,
      st.sampling);
  return step::SampledToken{
      .token_id = token, .logprob = sr.logprob, .top_logprobs = std::move(sr.top_logprobs)};
}

}  // namespace arbor::executor
