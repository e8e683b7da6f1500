// What the API layers (openai_api, tgi_api) share: the served model's facts, the per-request
// ResponseBuilder that turns engine events into bytes, and typed readers of JSON request fields
// that produce ApiErrors naming the field and the limit.
//
// Fields a route does not read are refused with a 400 naming them (request_fields.h).

#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api_errors.h"
#include "step/step.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server {

class ChatRenderer;
class ResponseStore;

// What a server serves (`arbor serve --task`; docs/server.md, "Embeddings and rerank"): text
// generation (the completions, chat and TGI routes), embeddings (/v1/embeddings) or reranking
// (/v1/rerank). A route of another task is refused (404 naming both).
enum class ServeTask : uint8_t { kGenerate, kEmbed, kRerank };
std::string_view serve_task_name(ServeTask task);  // "generate", "embed", "rerank"

// Facts about the served model. Immutable after startup; any thread.
struct ModelInfo {
  std::string name;                               // served model name ("model" field)
  // More names requests may use (--served-model-name a,b,c: name "a", aliases "b", "c");
  // responses report `name` (models_api.h).
  std::vector<std::string> aliases;
  // --accept-any-model-name: a request naming another model is served, not answered 404.
  bool accept_any_model_name = false;
  std::string path;                               // the GGUF file
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Longest sequence (prompt + generated tokens): ApiServer::create sets it from
  // Engine::max_model_len(), the one source of the number (callers need not set it).
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int64_t created = 0;                            // unix seconds of startup
  int32_t max_n = 16;                             // limit on n and best_of
  int32_t max_spec_tokens = 0;                    // the engine's --spec-k; 0 = speculation off
  int32_t max_tree_nodes = 0;                     // --spec-tree-budget; 0 = chains only
  const ChatRenderer* chat = nullptr;             // nullptr: /v1/chat/completions answers 400
  bool priority_scheduling = false;  // --scheduling-policy priority: the `priority` field counts
  // --allow-special-in-content: control-token text in chat message content becomes control
  // tokens (by default it stays text: a user cannot close their turn and speak as another role).
  bool allow_special_in_content = false;
  // The responses kept for /v1/responses' previous_response_id (response_store.h; thread-safe,
  // owned by the ApiServer); nullptr: none are kept.
  ResponseStore* responses = nullptr;
  // --task and what it needs (embeddings_api.h).
  ServeTask task = ServeTask::kGenerate;
  // kEmbed: mean, cls or last; kRerank: rank.
  std::optional<step::PoolingType> pooling;
  int32_t embedding_dim = 0;  // kEmbed: the pooled vector's length (the model's hidden size)
  // kRerank: the prompt of a (query, document) pair with "{query}" and "{document}" in it, parsed
  // with control tokens (the file's tokenizer.chat_template.rerank, or the Qwen3-Reranker
  // prompt); "" = llama.cpp's fallback (BOS, query, EOS, document, EOS as the vocabulary adds
  // them).
  std::string rerank_template;
  // Inputs of one /v1/embeddings request or documents of one /v1/rerank request, at most: each
  // is an engine request, so min(2048, --max-waiting-requests).
  int32_t max_pooling_inputs = 2048;
};

// Turns one request's engine events into response bytes. I/O thread only.
class ResponseBuilder {
 public:
  virtual ~ResponseBuilder() = default;
  virtual bool streaming() const = 0;
  virtual ApiFlavor flavor() const = 0;
  // A non-final event: bytes to stream now ("" for none), or nothing while collecting.
  virtual std::string on_event(const engine::StreamEvent& ev) = 0;
  // The final event (ok): the whole body (non-streaming) or the stream's closing bytes.
  virtual std::string on_final(const engine::StreamEvent& ev) = 0;
  // An error after the stream started, as stream bytes.
  virtual std::string on_stream_error(const ApiError& error) = 0;
  // The request's id (X-Request-Id, request_log.h), given before the first event: bodies that
  // carry an id build it on this one (OpenAI: "chatcmpl-<id>"), as vLLM does.
  virtual void set_request_id(std::string_view request_id) {}
  // The id the body carries, "" if none.
  virtual std::string response_id() const { return ""; }
};

// A validated request ready for Engine::submit.
// A batch of prompts (OpenAI completions with a list of prompts) is one request per prompt, all
// with the same parameters; the events of prompt p carry choice indices p * n + i.
struct PreparedRequest {
  engine::GenerateRequest request;                 // the first prompt
  std::vector<std::vector<int32_t>> more_prompts;  // prompts 2.. of a batch
  std::unique_ptr<ResponseBuilder> builder;
  // The request body's text while it is prepared (a view: not valid afterwards); "" when the
  // body did not come as text.
  std::string_view raw_body;
};

// Parses a body that must be a JSON object; errors are malformed_body (400).
std::optional<ApiError> parse_json_object(std::string_view body, nlohmann::json* out);

// A field that is there and not null.
bool present(const nlohmann::ordered_json& o, const char* key);
// nullopt when o[key] is a string; else a 400 naming "<where>.<key>".
std::optional<ApiError> require_string(const nlohmann::ordered_json& o, const char* key,
                                       std::string_view where);

// Typed field readers. Absent or null fields leave *out unchanged and return nullopt.
std::optional<ApiError> read_bool(const nlohmann::json& o, const char* name, bool* out);
// Usage's "speculation": {"draft_tokens", "accepted_tokens", "acceptance_rate"}.
nlohmann::json speculation_usage_json(const engine::Usage& u);
// The sampling fields every generation route reads by the same names: temperature, top_p,
// top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, logit_bias and
// TGI's do_sample (false: greedy unless temperature, top_p or top_k is given). A route whose
// field list (request_fields.h) refuses some of them never reaches this with them.
std::optional<ApiError> read_sampling(const nlohmann::json& o, const ModelInfo& m,
                                      sampling::SamplingParams* out);
// `speculation` (read_speculation) and vLLM's `priority` (|p| <= 10^6; anything but 0 needs
// --scheduling-policy priority).
std::optional<ApiError> read_scheduling(const nlohmann::json& o, const ModelInfo& m,
                                        engine::GenerateRequest* out);
// The request's `speculation` object (both APIs): {"mode": "off"|"auto"|"fixed", "k": K}.
// Absent or null: auto. Errors name the field: "speculation.k is 40, must be in [1, 8] (the
// server's --spec-k)"; "fixed" on a server without speculation; unknown fields.
std::optional<ApiError> read_speculation(const nlohmann::json& o, const ModelInfo& m,
                                         sched::SpecRequest* out);
std::optional<ApiError> read_int(const nlohmann::json& o, const char* name, int64_t lo,
                                 int64_t hi, int64_t* out);
std::optional<ApiError> read_int32(const nlohmann::json& o, const char* name, int64_t lo,
                                   int64_t hi, int32_t* out);
// Finite number in [lo, hi]; `lo_open` excludes lo itself.
std::optional<ApiError> read_float(const nlohmann::json& o, const char* name, double lo,
                                   double hi, bool lo_open, float* out);
std::optional<ApiError> read_string(const nlohmann::json& o, const char* name, std::string* out);
// Stop strings a request may give (OpenAI's `stop`, Anthropic's `stop_sequences`).
inline constexpr size_t kMaxStopStrings = 16;
// A string or an array of non-empty strings (at most `max` of them).
std::optional<ApiError> read_stop(const nlohmann::json& o, const char* name, size_t max,
                                  std::vector<std::string>* out);
// The "model" field, when present, must name the served model: its name, an alias or the file's
// path (404 otherwise, unless accept_any_model_name).
std::optional<ApiError> check_model(const nlohmann::json& o, const ModelInfo& model);
// The server's one length check, against model.context_length (the engine's max_model_len()):
// prompt + max_tokens must fit, so the prompt leaves room for at least one token. An explicit
// max_tokens that does not fit is an error naming `max_name`; an absent one (`explicit_max`
// false) is cut to what fits. Engine::submit() stays the authoritative check of the prompt;
// this one runs first so that the 400 names the field and carries code context_length_exceeded,
// and because cutting max_tokens needs the number.
std::optional<ApiError> check_lengths(const ModelInfo& model, size_t num_prompt_tokens,
                                      bool explicit_max, const char* max_name,
                                      int32_t* max_tokens);
// Text must be valid UTF-8 (the JSON parser already guarantees it; token ids do not).
std::optional<ApiError> read_token_ids(const nlohmann::json& array, const char* name,
                                       const ModelInfo& model, std::vector<int32_t>* out);

// `prefix` + 16 hex digits, unique in the process ("call_3f9a...").
std::string random_id(std::string_view prefix);
// "stop" | "length" | "abort" in OpenAI's words ("abort" stays "abort", as vLLM).
std::string finish_reason_string(const std::optional<sched::FinishReason>& reason);
// JSON dump that replaces invalid UTF-8 rather than throwing.
std::string dump_json(const nlohmann::json& j);
// "data: <json>\n\n"
std::string sse_data(const nlohmann::json& j);

#define ARBOR_API_TRY(expr)        \
  do {                             \
    auto arbor_api_err_ = (expr);  \
    if (arbor_api_err_) return *arbor_api_err_; \
  } while (0)

}  // namespace arbor::server
