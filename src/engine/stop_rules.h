// The token ids that end generation by default: one rule for every entry point (the OpenAI and
// TGI routes of `arbor serve`, `arbor generate`), applied in one place, EngineCoreConfig's
// default eos_token_ids. Callers never add these ids to GenerateRequest::stop_token_ids
// themselves; GenerateRequest::ignore_eos turns all of them off.
//
// The rule: the tokenizer's end-of-generation ids (Tokenizer::eog_ids(): EOS plus end-of-turn
// markers), plus BOS when the vocabulary has one. BOS is there for llama2.c-trained models
// (stories*, TinyStories): they were trained on stories joined by BOS, so after a story they
// sample BOS and start the next one; they never emit their vocabulary's EOS. A sampled BOS
// therefore means "this document is over", for those models and any other (a model that
// starts a new document mid-answer has finished the old one).
//
// Thread-safety: pure function; the Tokenizer is immutable.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace arbor::engine {

// eog_ids() plus bos_id() when it is >= 0 and not already one of them. Sorted, no duplicates.
std::vector<int32_t> default_stop_token_ids(const tokenizer::Tokenizer& tokenizer);

}  // namespace arbor::engine
