#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/log.h"
#include "server/openai_api.h"
#include "server/prometheus.h"
#include "server/tgi_api.h"

namespace arbor::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Lets engine-thread callbacks reach the I/O loop only while it exists.
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

class Generation;

struct ApiServer::State {
  engine::EngineCore* engine = nullptr;
  ModelInfo model;
  ApiServerOptions options;
  std::unique_ptr<http::HttpServer> http;
  std::shared_ptr<Poster> poster;
  // I/O thread only.
  std::unordered_map<uint64_t, std::shared_ptr<Generation>> active;
  std::map<int, int64_t> responses_by_status;
  uint64_t next_id = 1;
  bool draining = false;
  Clock::time_point drain_deadline;
  bool aborted_all = false;

  void handle(http::HttpRequest req, std::shared_ptr<http::HttpExchange> ex);
  bool route(const std::string& method, const std::string& path, http::HttpRequest& req,
             const std::shared_ptr<http::HttpExchange>& ex);
  void send(http::HttpExchange& ex, int status, std::string body,
            const std::string& content_type = "application/json");
  void send_error(http::HttpExchange& ex, const ApiError& e, ApiFlavor flavor);
  void generate(http::HttpRequest& req, const std::shared_ptr<http::HttpExchange>& ex, const std::string& path);
  void tokenize(http::HttpRequest& req, http::HttpExchange& ex);
  void detokenize(http::HttpRequest& req, http::HttpExchange& ex);
  void begin_drain(int signal);
  void check_drain();
};

// One generation request in flight: drains its RequestStream on the I/O thread.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(ApiServer::State& s, uint64_t id, std::string path,
             std::shared_ptr<http::HttpExchange> ex, PreparedRequest prepared)
      : s_(s), id_(id), path_(std::move(path)), ex_(std::move(ex)),
        builder_(std::move(prepared.builder)), start_(Clock::now()) {}

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
    ARBOR_LOG(kDebug) << path_ << " " << streams_[0]->request_id()
                      << ": client disconnected, aborting";
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
          ex_->write(builder_->on_event(*ev));
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

  void start_stream() {
    if (started_) return;
    started_ = true;
    ++s_.responses_by_status[200];
    ex_->start_stream(200, "text/event-stream");
  }

  void finish(const engine::StreamEvent& ev) {
    done_ = true;
    int status = 200;
    if (!ev.error.ok()) {
      const ApiError e = error_from_status(ev.error);
      status = error_http_status(e, builder_->flavor());
      if (started_) {
        ex_->write(builder_->on_stream_error(e));
        ex_->finish_stream();
      } else {
        s_.send_error(*ex_, e, builder_->flavor());
      }
    } else if (builder_->streaming()) {
      start_stream();
      ex_->write(builder_->on_final(ev));
      ex_->finish_stream();
    } else {
      s_.send(*ex_, 200, builder_->on_final(ev));
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    ARBOR_LOG(kInfo) << "POST " << path_ << " " << status << " " << streams_[0]->request_id()
                     << " prompt=" << ev.usage.prompt_tokens
                     << " completion=" << ev.usage.completion_tokens << " "
                     << static_cast<int64_t>(secs * 1000) << "ms"
                     << (ex_->disconnected() ? " (client gone)" : "");
    ex_->set_on_disconnect(nullptr);
    for (auto& stream : streams_) stream->set_notify(nullptr);
    s_.active.erase(id_);  // may destroy *this: `keep` in drain() holds it
  }

  ApiServer::State& s_;
  uint64_t id_;
  std::string path_;
  std::shared_ptr<http::HttpExchange> ex_;
  std::unique_ptr<ResponseBuilder> builder_;
  std::vector<std::shared_ptr<engine::RequestStream>> streams_;  // one per prompt
  std::vector<bool> final_seen_;
  int32_t n_ = 1;
  engine::StreamEvent total_;  // the combined final event
  Clock::time_point start_;
  bool started_ = false;
  bool done_ = false;
};

void ApiServer::State::send(http::HttpExchange& ex, int status, std::string body,
                            const std::string& content_type) {
  ++responses_by_status[status];
  ex.respond({status, content_type, std::move(body)});
}

void ApiServer::State::send_error(http::HttpExchange& ex, const ApiError& e, ApiFlavor flavor) {
  const int status = error_http_status(e, flavor);
  ARBOR_LOG(kDebug) << "error " << status << ": " << e.message;
  send(ex, status, error_body(e, flavor));
}

void ApiServer::State::handle(http::HttpRequest req, std::shared_ptr<http::HttpExchange> ex) {
  std::string path = req.target.substr(0, req.target.find('?'));
  if (path.size() > 1 && path.back() == '/') path.pop_back();
  ARBOR_LOG(kDebug) << req.method << " " << req.target << " (" << req.body.size() << " bytes)";
  try {
    if (!route(req.method, path, req, ex)) send_error(*ex, route_not_found(req.method, path),
                                                      ApiFlavor::kOpenAi);
  } catch (const std::exception& e) {
    // nlohmann::json throws on misuse; a request must never take the server down.
    send_error(*ex, error_from_status(internal_error("request failed: ", e.what())),
               ApiFlavor::kOpenAi);
  }
}

bool ApiServer::State::route(const std::string& method, const std::string& path,
                             http::HttpRequest& req, const std::shared_ptr<http::HttpExchange>& ex) {
  static const std::map<std::string, std::string> kRoutes{
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/generate", "POST"},
      {"/generate_stream", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
      {"/v1/models", "GET"}, {"/info", "GET"}, {"/health", "GET"}, {"/metrics", "GET"}};
  auto it = kRoutes.find(path);
  if (it == kRoutes.end()) return false;
  if (method != it->second) {
    send_error(*ex, method_not_allowed(method, path), ApiFlavor::kOpenAi);
    return true;
  }
  if (path == "/health") {
    if (draining) {
      send_error(*ex, server_unavailable("the server is shutting down"), ApiFlavor::kOpenAi);
    } else {
      send(*ex, 200, "{}");
    }
  } else if (path == "/metrics") {
    ServerMetrics sm;
    sm.kv_blocks_total = options.kv_blocks_total;
    sm.kv_blocks_free = engine->num_free_blocks();
    sm.active_requests = static_cast<int64_t>(active.size());
    sm.responses_by_status = responses_by_status;
    send(*ex, 200, prometheus_text(engine->metrics(), sm), "text/plain; version=0.0.4");
  } else if (path == "/v1/models") {
    send(*ex, 200, models_json(model));
  } else if (path == "/info") {
    send(*ex, 200, tgi_info_json(model, options.max_concurrent_requests));
  } else if (path == "/tokenize") {
    tokenize(req, *ex);
  } else if (path == "/detokenize") {
    detokenize(req, *ex);
  } else {
    generate(req, ex, path);
  }
  return true;
}

void ApiServer::State::generate(http::HttpRequest& req, const std::shared_ptr<http::HttpExchange>& ex,
                                const std::string& path) {
  const bool tgi = path == "/generate" || path == "/generate_stream";
  const ApiFlavor flavor = tgi ? ApiFlavor::kTgi : ApiFlavor::kOpenAi;
  if (draining) {
    send_error(*ex, server_unavailable("the server is shutting down"), flavor);
    return;
  }
  json body;
  std::optional<ApiError> err = parse_json_object(req.body, &body);
  PreparedRequest prepared;
  if (!err) {
    if (path == "/v1/completions") {
      err = prepare_completion(body, model, &prepared);
    } else if (path == "/v1/chat/completions") {
      err = prepare_chat(body, model, &prepared);
    } else {
      err = prepare_tgi(body, model, path == "/generate_stream", &prepared);
    }
  }
  if (err) {
    send_error(*ex, *err, flavor);
    return;
  }
  const uint64_t id = next_id++;
  const int32_t n = prepared.request.n;
  std::vector<engine::GenerateRequest> requests;
  for (auto& prompt : prepared.more_prompts) {
    engine::GenerateRequest more = prepared.request;
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
      send_error(*ex, error_from_status(stream.status()), flavor);
      return;
    }
    streams.push_back(std::move(stream).value());
  }
  auto g = std::make_shared<Generation>(*this, id, path, ex, std::move(prepared));
  active.emplace(id, g);
  g->start(std::move(streams), n);
}

void ApiServer::State::tokenize(http::HttpRequest& req, http::HttpExchange& ex) {
  json body;
  std::optional<ApiError> err = parse_json_object(req.body, &body);
  std::string text;
  bool add_special = true;
  if (!err) err = read_string(body, "prompt", &text);
  if (!err) err = read_bool(body, "add_special_tokens", &add_special);
  if (!err && !body.contains("prompt")) err = invalid_param("prompt", "'prompt' is required");
  if (err) {
    send_error(ex, *err, ApiFlavor::kOpenAi);
    return;
  }
  tokenizer::EncodeOptions enc;
  if (!add_special) enc.add_bos = false;
  const std::vector<int32_t> ids = model.tokenizer->encode(text, enc);
  json out{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.context_length}};
  send(ex, 200, dump_json(out));
}

void ApiServer::State::detokenize(http::HttpRequest& req, http::HttpExchange& ex) {
  json body;
  std::optional<ApiError> err = parse_json_object(req.body, &body);
  std::vector<int32_t> ids;
  if (!err) {
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) {
      err = invalid_param("tokens", "'tokens' is required and must be an array of token ids");
    } else {
      err = read_token_ids(*it, "tokens", model, &ids);
    }
  }
  if (err) {
    send_error(ex, *err, ApiFlavor::kOpenAi);
    return;
  }
  send(ex, 200, dump_json(json{{"prompt", model.tokenizer->decode(ids)}}));
}

void ApiServer::State::begin_drain(int signal) {
  if (draining) {
    ARBOR_LOG(kWarn) << "second signal " << signal << ": stopping now";
    aborted_all = true;
    for (auto& [id, g] : active) g->abort();
    poster->close();
    http->stop();
    return;
  }
  draining = true;
  drain_deadline = Clock::now() + std::chrono::milliseconds(
                                      static_cast<int64_t>(options.shutdown_timeout_s * 1000));
  ARBOR_LOG(kInfo) << "signal " << signal << ": draining " << active.size()
                   << " requests (deadline " << options.shutdown_timeout_s << "s)";
  http->stop_accepting();
  check_drain();
}

void ApiServer::State::check_drain() {
  if (active.empty()) {
    ARBOR_LOG(kInfo) << "drained; shutting down";
    poster->close();
    http->stop();
    return;
  }
  if (!aborted_all && Clock::now() >= drain_deadline) {
    ARBOR_LOG(kWarn) << "shutdown deadline reached: aborting " << active.size() << " requests";
    aborted_all = true;
    for (auto& [id, g] : active) g->abort();
  }
  http->run_after(0.05, [this] { check_drain(); });
}

ApiServer::ApiServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

ApiServer::~ApiServer() {
  if (state_->poster) state_->poster->close();
}

Result<std::unique_ptr<ApiServer>> ApiServer::create(engine::EngineCore& engine, ModelInfo model,
                                                     const ApiServerOptions& options) {
  if (model.tokenizer == nullptr) return invalid_argument("the server needs a tokenizer");
  auto state = std::make_unique<State>();
  state->engine = &engine;
  state->model = std::move(model);
  state->model.context_length = static_cast<int32_t>(engine.max_model_len());
  state->model.max_spec_tokens = engine.max_spec_tokens();
  state->options = options;
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
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(state)));
}

uint16_t ApiServer::port() const { return state_->http->port(); }

void ApiServer::run() {
  state_->http->run();
  state_->poster->close();
  // Requests still registered (second signal) were aborted; let the engine finish them so
  // their blocks are back before the engine is destroyed.
  state_->active.clear();
  state_->engine->wait_idle();
}

}  // namespace arbor::server
