#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <variant>

#include "base/clock.h"
#include "base/log.h"
#include "sampling/rng.h"
#include "server/messages_api.h"
#include "server/embeddings_api.h"
#include "server/models_api.h"
#include "server/openai_api.h"
#include "server/prometheus.h"
#include "server/request_log.h"
#include "server/response_store.h"
#include "server/responses_api.h"
#include "server/sse_ids.h"
#include "server/tgi_api.h"
#include "server/web_ui.h"
#include "server/worker_pool.h"

namespace arbor::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Lets engine-thread callbacks and worker tasks reach the I/O loop only while it exists.
class Poster {
 public:
  explicit Poster(http::HttpServer* http) : http_(http) {}
  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (http_ != nullptr) http_->post(std::move(fn));
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    http_ = nullptr;
  }

 private:
  std::mutex mu_;
  http::HttpServer* http_;
};

namespace {

// What a route's worker step produced: an error, a request for the engine (generation routes),
// or the body of a 200 answer.
struct WorkResult {
  std::optional<ApiError> error;
  std::optional<PreparedRequest> request;
  std::string body;
};

// Parses, validates and tokenises on a worker thread. Pure: reads only `model`.
using WorkFn = WorkResult (*)(std::string_view body, const ModelInfo& model);
using PrepareFn = std::optional<ApiError> (*)(const json& body, const ModelInfo& model,
                                              PreparedRequest* out);

WorkResult prepare_with(PrepareFn prepare, std::string_view body, const ModelInfo& model) {
  WorkResult w;
  json j;
  w.error = parse_json_object(body, &j);
  if (w.error) return w;
  PreparedRequest prepared;
  prepared.raw_body = body;
  w.error = prepare(j, model, &prepared);
  prepared.raw_body = {};
  if (!w.error) w.request = std::move(prepared);
  return w;
}

WorkResult completion_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_completion, body, model);
}

WorkResult chat_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_chat, body, model);
}

WorkResult responses_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_responses, body, model);
}

WorkResult messages_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_messages, body, model);
}

WorkResult count_tokens_work(std::string_view body, const ModelInfo& model) {
  WorkResult w;
  json j;
  w.error = parse_json_object(body, &j);
  if (!w.error) w.error = count_message_tokens(j, body, model, &w.body);
  return w;
}

WorkResult embeddings_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_embeddings, body, model);
}

WorkResult rerank_work(std::string_view body, const ModelInfo& model) {
  return prepare_with(prepare_rerank, body, model);
}

WorkResult tgi_work(std::string_view body, const ModelInfo& model) {
  return prepare_with([](const json& b, const ModelInfo& m, PreparedRequest* out) {
    return prepare_tgi(b, m, /*stream=*/false, out);
  }, body, model);
}

WorkResult tgi_stream_work(std::string_view body, const ModelInfo& model) {
  return prepare_with([](const json& b, const ModelInfo& m, PreparedRequest* out) {
    return prepare_tgi(b, m, /*stream=*/true, out);
  }, body, model);
}

// A non-streaming answer wrapped in a JSON array: TGI's POST / answers [{"generated_text": ...}]
// (the shape of the Hugging Face Inference API).
class ArrayBodyBuilder : public ResponseBuilder {
 public:
  explicit ArrayBodyBuilder(std::unique_ptr<ResponseBuilder> inner) : inner_(std::move(inner)) {}
  bool streaming() const override { return inner_->streaming(); }
  ApiFlavor flavor() const override { return inner_->flavor(); }
  std::string on_event(const engine::StreamEvent& ev) override { return inner_->on_event(ev); }
  std::string on_final(const engine::StreamEvent& ev) override {
    return str_cat("[", inner_->on_final(ev), "]");
  }
  std::string on_stream_error(const ApiError& error) override {
    return inner_->on_stream_error(error);
  }
  void set_request_id(std::string_view request_id) override {
    inner_->set_request_id(request_id);
  }
  std::string response_id() const override { return inner_->response_id(); }

 private:
  std::unique_ptr<ResponseBuilder> inner_;
};

// TGI's POST / (its compat_generate): /generate_stream when the body says "stream": true, else
// /generate with the answer in a one-element array; `return_full_text` defaults to true, as in
// TGI for a text-generation model.
WorkResult tgi_root_work(std::string_view body, const ModelInfo& model) {
  WorkResult w;
  json j;
  bool stream = false;
  w.error = parse_json_object(body, &j);
  if (!w.error) w.error = read_bool(j, "stream", &stream);
  if (w.error) return w;
  j.erase("stream");
  auto params = j.find("parameters");
  if (params == j.end() || params->is_null()) {
    j["parameters"] = json::object();
    params = j.find("parameters");
  }
  if (params->is_object() && params->value("return_full_text", json()).is_null()) {
    (*params)["return_full_text"] = true;
  }
  PreparedRequest prepared;
  prepared.raw_body = body;  // the grammar's property order (its JSON pointer is unchanged)
  w.error = prepare_tgi(j, model, stream, &prepared);
  prepared.raw_body = {};
  if (w.error) return w;
  if (!stream) prepared.builder = std::make_unique<ArrayBodyBuilder>(std::move(prepared.builder));
  w.request = std::move(prepared);
  return w;
}

// "%2F" -> "/": clients encode the '/' of "org/model" in /v1/models/{id}. Malformed escapes stay
// as they are.
std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

WorkResult tokenize_work(std::string_view body, const ModelInfo& model) {
  WorkResult w;
  json j;
  std::string text;
  bool add_special = true;
  w.error = parse_json_object(body, &j);
  if (!w.error) w.error = read_string(j, "prompt", &text);
  if (!w.error) w.error = read_bool(j, "add_special_tokens", &add_special);
  if (!w.error && !j.contains("prompt")) w.error = invalid_param("prompt", "'prompt' is required");
  if (w.error) return w;
  tokenizer::EncodeOptions enc;
  if (!add_special) enc.add_bos = false;
  const std::vector<int32_t> ids = model.tokenizer->encode(text, enc);
  w.body = dump_json(
      json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.context_length}});
  return w;
}

WorkResult detokenize_work(std::string_view body, const ModelInfo& model) {
  WorkResult w;
  json j;
  std::vector<int32_t> ids;
  w.error = parse_json_object(body, &j);
  if (!w.error) {
    auto it = j.find("tokens");
    if (it == j.end() || !it->is_array()) {
      w.error = invalid_param("tokens", "'tokens' is required and must be an array of token ids");
    } else {
      w.error = read_token_ids(*it, "tokens", model, &ids);
    }
  }
  if (!w.error) w.body = dump_json(json{{"prompt", model.tokenizer->decode(ids)}});
  return w;
}

// A worker task must not throw: nlohmann::json throws on misuse, and a request must never take
// the server down.
WorkResult run_work(WorkFn work, std::string_view body, const ModelInfo& model) {
  try {
    return work(body, model);
  } catch (const std::exception& e) {
    WorkResult w;
    w.error = error_from_status(internal_error("request failed: ", e.what()));
    return w;
  }
}

}  // namespace

class Generation;
struct Route;
// Every exchange the API server answers writes its log line (request_log.h).
using Exchange = LoggedExchange;

// A request whose body a worker is preparing. The worker sees only its PrepJob, no HTTP object:
// the last reference to a connection must never be dropped off the I/O thread.
struct PrepJob {
  std::string body;
  std::atomic<bool> cancelled{false};  // the client left: skip the work if not started
};

struct Preparing {
  const Route* route = nullptr;
  std::shared_ptr<Exchange> ex;
  std::shared_ptr<PrepJob> job;
};

struct ApiServer::State {
  engine::Engine* engine = nullptr;
  ModelInfo model;
  ApiServerOptions options;
  std::unique_ptr<http::HttpServer> http;
  std::shared_ptr<Poster> poster;
  // I/O thread only.
  std::unordered_map<uint64_t, Preparing> preparing;
  std::unordered_map<uint64_t, std::shared_ptr<Generation>> active;
  std::map<int, int64_t> responses_by_status;
  // /v1/responses kept for previous_response_id (model.responses points here).
  std::unique_ptr<ResponseStore> responses;
  uint64_t next_id = 1;
  bool draining = false;
  Clock::time_point drain_deadline;
  bool aborted_all = false;
  bool forced = false;  // a second signal stopped the server before the drain completed
  std::unique_ptr<EngineEvents> events;  // GET /v1/engine/events
  // Last member: destroyed (joined) first, while everything its tasks read still exists.
  std::unique_ptr<WorkerPool> pool;

  void handle(http::HttpRequest req, std::shared_ptr<http::HttpExchange> ex);
  void send(Exchange& ex, int status, std::string body,
            const std::string& content_type = "application/json");
  void send_error(Exchange& ex, const ApiError& e, ApiFlavor flavor);
  // Answers of the I/O-thread routes; `param`: a prefix route's rest of the path ("" otherwise).
  void health(Exchange& ex, std::string_view param);
  void metrics(Exchange& ex, std::string_view param);
  void models(Exchange& ex, std::string_view param);
  void model_card(Exchange& ex, std::string_view id);
  void info(Exchange& ex, std::string_view param);
  // Stream routes: answered on the I/O thread, the exchange kept open.
  void engine_events(const std::shared_ptr<Exchange>& ex);
  void start_work(const Route& route, std::string body, const std::shared_ptr<Exchange>& ex);
  void cancel_work(uint64_t id);
  void on_prepared(uint64_t id, WorkResult result);
  void generate(const Route& route, uint64_t id, const std::shared_ptr<Exchange>& ex,
                PreparedRequest prepared);
  void begin_drain(int signal);
  void check_drain();
  // Logs the engine's line for the interval since `since` in an interval's time, and again.
  void log_stats_after(engine::EngineMetricsSnapshot before, Clock::time_point since);
};

// One generation request in flight: drains its RequestStream on the I/O thread.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  // sse_seed: the stream's events carry SSE ids (a resumable stream); resume_after: a
  // reconnecting client's Last-Event-ID, through which events are not sent again.
  Generation(ApiServer::State& s, uint64_t id, std::shared_ptr<Exchange> ex,
             PreparedRequest prepared, std::optional<uint64_t> sse_seed,
             std::optional<SseEventId> resume_after)
      : s_(s), id_(id), ex_(std::move(ex)), builder_(std::move(prepared.builder)),
        sse_ids_(sse_seed.has_value()), resume_after_(resume_after) {
    if (sse_seed) next_id_.seed = *sse_seed;
  }

  // Registers the callbacks; the streams may already hold events. `n`: choices per prompt.
  void start(std::vector<std::shared_ptr<engine::RequestStream>> streams, int32_t n) {
    streams_ = std::move(streams);
    n_ = n;
    final_seen_.assign(streams_.size(), false);
    std::weak_ptr<Generation> weak = weak_from_this();
    ex_->set_on_disconnect([weak] {
      if (auto g = weak.lock()) g->on_disconnect();
    });
    std::shared_ptr<Poster> poster = s_.poster;
    for (auto& stream : streams_) {
      stream->set_notify([weak, poster] {
        poster->post([weak] {
          if (auto g = weak.lock()) g->drain();
        });
      });
    }
    // A stream that stays silent (queued, long prefill) starts anyway after the keep-alive
    // interval, so the client sees headers and keep-alive comments. Errors that come sooner
    // (a full queue) still get their own status code.
    const double keepalive = s_.options.http.sse_keepalive_s;
    if (builder_->streaming() && keepalive > 0) {
      s_.http->run_after(keepalive, [weak] {
        if (auto g = weak.lock(); g && !g->done_) g->start_stream();
      });
    }
  }

  void abort() {
    if (done_) return;
    for (size_t p = 0; p < streams_.size(); ++p) {
      if (!final_seen_[p]) s_.engine->abort(streams_[p]->request_id());
    }
  }

 private:
  void on_disconnect() {
    if (done_) return;
    ARBOR_LOG(kDebug) << ex_->request_id() << " (engine " << streams_[0]->request_id()
                      << "): client disconnected, aborting";
    abort();
  }

  void drain() {
    std::shared_ptr<Generation> keep = shared_from_this();
    for (size_t p = 0; p < streams_.size() && !done_; ++p) {
      while (!done_ && !final_seen_[p]) {
        std::optional<engine::StreamEvent> ev = streams_[p]->try_next();
        if (!ev) break;
        ev->index += static_cast<int32_t>(p) * n_;
        if (ev->final) {
          on_stream_final(p, *ev);
        } else if (builder_->streaming()) {
          start_stream();
          next_id_.tokens += static_cast<int64_t>(ev->token_ids.size());
          ex_->write(with_event_ids(builder_->on_event(*ev)));
        } else {
          builder_->on_event(*ev);
        }
      }
    }
  }

  // One prompt's request ended: an error ends the whole response (and aborts the other
  // prompts); otherwise the response ends with the last prompt, usage summed.
  void on_stream_final(size_t p, const engine::StreamEvent& ev) {
    final_seen_[p] = true;
    total_.final = true;
    total_.usage.prompt_tokens += ev.usage.prompt_tokens;
    total_.usage.completion_tokens += ev.usage.completion_tokens;
    total_.usage.cached_tokens += ev.usage.cached_tokens;
    total_.usage.draft_tokens += ev.usage.draft_tokens;
    total_.usage.accepted_draft_tokens += ev.usage.accepted_draft_tokens;
    if (!ev.error.ok()) {
      abort();
      total_.error = ev.error;
      finish(total_);
      return;
    }
    if (std::all_of(final_seen_.begin(), final_seen_.end(), [](bool b) { return b; })) {
      finish(total_);
    }
  }

  // A resumable stream's SSE events each get an id (sse_ids.h); those at or before the
  // reconnecting client's Last-Event-ID are dropped. Other streams pass through.
  std::string with_event_ids(std::string bytes) {
    if (!sse_ids_) return bytes;
    return label_sse_events(bytes, &next_id_, resume_after_);
  }

  void start_stream() {
    if (started_) return;
    started_ = true;
    ex_->start_stream(200, "text/event-stream");
  }

  // Sends the end of the answer; the exchange logs the request's line (request_log.h).
  void finish(const engine::StreamEvent& ev) {
    done_ = true;
    ex_->set_detail(str_cat("prompt=", ev.usage.prompt_tokens,
                            " completion=", ev.usage.completion_tokens));
    if (!ev.error.ok()) {
      const ApiError e = error_from_status(ev.error);
      if (started_) {
        ex_->set_error(str_cat("the stream ended with error ",
                               error_http_status(e, builder_->flavor()), ": ", e.message));
        ex_->write(builder_->on_stream_error(e));
        ex_->finish_stream();
      } else {
        s_.send_error(*ex_, e, builder_->flavor());
      }
    } else if (builder_->streaming()) {
      start_stream();
      ex_->write(with_event_ids(builder_->on_final(ev)));
      ex_->finish_stream();
    } else {
      s_.send(*ex_, 200, builder_->on_final(ev));
    }
    ex_->set_on_disconnect(nullptr);
    for (auto& stream : streams_) stream->set_notify(nullptr);
    s_.active.erase(id_);  // may destroy *this: `keep` in drain() holds it
  }

  ApiServer::State& s_;
  uint64_t id_;
  std::shared_ptr<Exchange> ex_;
  std::unique_ptr<ResponseBuilder> builder_;
  std::vector<std::shared_ptr<engine::RequestStream>> streams_;  // one per prompt
  std::vector<bool> final_seen_;
  int32_t n_ = 1;
  engine::StreamEvent total_;  // the combined final event
  bool started_ = false;
  bool done_ = false;
  const bool sse_ids_;
  const std::optional<SseEventId> resume_after_;
  SseIdCursor next_id_;
};

void ApiServer::State::send(Exchange& ex, int status, std::string body,
                            const std::string& content_type) {
  ex.respond({status, content_type, std::move(body)});
}

void ApiServer::State::send_error(Exchange& ex, const ApiError& e, ApiFlavor flavor) {
  ex.set_error(e.message);
  send(ex, error_http_status(e, flavor), error_body(e, flavor));
}

// The one routing table: the dispatcher, the 404/405 answers, the drain rule and the logs all
// read it. A route is answered on the I/O thread (`answer`: cheap, independent of the body) or
// prepared on a worker (`work`: parsing, chat templating, tokenisation), then answered or
// submitted to the engine on the I/O thread.
struct Route {
  std::string_view method;
  std::string_view path;  // the path, or with `prefix` its start ("/v1/models/" + id)
  ApiFlavor flavor = ApiFlavor::kOpenAi;
  // `param`: the rest of a prefix route's path, percent-decoded ("" for other routes).
  void (ApiServer::State::*answer)(Exchange&, std::string_view param) = nullptr;
  WorkFn work = nullptr;
  bool generates = false;  // submits to the engine: refused (503) while draining
  bool prefix = false;     // `path` is followed by a non-empty parameter
  bool probe = false;      // polled by probes and scrapers: successes logged at debug
  // A long-lived stream answered on the I/O thread (instead of `answer`); refused while draining.
  void (ApiServer::State::*stream)(const std::shared_ptr<Exchange>&) = nullptr;
  // The task the route serves (--task; embeddings_api.h): refused with 404 on a server of
  // another task. Unset: kGenerate for routes that submit to the engine, any task otherwise.
  std::optional<ServeTask> task;
};

namespace {

using S = ApiServer::State;
const Route kRoutes[] = {
    {"POST", "/v1/completions", ApiFlavor::kOpenAi, nullptr, completion_work, true},
    {"POST", "/v1/chat/completions", ApiFlavor::kOpenAi, nullptr, chat_work, true},
    {"POST", "/v1/responses", ApiFlavor::kOpenAi, nullptr, responses_work, true},
    {"POST", "/v1/messages", ApiFlavor::kAnthropic, nullptr, messages_work, true},
    {"POST", "/v1/messages/count_tokens", ApiFlavor::kAnthropic, nullptr, count_tokens_work,
     false},
    {"POST", "/generate", ApiFlavor::kTgi, nullptr, tgi_work, true},
    {"POST", "/generate_stream", ApiFlavor::kTgi, nullptr, tgi_stream_work, true},
    {"POST", "/", ApiFlavor::kTgi, nullptr, tgi_root_work, true},
    {"POST", "/v1/embeddings", ApiFlavor::kOpenAi, nullptr, embeddings_work, true, false, false,
     nullptr, ServeTask::kEmbed},
    {"POST", "/v1/rerank", ApiFlavor::kOpenAi, nullptr, rerank_work, true, false, false,
     nullptr, ServeTask::kRerank},
    {"POST", "/rerank", ApiFlavor::kOpenAi, nullptr, rerank_work, true, false, false,
     nullptr, ServeTask::kRerank},
    {"POST", "/tokenize", ApiFlavor::kOpenAi, nullptr, tokenize_work, false},
    {"POST", "/detokenize", ApiFlavor::kOpenAi, nullptr, detokenize_work, false},
    {"GET", "/v1/models", ApiFlavor::kOpenAi, &S::models, nullptr, false},
    {"GET", "/v1/models/", ApiFlavor::kOpenAi, &S::model_card, nullptr, false, true},
    {"GET", "/info", ApiFlavor::kTgi, &S::info, nullptr, false},
    {"GET", "/health", ApiFlavor::kOpenAi, &S::health, nullptr, false, false, true},
    {"GET", "/", ApiFlavor::kTgi, &S::health, nullptr, false, false, true},  // TGI's health
    {"GET", "/metrics", ApiFlavor::kOpenAi, &S::metrics, nullptr, false, false, true},
    {.method = "GET", .path = "/v1/engine/events", .stream = &S::engine_events},
};

std::optional<ServeTask> task_of(const Route& r) {
  if (r.task) return r.task;
  return r.generates ? std::optional<ServeTask>(ServeTask::kGenerate) : std::nullopt;
}

bool matches(const Route& r, std::string_view path) {
  return r.prefix ? path.size() > r.path.size() && path.starts_with(r.path) : path == r.path;
}

// The route of (method, path), or the error for a path that is unknown (404) or known under
// other methods only (405).
std::variant<const Route*, ApiError> find_route(std::string_view method, std::string_view path) {
  bool path_known = false;
  for (const Route& r : kRoutes) {
    if (!matches(r, path)) continue;
    if (r.method == method) return &r;
    path_known = true;
  }
  if (path_known) return method_not_allowed(method, path);
  return route_not_found(method, path);
}

// The API flavor of a path's errors (TGI's routes answer in TGI's shape).
ApiFlavor flavor_of_path(std::string_view path) {
  for (const Route& r : kRoutes) {
    if (matches(r, path)) return r.flavor;
  }
  return ApiFlavor::kOpenAi;
}

}  // namespace

void ApiServer::State::handle(http::HttpRequest req,
                              std::shared_ptr<http::HttpExchange> http_ex) {
  std::string path = req.target.substr(0, req.target.find('?'));
  if (path.size() > 1 && path.back() == '/') path.pop_back();
  auto ex = std::make_shared<Exchange>(std::move(http_ex), req.method, path, request_id_for(req));
  ex->set_last_event_id(std::string(req.header("Last-Event-ID")));
  ex->set_session(std::string(req.header("X-Session-Id")).substr(0, 256));
  ARBOR_LOG(kDebug) << req.method << " " << req.target << " " << ex->request_id() << " ("
                    << req.body.size() << " bytes)";
  // The web page's files need no API key (web_ui.h); Host and Origin rules still apply.
  const WebAsset* asset =
      options.web_ui ? find_web_asset(req.method, path, req.header("Accept")) : nullptr;
  AccessDecision access = check_access(options.access, req, path, asset != nullptr);
  for (auto& [name, value] : access.headers) ex->add_header(std::move(name), std::move(value));
  if (access.error) {
    if (access.error->http_status == 401) ex->add_header("WWW-Authenticate", "Bearer");
    send_error(*ex, *access.error, flavor_of_path(path));
    return;
  }
  if (access.preflight) {
    send(*ex, 200, "", "text/plain");
    return;
  }
  if (asset != nullptr) {
    ex->respond(web_asset_response(*asset));
    return;
  }
  try {
    std::variant<const Route*, ApiError> found = find_route(req.method, path);
    if (const ApiError* e = std::get_if<ApiError>(&found)) {
      send_error(*ex, *e, flavor_of_path(path));
      return;
    }
    const Route& route = *std::get<const Route*>(found);
    ex->set_quiet_success(route.probe);
    if (const std::optional<ServeTask> needs = task_of(route); needs && *needs != model.task) {
      send_error(*ex, route_of_other_task(model, *needs, path), route.flavor);
      return;
    }
    if (route.answer != nullptr) {
      const std::string param = route.prefix ? percent_decode(path.substr(route.path.size())) : "";
      (this->*route.answer)(*ex, param);
    } else if ((route.generates || route.stream != nullptr) && draining) {
      send_error(*ex, server_unavailable("the server is shutting down"), route.flavor);
    } else if (route.stream != nullptr) {
      (this->*route.stream)(ex);
    } else {
      start_work(route, std::move(req.body), ex);
    }
  } catch (const std::exception& e) {
    // nlohmann::json throws on misuse; a request must never take the server down.
    send_error(*ex, error_from_status(internal_error("request failed: ", e.what())),
               ApiFlavor::kOpenAi);
  }
}

void ApiServer::State::health(Exchange& ex, std::string_view) {
  if (draining) {
    send_error(ex, server_unavailable("the server is shutting down"), ApiFlavor::kOpenAi);
  } else if (const engine::EngineMetricsSnapshot m = engine->metrics(); !m.executor_healthy) {
    // A model shard is down and could not be restarted (docs/shards.md, "Faults").
    send_error(ex, server_unavailable(str_cat("the model executor is down: ", m.executor_error)),
               ApiFlavor::kOpenAi);
  } else if (const double stalled = steady_seconds() - m.last_step_time_s;
             options.stall_timeout_s > 0 && m.num_running > 0 && m.last_step_time_s > 0 &&
             stalled > options.stall_timeout_s) {
    send_error(ex, server_unavailable(str_cat("no engine step in ", static_cast<int64_t>(stalled),
                                              " s with ", m.num_running, " request(s) running")),
               ApiFlavor::kOpenAi);
  } else {
    send(ex, 200, "{}");
  }
}

void ApiServer::State::metrics(Exchange& ex, std::string_view) {
  ServerMetrics sm;
  sm.model_name = model.name;
  sm.kv_blocks_total = options.kv_blocks_total;
  sm.kv_blocks_free = engine->num_free_blocks();
  sm.active_requests = static_cast<int64_t>(active.size());
  for (const auto& [id, p] : preparing) sm.active_requests += p.route->generates ? 1 : 0;
  sm.responses_by_status = responses_by_status;
  send(ex, 200, prometheus_text(engine->metrics(), sm) + engine->extra_metrics(),
       "text/plain; version=0.0.4");
}

void ApiServer::State::engine_events(const std::shared_ptr<Exchange>& ex) {
  if (std::optional<ApiError> e = events->subscribe(ex)) send_error(*ex, *e, ApiFlavor::kOpenAi);
}

void ApiServer::State::models(Exchange& ex, std::string_view) {
  send(ex, 200, models_json(model));
}

// GET /v1/models/{id}: any served name (or, with --accept-any-model-name, any name).
void ApiServer::State::model_card(Exchange& ex, std::string_view id) {
  if (is_served_name(model, id) || model.accept_any_model_name) {
    send(ex, 200, model_json(model, id));
  } else {
    send_error(ex, unknown_model(model, id), ApiFlavor::kOpenAi);
  }
}

void ApiServer::State::info(Exchange& ex, std::string_view) {
  send(ex, 200, tgi_info_json(model, options.max_concurrent_requests));
}

// Hands the body to a worker; on_prepared() gets the result on the I/O thread. A client that
// hangs up meanwhile is forgotten at once (its result, if any, is dropped unsubmitted) and a
// task not yet started is skipped.
void ApiServer::State::start_work(const Route& route, std::string body,
                                  const std::shared_ptr<Exchange>& ex) {
  const uint64_t id = next_id++;
  auto job = std::make_shared<PrepJob>();
  job->body = std::move(body);
  preparing.emplace(id, Preparing{&route, ex, job});
  ex->set_on_disconnect([this, id] { cancel_work(id); });
  const ModelInfo* m = &model;
  std::shared_ptr<Poster> to_io = poster;
  pool->submit([this, id, job, m, to_io, work = route.work] {
    if (job->cancelled.load()) return;
    auto result = std::make_shared<WorkResult>(run_work(work, job->body, *m));
    to_io->post([this, id, result] { on_prepared(id, std::move(*result)); });
  });
}

void ApiServer::State::cancel_work(uint64_t id) {
  auto it = preparing.find(id);
  if (it == preparing.end()) return;
  ARBOR_LOG(kDebug) << it->second.route->path << " " << it->second.ex->request_id()
                    << ": client disconnected while the request was prepared";
  it->second.job->cancelled = true;
  preparing.erase(it);
}

void ApiServer::State::on_prepared(uint64_t id, WorkResult result) {
  auto it = preparing.find(id);
  if (it == preparing.end()) return;  // the client left: nothing was submitted
  const Route& route = *it->second.route;
  std::shared_ptr<Exchange> ex = std::move(it->second.ex);
  preparing.erase(it);
  ex->set_on_disconnect(nullptr);
  if (result.error) {
    send_error(*ex, *result.error, route.flavor);
  } else if (!result.request) {
    send(*ex, 200, std::move(result.body));
  } else if (aborted_all) {
    // Past the drain deadline (or a second signal): nothing new reaches the engine.
    send_error(*ex, server_unavailable("the server is shutting down"), route.flavor);
  } else {
    generate(route, id, ex, std::move(*result.request));
  }
}

// Submits a prepared request (one engine request per prompt) and starts its Generation.
void ApiServer::State::generate(const Route& route, uint64_t id,
                                const std::shared_ptr<Exchange>& ex, PreparedRequest prepared) {
  const int32_t n = prepared.request.n;
  engine::GenerateRequest& first = prepared.request;
  // Every request gets a seed, echoed to the client: its output is then a pure function of the
  // request and the seed, which failover and reconnection rely on (docs/router.md).
  const bool seed_given = first.sampling.seed.has_value();
  if (!seed_given) first.sampling.seed = sampling::Rng::random_seed();
  const uint64_t seed = *first.sampling.seed;
  const bool resumable = prepared.builder->streaming() && prepared.more_prompts.empty() &&
                         n == 1 && first.best_of <= 1 && !first.pooling;
  std::optional<SseEventId> resume_after;
  if (!ex->last_event_id().empty()) {
    Result<SseEventId> last = parse_sse_event_id(ex->last_event_id());
    std::optional<ApiError> refused;
    if (!resumable) {
      refused = invalid_param("Last-Event-ID", "Last-Event-ID resumes a streamed request with "
                                               "one prompt and one sample (n = 1)");
    } else if (!last.ok()) {
      refused = invalid_param("Last-Event-ID", last.status().message());
    } else if (seed_given && last->seed != seed) {
      refused = invalid_param("Last-Event-ID",
                              str_cat("Last-Event-ID '", ex->last_event_id(), "' names seed ",
                                      last->seed, ", the request's seed is ", seed));
    }
    if (refused) {
      send_error(*ex, *refused, route.flavor);
      return;
    }
    first.sampling.seed = last->seed;
    resume_after = *last;
  }
  ex->add_header("X-Arbor-Seed", std::to_string(*first.sampling.seed));
  if (resumable) first.one_token_per_event = true;
  if (!ex->session().empty()) first.session = ex->session();
  const std::optional<uint64_t> sse_seed =
      resumable ? std::optional<uint64_t>(*first.sampling.seed) : std::nullopt;
  std::vector<engine::GenerateRequest> requests;
  for (auto& prompt : prepared.more_prompts) {
    engine::GenerateRequest more = prepared.request;
    if (!seed_given) more.sampling.seed.reset();  // each prompt of a batch its own random seed
    more.prompt_token_ids = std::move(prompt);
    more.request_id = str_cat("http-", id, "-", requests.size() + 1);
    requests.push_back(std::move(more));
  }
  prepared.request.request_id = str_cat("http-", id);
  requests.insert(requests.begin(), std::move(prepared.request));
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (engine::GenerateRequest& r : requests) {
    Result<std::shared_ptr<engine::RequestStream>> stream = engine->submit(std::move(r));
    if (!stream.ok()) {
      for (auto& submitted : streams) engine->abort(submitted->request_id());
      send_error(*ex, error_from_status(stream.status()), route.flavor);
      return;
    }
    streams.push_back(std::move(stream).value());
  }
  // The answer's id builds on the request id ("chatcmpl-<id>"), and the log line names it.
  prepared.builder->set_request_id(ex->request_id());
  ex->set_response_id(prepared.builder->response_id());
  auto g = std::make_shared<Generation>(*this, id, ex, std::move(prepared), sse_seed, resume_after);
  active.emplace(id, g);
  g->start(std::move(streams), n);
}

void ApiServer::State::begin_drain(int signal) {
  if (draining) {
    ARBOR_LOG(kWarn) << "second signal " << signal << ": stopping now";
    aborted_all = true;
    forced = true;
    events->close_all();
    for (auto& [id, g] : active) g->abort();
    poster->close();
    http->stop();
    return;
  }
  draining = true;
  drain_deadline = Clock::now() + std::chrono::milliseconds(
                                      static_cast<int64_t>(options.shutdown_timeout_s * 1000));
  ARBOR_LOG(kInfo) << "signal " << signal << ": draining " << active.size() + preparing.size()
                   << " requests (deadline " << options.shutdown_timeout_s << "s)";
  http->stop_accepting();
  events->close_all();  // an engine view must not hold the drain open
  check_drain();
}

// Done when every request has finished and every response's last byte is written (a slow
// reader still gets its whole stream), or past the deadline for the bytes too.
void ApiServer::State::check_drain() {
  const bool deadline_passed = Clock::now() >= drain_deadline;
  if (active.empty() && preparing.empty() &&
      (http->open_exchanges() == 0 || deadline_passed)) {
    if (http->open_exchanges() > 0) {
      ARBOR_LOG(kWarn) << "shutdown deadline reached: " << http->open_exchanges()
                       << " responses not fully written";
    }
    ARBOR_LOG(kInfo) << "drained; shutting down";
    poster->close();
    http->stop();
    return;
  }
  if (!aborted_all && deadline_passed) {
    ARBOR_LOG(kWarn) << "shutdown deadline reached: aborting " << active.size() << " requests";
    aborted_all = true;
    for (auto& [id, g] : active) g->abort();
  }
  http->run_after(0.05, [this] { check_drain(); });
}

void ApiServer::State::log_stats_after(engine::EngineMetricsSnapshot before,
                                       Clock::time_point since) {
  http->run_after(options.log_stats_interval_s, [this, before = std::move(before), since] {
    engine::EngineMetricsSnapshot now = engine->metrics();
    const Clock::time_point t = Clock::now();
    const double seconds = std::chrono::duration<double>(t - since).count();
    if (engine::engine_active(before, now)) {
      ARBOR_LOG(kInfo) << engine::stats_line(before, now, seconds);
    } else {
      ARBOR_LOG(kDebug) << engine::stats_line(before, now, seconds);
    }
    log_stats_after(std::move(now), t);
  });
}

ApiServer::ApiServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

ApiServer::~ApiServer() {
  if (state_->poster) state_->poster->close();
}

Result<std::unique_ptr<ApiServer>> ApiServer::create(engine::Engine& engine, ModelInfo model,
                                                     const ApiServerOptions& options) {
  if (model.tokenizer == nullptr) return invalid_argument("the server needs a tokenizer");
  if (options.tokenizer_threads < 1) {
    return invalid_argument("--tokenizer-threads is ", options.tokenizer_threads,
                            ", must be >= 1");
  }
  auto state = std::make_unique<State>();
  state->engine = &engine;
  state->model = std::move(model);
  state->model.context_length = static_cast<int32_t>(engine.max_model_len());
  state->model.max_spec_tokens = engine.max_spec_tokens();
  state->model.max_tree_nodes = engine.max_tree_nodes();
  state->responses = std::make_unique<ResponseStore>(options.responses);
  state->model.responses = state->responses.get();
  state->options = options;
  State* counted = state.get();
  state->options.http.on_status = [counted](int status) { ++counted->responses_by_status[status]; };
  // Errors the HTTP layer answers itself (413, malformed requests) in the API's shape.
  state->options.http.error_body = [](int status, std::string_view code, std::string_view msg) {
    ApiError e;
    e.http_status = status;
    e.message = std::string(msg);
    e.code = std::string(code);
    if (status >= 500) e.type = "internal_error";
    return error_body(e, ApiFlavor::kOpenAi);
  };
  State* s = state.get();
  ARBOR_ASSIGN_OR_RETURN(state->http,
                         http::HttpServer::create(state->options.http, [s](http::HttpRequest req,
                                                              std::shared_ptr<http::HttpExchange> ex) {
                           s->handle(std::move(req), std::move(ex));
                         }));
  state->poster = std::make_shared<Poster>(state->http.get());
  state->http->on_signal([s](int sig) { s->begin_drain(sig); });
  state->pool = std::make_unique<WorkerPool>(options.tokenizer_threads);
  state->events = std::make_unique<EngineEvents>(*state->http, engine, state->model.name,
                                                 options.engine_events);
  if (options.log_stats_interval_s > 0) {
    state->http->post([s] { s->log_stats_after(s->engine->metrics(), Clock::now()); });
  }
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(state)));
}

uint16_t ApiServer::port() const { return state_->http->port(); }

Status ApiServer::run() {
  state_->http->run();
  state_->poster->close();
  // Requests still registered (second signal) were aborted; let the engine finish them so
  // their blocks are back before the engine is destroyed.
  state_->active.clear();
  state_->preparing.clear();  // their results, if any, were dropped with the I/O loop
  state_->engine->wait_idle();
  if (state_->forced) {
    return failed_precondition(
        "stopped by a second signal before every request and response completed");
  }
  return ok_status();
}

}  // namespace arbor::server
