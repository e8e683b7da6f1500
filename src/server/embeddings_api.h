// Embeddings and reranking over pooling requests (docs/server.md, "Embeddings and rerank"):
//
//   POST /v1/embeddings   OpenAI's shape: input (a string, strings, token ids, lists of token
//                         ids) -> {"object": "list", "data": [{"object": "embedding", "index",
//                         "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}};
//                         encoding_format float | base64, dimensions (Matryoshka: the first
//                         `dimensions` values, renormalised)
//   POST /v1/rerank       Cohere's / Jina's / llama-server's: query, documents, top_n,
//                         return_documents -> {"results": [{"index", "relevance_score",
//                         "document"?}] by decreasing score, "model", "usage"}
//
// Each input (each document) is one engine request with GenerateRequest::pooling; the engine
// batches them with everything else (PreparedRequest::more_prompts), and the ResponseBuilder
// puts the vectors back in input order. Embeddings are L2-normalised as llama.cpp and OpenAI
// return them (after the Matryoshka cut); a document's relevance_score is the rank head's first
// class (a Qwen3-Reranker's P("yes")). Fields arbor does not read are refused (400).
// Thread-safety: functions are pure; a builder belongs to one request (I/O thread).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_common.h"

namespace arbor::server {

// Validates a /v1/embeddings body and tokenises its inputs; on success fills *out.
std::optional<ApiError> prepare_embeddings(const nlohmann::json& body, const ModelInfo& model,
                                           PreparedRequest* out);
// Validates a /v1/rerank body and renders each (query, document) prompt; fills *out.
std::optional<ApiError> prepare_rerank(const nlohmann::json& body, const ModelInfo& model,
                                       PreparedRequest* out);

// The 404 (api_errors.h: task_not_served) for `route` on a server whose task is not `needed`,
// naming both tasks and what to start instead.
ApiError route_of_other_task(const ModelInfo& model, ServeTask needed, std::string_view route);

// The first `dimensions` values of `pooled` (all when 0), L2-normalised in double as llama.cpp's
// common_embd_normalize (a zero vector stays zero). [dimensions or pooled.size()]
std::vector<float> normalised_embedding(std::span<const float> pooled, int32_t dimensions);
// Standard base64 (RFC 4648, padded) of the floats' little-endian bytes, as OpenAI encodes
// embeddings for encoding_format "base64".
std::string base64_floats(std::span<const float> values);

// The Qwen3-Reranker's prompt (llama.cpp's converter writes it as tokenizer.chat_template.rerank),
// for files converted without one.
extern const char kQwen3RerankTemplate[];

}  // namespace arbor::server
