#include "executor/prompt_scorer.h"

#include <span>

namespace arbor::executor {

Status set_prompt_logprobs_rows(const step::ScheduledRequest& s, const RequestState& st,
                                int32_t num_committed_run, model::SequenceInput& in) {
  const int64_t c = s.num_computed_tokens;
  if (s.prompt_logprobs_begin < c + 1 || s.prompt_logprobs_end > c + num_committed_run + 1 ||
      s.prompt_logprobs_end > st.num_prompt_tokens || !st.sampling.prompt_logprobs ||
      s.num_draft_tokens() > 0) {
    return internal_error("request ", s.request_id, " asks prompt logprobs for positions [",
                          s.prompt_logprobs_begin, ", ", s.prompt_logprobs_end, ") from rows [",
                          c, ", ", c + num_committed_run, ") of a ", st.num_prompt_tokens,
                          "-token prompt", st.sampling.prompt_logprobs ? "" : " (not asked for)");
  }
  in.logits = model::LogitsMode::kRange;
  in.logits_begin = static_cast<int32_t>(s.prompt_logprobs_begin - 1 - c);
  in.logits_end =
      s.sample ? num_committed_run : static_cast<int32_t>(s.prompt_logprobs_end - 1 - c);
  return ok_status();
}

step::PromptLogprobsResult score_prompt(sampling::Sampler& sampler,
                                        const step::ScheduledRequest& s, const RequestState& st,
                                        const float* rows, int32_t vocab_size) {
  const auto vocab = static_cast<size_t>(vocab_size);
  step::PromptLogprobsResult r;
  r.request_id = s.request_id;
  r.first_position = s.prompt_logprobs_begin;
  for (int64_t p = s.prompt_logprobs_begin; p < s.prompt_logprobs_end; ++p) {
    const auto row = static_cast<size_t>(p - s.prompt_logprobs_begin);
    r.entries.push_back(sampler.score_prompt(std::span<const float>(rows + row * vocab, vocab),
                                             st.token_ids[static_cast<size_t>(p)],
                                             *st.sampling.prompt_logprobs));
  }
  return r;
}

}  // namespace arbor::executor
