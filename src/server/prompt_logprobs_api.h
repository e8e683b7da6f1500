// Prompt logprobs in the APIs' shapes (docs/server.md, "Prompt logprobs"). Pure functions over
// the engine's PromptLogprobs (entry i scores prompt position i + 1); no I/O.
//
//   vLLM `prompt_logprobs: N` -> [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]:
//     one entry per prompt token, the first null; each dict holds the prompt token (with its rank
//     among the whole vocabulary) and the N most likely tokens (ranks 1..N).
//   OpenAI completions `echo` + `logprobs: N` -> the choice's logprobs object begins with the
//     prompt tokens: tokens, token_logprobs (first null), top_logprobs (first null, else the N
//     most likely plus the prompt token, by token text), text_offset.
//   TGI `decoder_input_details` -> details.prefill: [{id, text, logprob}], the first logprob null.
// Thread-safety: pure.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "engine/request_stream.h"
#include "server/api_errors.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server {

// Reads vLLM's `prompt_logprobs` (an integer in [0, kMaxLogprobs]; absent or null: none).
// Errors name the field and the limit.
std::optional<ApiError> read_prompt_logprobs(const nlohmann::json& body,
                                             std::optional<int32_t>* out);

// vLLM's list for a prompt of entries.size() + 1 tokens, with `n` alternatives per position
// (n <= each entry's top size).
nlohmann::json vllm_prompt_logprobs_json(const engine::PromptLogprobs& entries, int32_t n,
                                         const tokenizer::Tokenizer& tokenizer);

// Appends the prompt's tokens to an OpenAI completions logprobs object (its four arrays, which
// must be empty): prompt_ids[0] with null logprob and null top, then each scored position with
// n alternatives plus itself. text_offset: where each token's text starts in echo_text (the
// decoded prompt; tokens whose text decoding drops, such as BOS, get 0). Returns the offset
// after the prompt (echo_text.size()). entries: [prompt_ids.size() - 1].
size_t append_echo_logprobs(nlohmann::json& logprobs, std::span<const int32_t> prompt_ids,
                            const engine::PromptLogprobs& entries, int32_t n,
                            const tokenizer::Tokenizer& tokenizer, std::string_view echo_text);

// TGI's details.prefill for the prompt `prompt_ids` (entries: [prompt_ids.size() - 1]).
nlohmann::json tgi_prefill_json(std::span<const int32_t> prompt_ids,
                                const engine::PromptLogprobs& entries,
                                const tokenizer::Tokenizer& tokenizer);

}  // namespace arbor::server
