// The web page and the engine view's event stream (issue 38; docs/web_ui.md), on a live server:
// GET / answers browsers with the page and other clients with TGI's health as before; the
// embedded files are the source files byte for byte; GET /v1/engine/events streams "data: {json}"
// events (a first one at once, then one per interval) that show a running request, its KV blocks
// and the steps; at most 8 streams; the API key and --no-webui; a drain ends the streams.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using json = nlohmann::json;

std::string source_file(const std::string& relative) {
  std::ifstream f(std::string(ARBOR_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct RawResponse {
  std::string head;  // status line and headers
  std::string body;
};

// GET `path` on a fresh connection ("Connection: close"), with `headers` ("Name: value\r\n"...).
RawResponse raw_get(int port, const std::string& path, const std::string& headers = "") {
  const std::string got = raw_exchange(
      port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers + "\r\n",
      size_t{1} << 30);
  const size_t end = got.find("\r\n\r\n");
  if (end == std::string::npos) return {got, ""};
  return {got.substr(0, end), got.substr(end + 4)};
}

constexpr const char* kBrowserAccept =
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n";

// A client of GET /v1/engine/events on a raw socket: the head, then the chunked body cut into
// the events' JSON.
class EventClient {
 public:
  EventClient(int port, const std::string& headers = "") {
    fd_ = connect_to(port);
    if (fd_ >= 0) {
      send_all(fd_, "GET /v1/engine/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n");
    }
  }
  ~EventClient() { close_now(); }
  void close_now() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Reads until `n` more events arrived, the stream ended or `timeout_s` passed.
  std::vector<json> next(size_t n, double timeout_s = 5.0) {
    std::vector<json> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (out.size() < n && !ended_) {
      take_events(out, n);
      if (out.size() >= n) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) break;
    }
    return out;
  }
  const std::string& head() const { return head_; }
  const std::string& raw_body() const { return body_; }  // the de-chunked bytes so far
  bool ended() const { return ended_; }                   // the last chunk arrived

 private:
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      ended_ = true;
      return false;
    }
    raw_.append(buf, static_cast<size_t>(n));
    parse();
    return true;
  }
  void parse() {
    if (head_.empty()) {
      const size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return;
      head_ = raw_.substr(0, end);
      raw_.erase(0, end + 4);
      chunked_ = head_.find("Transfer-Encoding: chunked") != std::string::npos;
      const size_t cl = head_.find("Content-Length: ");
      if (cl != std::string::npos) length_ = std::stoul(head_.substr(cl + 16));
    }
    if (!chunked_) {  // a plain answer (an error): ends with its Content-Length
      body_ += raw_;
      raw_.clear();
      ended_ = body_.size() >= length_;
      return;
    }
    for (;;) {  // whole chunks only
      const size_t line = raw_.find("\r\n");
      if (line == std::string::npos) return;
      const size_t size = std::stoul(raw_.substr(0, line), nullptr, 16);
      if (raw_.size() < line + 2 + size + 2) return;
      if (size == 0) ended_ = true;
      body_ += raw_.substr(line + 2, size);
      raw_.erase(0, line + 2 + size + 2);
    }
  }
  void take_events(std::vector<json>& out, size_t n) {
    size_t end;
    while (out.size() < n && (end = body_.find("\n\n", pos_)) != std::string::npos) {
      const std::string event = body_.substr(pos_, end - pos_);
      pos_ = end + 2;
      if (event.starts_with(":")) continue;  // a keep-alive comment
      EXPECT_TRUE(event.starts_with("data: ")) << event;
      out.push_back(json::parse(event.substr(6), nullptr, false));
      EXPECT_FALSE(out.back().is_discarded()) << event;
    }
  }

  int fd_ = -1;
  std::string raw_, head_, body_;
  size_t pos_ = 0;
  bool chunked_ = false;
  size_t length_ = 0;
  bool ended_ = false;
};

TEST(ServerWeb, PageForBrowsersHealthForOtherClients) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  // curl, load balancers, TGI clients: TGI's health answer, as before.
  const HttpResult health = server.get("/");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "{}");
  // A browser: the page, byte for byte the source file, with its security headers.
  const RawResponse page = raw_get(server.port(), "/", kBrowserAccept);
  EXPECT_NE(page.head.find("HTTP/1.1 200"), std::string::npos) << page.head;
  EXPECT_NE(page.head.find("Content-Type: text/html; charset=utf-8"), std::string::npos);
  EXPECT_NE(page.head.find("Content-Security-Policy: default-src 'none'; script-src 'self'"),
            std::string::npos) << page.head;
  EXPECT_NE(page.head.find("X-Content-Type-Options: nosniff"), std::string::npos);
  EXPECT_EQ(page.body, source_file("src/server/web/index.html"));
  const RawResponse js = raw_get(server.port(), "/ui/app.js");
  EXPECT_NE(js.head.find("Content-Type: text/javascript; charset=utf-8"), std::string::npos);
  EXPECT_EQ(js.body, source_file("src/server/web/app.js"));
  const RawResponse css = raw_get(server.port(), "/ui/style.css");
  EXPECT_NE(css.head.find("Content-Type: text/css; charset=utf-8"), std::string::npos);
  EXPECT_EQ(css.body, source_file("src/server/web/style.css"));
  EXPECT_GT(js.body.size(), 1000u);
  EXPECT_EQ(server.get("/ui/nope.js").status, 404);
  EXPECT_EQ(server.request("POST", "/ui/app.js", "{}").status, 404);
  // POST / is still TGI's generate.
  const HttpResult tgi = server.post("/", {{"inputs", "Once"}, {"parameters", {{"max_new_tokens", 2}}}});
  EXPECT_EQ(tgi.status, 200) << tgi.body;
  EXPECT_TRUE(tgi.json().is_array()) << tgi.body;
  EXPECT_EQ(server.terminate(), 0);
}

// The fields every event has, with their types.
void expect_event_shape(const json& e) {
  EXPECT_EQ(e.value("object", ""), "engine.event") << e.dump();
  EXPECT_EQ(e.value("model", ""), "stories260K");
  EXPECT_TRUE(e["time"].is_number());
  EXPECT_DOUBLE_EQ(e.value("interval_s", 0.0), 0.25);
  for (const char* k : {"running", "waiting", "steps_skipped"}) EXPECT_TRUE(e[k].is_number_integer()) << k;
  for (const char* k : {"usable_blocks", "used_blocks", "shared_blocks", "cached_blocks"}) {
    EXPECT_TRUE(e["kv"][k].is_number_integer()) << k;
  }
  EXPECT_TRUE(e["throughput"]["prompt_tokens_per_s"].is_number());
  EXPECT_TRUE(e["throughput"]["generation_tokens_per_s"].is_number());
  for (const char* k : {"steps", "requests_submitted", "requests_finished", "prompt_tokens",
                        "generation_tokens", "draft_tokens", "accepted_draft_tokens"}) {
    EXPECT_TRUE(e["totals"][k].is_number_integer()) << k;
  }
  EXPECT_TRUE(e["steps"].is_array());
  EXPECT_TRUE(e["requests"].is_array());
}

TEST(ServerWeb, EngineEventsShowARunningRequest) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  EventClient idle(server.port());
  std::vector<json> ev = idle.next(2);
  ASSERT_EQ(ev.size(), 2u) << idle.head() << idle.raw_body();
  EXPECT_NE(idle.head().find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(idle.head().find("Content-Type: text/event-stream"), std::string::npos) << idle.head();
  EXPECT_NE(idle.head().find("Cache-Control: no-cache"), std::string::npos);
  for (const json& e : ev) expect_event_shape(e);
  // The first event comes at once, the next an interval later.
  const double gap = ev[1]["time"].get<double>() - ev[0]["time"].get<double>();
  EXPECT_GT(gap, 0.15);
  EXPECT_LT(gap, 2.0);
  EXPECT_EQ(ev[0]["running"], 0);
  EXPECT_EQ(ev[0]["kv"]["used_blocks"], 0);
  EXPECT_GT(ev[0]["kv"]["usable_blocks"].get<int>(), 0);
  EXPECT_TRUE(ev[0]["requests"].empty());

  // A long request: the events show it running, with its prompt, its KV blocks and its steps.
  int fd = -1;
  raw_exchange(server.port(),
               post_raw("/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":1900,"
                                           "\"ignore_eos\":true,\"stream\":true}"),
               1, &fd);
  json busy;
  for (int i = 0; i < 20 && busy.is_null(); ++i) {
    for (const json& e : idle.next(1)) {
      if (e["running"] == 1 && !e["requests"].empty() && !e["steps"].empty()) busy = e;
    }
  }
  ASSERT_FALSE(busy.is_null()) << "no event showed the request running";
  const json& row = busy["requests"][0];
  EXPECT_TRUE(row["id"].get<std::string>().starts_with("http-")) << row.dump();
  EXPECT_EQ(row["state"], "running");
  EXPECT_EQ(row["samples"], 1);
  EXPECT_EQ(row["prompt_tokens"], 5) << "'Once upon a time' is BOS + 4 tokens in stories260K";
  EXPECT_GT(row["output_tokens"].get<int>(), 0);
  EXPECT_TRUE(row["acceptance"].is_null());  // no speculation
  EXPECT_GT(busy["kv"]["used_blocks"].get<int>(), 0);
  const json& step = busy["steps"].back();
  EXPECT_EQ(step["requests"], 1);
  EXPECT_EQ(step["decode_requests"], 1);
  EXPECT_EQ(step["generated_tokens"], 1);
  EXPECT_EQ(step["kv_used_blocks"], busy["kv"]["used_blocks"]);
  // The client leaves at once (1900 tokens of stories260K take well under a second on a fast
  // host): the request is aborted and the events show it gone.
  close(fd);
  json after;
  for (int i = 0; i < 20 && after.is_null(); ++i) {
    for (const json& e : idle.next(1)) {
      // Steps are numbered, each sent once per stream, in order.
      if (!e["steps"].empty()) {
        EXPECT_GT(e["steps"][0]["step"].get<int64_t>(), step["step"].get<int64_t>());
      }
      if (e["running"] == 0 && e["requests"].empty() && e["kv"]["used_blocks"] == 0) after = e;
    }
  }
  ASSERT_FALSE(after.is_null());
  EXPECT_EQ(after["totals"]["requests_aborted"], 1);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerWeb, AtMostEightStreamsAndTheApiKey) {
  ServerProcess server({"--api-key", "sk-web"});
  ASSERT_TRUE(server.ok());
  const std::string auth = "Authorization: Bearer sk-web\r\n";
  // The stream needs the key; the page's files do not (the page asks for it).
  EventClient anonymous(server.port());
  anonymous.next(1, 2.0);
  EXPECT_NE(anonymous.head().find("HTTP/1.1 401"), std::string::npos) << anonymous.head();
  EXPECT_NE(anonymous.raw_body().find("invalid_api_key"), std::string::npos);
  EXPECT_NE(raw_get(server.port(), "/", kBrowserAccept).head.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(raw_get(server.port(), "/ui/app.js").head.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(raw_get(server.port(), "/").head.find("HTTP/1.1 401"), std::string::npos)
      << "TGI's health at / keeps needing the key";
  // A page on another origin cannot read the stream.
  EventClient foreign(server.port(), auth + "Origin: http://evil.example\r\n");
  foreign.next(1, 2.0);
  EXPECT_NE(foreign.head().find("HTTP/1.1 403"), std::string::npos) << foreign.head();

  std::vector<std::unique_ptr<EventClient>> open;
  for (int i = 0; i < 8; ++i) {
    open.push_back(std::make_unique<EventClient>(server.port(), auth));
    ASSERT_EQ(open.back()->next(1).size(), 1u) << "stream " << i;
  }
  EventClient ninth(server.port(), auth);
  ninth.next(1, 2.0);
  EXPECT_NE(ninth.head().find("HTTP/1.1 429"), std::string::npos) << ninth.head();
  const json err = json::parse(ninth.raw_body(), nullptr, false);
  EXPECT_EQ(err["error"]["code"], "too_many_subscribers") << ninth.raw_body();
  EXPECT_NE(err["error"]["message"].get<std::string>().find("at most 8"), std::string::npos);
  // One leaves: its place is free again once the server notices.
  open[3]->close_now();
  bool reopened = false;
  for (int i = 0; i < 50 && !reopened; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EventClient again(server.port(), auth);
    reopened = again.next(1, 2.0).size() == 1;
  }
  EXPECT_TRUE(reopened);
  EXPECT_EQ(server.request("POST", "/v1/engine/events", "{}",
                           "-H 'Authorization: Bearer sk-web'").status, 405);
  // The others still stream.
  EXPECT_EQ(open[0]->next(1).size(), 1u);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerWeb, ApiKeyOnAllRoutesCoversThePage) {
  ServerProcess server({"--api-key", "sk-web", "--api-key-all-routes"});
  ASSERT_TRUE(server.ok());
  EXPECT_NE(raw_get(server.port(), "/", kBrowserAccept).head.find("HTTP/1.1 401"), std::string::npos);
  EXPECT_NE(raw_get(server.port(), "/ui/app.js").head.find("HTTP/1.1 401"), std::string::npos);
  EXPECT_NE(raw_get(server.port(), "/ui/app.js", "Authorization: Bearer sk-web\r\n")
                .head.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerWeb, NoWebUiKeepsHealthAtRootAndTheEventStream) {
  ServerProcess server({"--no-webui"});
  ASSERT_TRUE(server.ok());
  const RawResponse root = raw_get(server.port(), "/", kBrowserAccept);
  EXPECT_NE(root.head.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_EQ(root.body, "{}");
  EXPECT_EQ(server.get("/ui/app.js").status, 404);
  EventClient events(server.port());
  EXPECT_EQ(events.next(1).size(), 1u);
  EXPECT_EQ(server.terminate(), 0);
}

// SIGTERM: open engine views end at once (the chunk terminator), so they do not hold the drain.
TEST(ServerWeb, DrainEndsTheEventStreams) {
  ServerProcess server({"--shutdown-timeout", "30"});
  ASSERT_TRUE(server.ok());
  EventClient events(server.port());
  ASSERT_EQ(events.next(1).size(), 1u);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait_exit(), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  events.next(100, 2.0);
  EXPECT_TRUE(events.ended()) << "the stream must end with its last chunk";
}

}  // namespace
}  // namespace arbor::server::testing
