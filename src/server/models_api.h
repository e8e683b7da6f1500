// The served model's names: which names a request's "model" field may use, and the bodies of
// GET /v1/models and GET /v1/models/{id}.
//
// `arbor serve --served-model-name a,b` (or the flag repeated) serves the model as "a" and "b",
// as vLLM does: /v1/models lists every name, requests may use any of them (or the model file's
// path), and responses report the first ("a"), so a client that asked for an alias learns which
// model answered. With --accept-any-model-name (ModelInfo::accept_any_model_name) every name is
// accepted, for clients that send something else (the endpoint URL, as the current
// @huggingface/inference does); /v1/models still lists the served names only.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "server/api_common.h"

namespace arbor::server {

// Whether `requested` is the served name or one of its aliases (what /v1/models lists).
bool is_served_name(const ModelInfo& model, std::string_view requested);
// The 404 (model_not_found) for a name the server does not serve; the message lists the served
// names and the flag that accepts any name.
ApiError unknown_model(const ModelInfo& model, std::string_view requested);
// The body of GET /v1/models: {"object": "list", "data": [one card per served name]}.
std::string models_json(const ModelInfo& model);
// The body of GET /v1/models/{id} for a served `id`: {"id", "object": "model", "created",
// "owned_by", "root", "max_model_len", "task"} and, for embedding and rerank servers, "pooling"
// (and "embedding_dim").
std::string model_json(const ModelInfo& model, std::string_view id);

}  // namespace arbor::server
