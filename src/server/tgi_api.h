// The text-generation-inference (TGI) compatible API: POST /generate and POST /generate_stream
// ({"inputs": "...", "parameters": {...}}), GET /info. Validation errors answer 422 with
// {"error": "...", "error_type": "validation"} as TGI does (api_errors.cc).
//
// Parameters: max_new_tokens (default 20), temperature, top_k, top_p, repetition_penalty,
// frequency_penalty, seed, stop, do_sample, details, return_full_text, best_of, truncate;
// extension: ignore_eos (as on the OpenAI routes: EOS and BOS do not end the sample).
// Streaming sends one event per token, {"index", "token": {id, text, logprob, special},
// "generated_text": null, "details": null}, the last one with generated_text and details.
// Thread-safety: prepare_tgi and tgi_info_json are pure (any thread: the server runs prepare_tgi
// on a worker); a builder belongs to one request (I/O thread).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_common.h"

namespace arbor::server {

std::optional<ApiError> prepare_tgi(const nlohmann::json& body, const ModelInfo& model,
                                    bool stream, PreparedRequest* out);
// The body of GET /info.
std::string tgi_info_json(const ModelInfo& model, int32_t max_concurrent_requests);

}  // namespace arbor::server
