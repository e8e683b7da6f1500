// ApiServer: the HTTP routes of `arbor serve` (over one EngineCore) and of `arbor router` (over
// its replicas: router/router_engine.h), through engine::Engine.
//
//   POST /v1/completions, /v1/chat/completions   OpenAI (openai_api.h)
//   POST /v1/responses                           OpenAI Responses (responses_api.h)
//   POST /v1/messages, /v1/messages/count_tokens Anthropic Messages (messages_api.h)
//   GET  /v1/models, /v1/models/{id}             the served names (models_api.h)
//   POST /generate, /generate_stream, /          TGI (tgi_api.h; / is either, by "stream")
//   POST /v1/embeddings, /v1/rerank (/rerank)    pooling (embeddings_api.h; --task embed|rerank)
//   GET  /info, /health, /
//   GET  /metrics                                Prometheus (prometheus.h)
//   POST /tokenize, /detokenize
//   GET  /v1/engine/events                       the engine view's SSE stream (engine_events.h)
//   GET  / (browsers), /ui/*                     the web page (web_ui.h)
//
// One routing table (server.cc) decides everything per route: the handler, 404/405, the API
// flavor of its errors and whether it runs on the I/O thread or a worker.
//
// Threads (docs/server.md): the I/O thread routes a request and hands its body to a small
// WorkerPool (--tokenizer-threads), which parses, validates, renders the chat template and
// tokenises; the result is posted back to the I/O thread, which submits it to the engine (or
// answers an error) and drains its RequestStream whenever the engine pushes (RequestStream::
// set_notify posts there). So input-sized work never stalls the streams of other requests, and
// a request costs no thread of its own. A client that disconnects while its request is prepared
// is forgotten (nothing is submitted); one that disconnects later aborts its engine request,
// which frees its KV blocks. SIGINT/SIGTERM drain: stop accepting, answer new requests 503, let
// running and preparing ones finish until the deadline, abort the rest, then run() returns.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "engine/engine.h"
#include "server/access.h"
#include "server/api_common.h"
#include "server/response_store.h"
#include "server/engine_events.h"
#include "http/http_server.h"

namespace arbor::server {

struct ApiServerOptions {
  http::HttpServerOptions http{};
  double shutdown_timeout_s = 10.0;  // drain: running requests get this long to finish
  // /health answers 503 when requests are running and the engine has not finished a step for
  // this long (a forward that hangs); 0 = never. The router's probes read the same rule.
  double stall_timeout_s = 60.0;
  int64_t kv_blocks_total = 0;       // usable KV blocks, for /metrics
  int32_t max_concurrent_requests = 64;  // reported by /info
  // --tokenizer-threads: worker threads that parse, template and tokenise request bodies (>= 1).
  int32_t tokenizer_threads = 2;
  AccessPolicy access;  // Host guard, CORS, API key (access.h)
  // /v1/responses kept for previous_response_id: how many, how long, how much (response_store.h).
  ResponseStoreOptions responses{};
  // --log-stats-interval: the engine's line (engine::stats_line) every this many seconds, at
  // info while the engine is busy; 0 = never.
  double log_stats_interval_s = 10.0;
  // The web page at / (web_ui.h); --no-webui turns it off (GET / is then TGI's health for every
  // client). GET /v1/engine/events is served either way.
  bool web_ui = true;
  EngineEventsOptions engine_events{};
};

class ApiServer {
 public:
  // Binds the port. `engine` and everything `model` points to must outlive the ApiServer.
  // model.context_length is replaced by engine.max_model_len().
  static Result<std::unique_ptr<ApiServer>> create(engine::Engine& engine, ModelInfo model,
                                                   const ApiServerOptions& options);
  ~ApiServer();

  uint16_t port() const;
  // Serves on the calling thread until a signal's drain completes. All requests are finished
  // (or aborted) when it returns: ok, or an error when a second signal cut the drain short (the
  // process then exits non-zero).
  Status run();

  struct State;

 private:
  explicit ApiServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace arbor::server
