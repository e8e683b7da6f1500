// Prompt logprobs (the API's prompt_logprobs / echo): which logits rows a step needs for them and
// how each prompt position is scored from its row. Position p is scored by the row of position
// p - 1 (raw logits, before any grammar mask), so a step that runs committed tokens [c, c + n)
// can score positions [c + 1, c + n + 1) (ScheduledRequest::prompt_logprobs_begin / _end).
//
// Threading: the engine thread only.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "executor/request_states.h"
#include "model/batch_builder.h"
#include "sampling/sampler.h"
#include "step/step.h"

namespace arbor::executor {

// Sets `in`'s logits to the rows the range [begin, end) needs: the sequence's rows
// [begin - 1 - c, end - 1 - c); with sampling, the rows up to the last one too (the sampling row
// follows the prompt rows; rows between them, which only a recompute past the prompt could
// leave, are computed and ignored). kInternal when the range is outside what this step runs or
// the request did not ask for prompt logprobs. Only these requests pay for LM-head rows beyond
// their sampling row.
Status set_prompt_logprobs_rows(const step::ScheduledRequest& s, const RequestState& st,
                                int32_t num_committed_run, model::SequenceInput& in);

// Scores the prompt positions [begin, end) of `s` from its rows ([end - begin, vocab_size], row
// i scoring position begin + i).
step::PromptLogprobsResult score_prompt(sampling::Sampler& sampler,
                                        const step::ScheduledRequest& s, const RequestState& st,
                                        const float* rows, int32_t vocab_size);

}  // namespace arbor::executor
