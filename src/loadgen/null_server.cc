#include "loadgen/null_server.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

namespace arbor::loadgen {

using nlohmann::json;

namespace {

constexpr int64_t kMaxTokens = 1 << 20;

struct Chunks {       // the SSE text of one stream, built once per (model, endpoint)
  std::string first;  // chat: the role chunk
  std::string token;
  std::string last;  // the final token, with finish_reason "length"
};

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

Chunks make_chunks(const std::string& model, bool chat) {
  const json env{{"id", chat ? "chatcmpl-null" : "cmpl-null"},
                 {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", 0},
                 {"model", model}};
  auto chunk = [&](json delta, json reason) {
    json j = env;
    json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", std::move(reason)}};
    choice[chat ? "delta" : "text"] = std::move(delta);
    j["choices"] = json::array({std::move(choice)});
    return sse(j);
  };
  Chunks c;
  if (chat) c.first = chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
  c.token = chunk(chat ? json{{"content", " tok"}} : json(" tok"), nullptr);
  c.last = chunk(chat ? json{{"content", " tok"}} : json(" tok"), "length");
  return c;
}

std::string usage_chunk(const std::string& model, bool chat, int64_t prompt, int64_t completion) {
  return sse({{"id", chat ? "chatcmpl-null" : "cmpl-null"},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", 0},
              {"model", model},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion}}}});
}

int64_t prompt_tokens(const json& body, bool chat) {
  const json* p = nullptr;
  if (chat) {
    auto m = body.find("messages");
    if (m != body.end() && m->is_array() && !m->empty() && (*m)[0].is_object()) {
      auto c = (*m)[0].find("content");
      if (c != (*m)[0].end()) p = &*c;
    }
  } else if (auto it = body.find("prompt"); it != body.end()) {
    p = &*it;
  }
  if (p == nullptr) return 0;
  if (p->is_array()) return static_cast<int64_t>(p->size());
  if (!p->is_string()) return 0;
  const std::string& s = p->get_ref<const std::string&>();  // words, as a stand-in for tokens
  int64_t words = 0;
  bool in_word = false;
  for (char ch : s) {
    const bool space = ch == ' ' || ch == '\n' || ch == '\t';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

using Clock = std::chrono::steady_clock;

http::HttpResponse error_response(int status, const std::string& message) {
  return {status, "application/json",
          json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}}.dump()};
}

}  // namespace

struct NullServer::State {
  NullServerOptions o;
  Chunks completion_chunks;
  Chunks chat_chunks;
  std::unique_ptr<http::HttpServer> http;

  void handle(const http::HttpRequest& req, const std::shared_ptr<http::HttpExchange>& ex);
  void generate(const json& body, bool chat, const std::shared_ptr<http::HttpExchange>& ex);
  void paced(std::shared_ptr<http::HttpExchange> ex, const Chunks* c, int64_t i, int64_t n,
             std::string tail, Clock::time_point start);
};

void NullServer::State::handle(const http::HttpRequest& req,
                               const std::shared_ptr<http::HttpExchange>& ex) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  if (req.method == "GET" && path == "/health") return ex->respond({200, "application/json", "{}"});
  if (req.method == "GET" && path == "/v1/models") {
    const json m{{"object", "list"},
                 {"data", json::array({{{"id", o.model},
                                        {"object", "model"},
                                        {"created", 0},
                                        {"owned_by", "arbor-null"}}})}};
    return ex->respond({200, "application/json", m.dump()});
  }
  const bool chat = path == "/v1/chat/completions";
  if (!chat && path != "/v1/completions")
    return ex->respond(error_response(404, "no route " + path));
  if (req.method != "POST") return ex->respond(error_response(405, "use POST"));
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return ex->respond(error_response(400, "the body is not a JSON object"));
  generate(body, chat, ex);
}

void NullServer::State::generate(const json& body, bool chat,
                                 const std::shared_ptr<http::HttpExchange>& ex) {
  int64_t n = o.default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kMaxTokens) {
      return ex->respond(
          error_response(400, str_cat("'", key, "' must be in [1, ", kMaxTokens, "]")));
    }
    n = it->get<int64_t>();
  }
  const bool stream = body.value("stream", false);
  bool usage = false;
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    usage = so->value("include_usage", false);
  }
  const int64_t prompt = prompt_tokens(body, chat);
  if (!stream) {
    std::string text;
    for (int64_t i = 0; i < n; ++i) text += " tok";
    json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", "length"}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    const json j{
        {"id", "null"},
        {"object", chat ? "chat.completion" : "text_completion"},
        {"created", 0},
        {"model", o.model},
        {"choices", json::array({choice})},
        {"usage",
         {{"prompt_tokens", prompt}, {"completion_tokens", n}, {"total_tokens", prompt + n}}}};
    return ex->respond({200, "application/json", j.dump()});
  }
  const Chunks& c = chat ? chat_chunks : completion_chunks;
  std::string tail = usage ? usage_chunk(o.model, chat, prompt, n) : std::string();
  tail += "data: [DONE]\n\n";
  ex->start_stream(200, "text/event-stream");
  if (o.tokens_per_second <= 0 && o.ttft_ms <= 0) {
    std::string all;
    all.reserve(c.first.size() + static_cast<size_t>(n) * c.token.size() + tail.size());
    all += c.first;
    for (int64_t i = 0; i + 1 < n; ++i) all += c.token;
    all += c.last;
    all += tail;
    ex->write(std::move(all));
    ex->finish_stream();
    return;
  }
  paced(ex, &c, 0, n, std::move(tail), Clock::now());
}

// Chunk i is due at start + ttft + i / tokens_per_second (absolute, so timer slack does not
// accumulate).
void NullServer::State::paced(std::shared_ptr<http::HttpExchange> ex, const Chunks* c, int64_t i,
                              int64_t n, std::string tail, Clock::time_point start) {
  const double gap = o.tokens_per_second > 0 ? 1.0 / o.tokens_per_second : 0.0;
  const double due_s = o.ttft_ms / 1000.0 + static_cast<double>(i) * gap;
  const double wait = due_s - std::chrono::duration<double>(Clock::now() - start).count();
  http->run_after(wait,
                  [this, ex = std::move(ex), c, i, n, tail = std::move(tail), start]() mutable {
                    if (ex->disconnected()) return;
                    if (i + 1 < n) {
                      ex->write(i == 0 ? c->first + c->token : c->token);
                      paced(std::move(ex), c, i + 1, n, std::move(tail), start);
                      return;
                    }
                    ex->write((i == 0 ? c->first : std::string()) + c->last + tail);
                    ex->finish_stream();
                  });
}

Result<std::unique_ptr<NullServer>> NullServer::create(const NullServerOptions& options) {
  if (options.tokens_per_second < 0 || options.ttft_ms < 0) {
    return invalid_argument("--tokens-per-second and --ttft-ms must be >= 0");
  }
  auto state = std::make_unique<State>();
  state->o = options;
  state->completion_chunks = make_chunks(options.model, false);
  state->chat_chunks = make_chunks(options.model, true);
  State* s = state.get();
  ARBOR_ASSIGN_OR_RETURN(
      state->http,
      http::HttpServer::create(
          options.http, [s](http::HttpRequest req, std::shared_ptr<http::HttpExchange> ex) {
            s->handle(req, ex);
          }));
  http::HttpServer* http = state->http.get();
  state->http->on_signal([http](int) { http->stop(); });
  return std::unique_ptr<NullServer>(new NullServer(std::move(state)));
}

NullServer::NullServer(std::unique_ptr<State> state) : state_(std::move(state)) {}
NullServer::~NullServer() = default;

uint16_t NullServer::port() const { return state_->http->port(); }
void NullServer::run() { state_->http->run(); }
void NullServer::stop() { state_->http->stop(); }

}  // namespace arbor::loadgen
