// Request ids and the request log of the API server.
//
// Every request the API server handles has one id: the client's X-Request-Id when it sent a
// usable one (1 to 128 visible ASCII characters), else 32 random hex digits. Every answer
// carries it back in X-Request-Id; OpenAI bodies build their "id" on it as vLLM does
// ("chatcmpl-<id>", "cmpl-<id>"); and the request's log line names the id the client sees: the
// body's id when the answer has one, else the request id. So a client's id (or the one in its
// answer) finds its line with grep.
//
// A LoggedExchange wraps one request's HTTP exchange and writes its line once, when the answer
// ends (the last stream chunk or the whole response), or when it is dropped unanswered (the
// client left while its request was prepared):
//
//   POST /v1/chat/completions 200 chatcmpl-6f1c... 412ms prompt=24 completion=16
//   POST /v1/completions 400 0b9e41... 1ms: 'top_p' is 1.5, must be in (0, 1]
//   POST /generate_stream 200 77ac03... 5120ms prompt=4 completion=310 (client gone)
//   GET /v1/models/nope 404 5d20aa... 0ms: the model 'nope' does not exist; ...
//
// The line is at info level, failures included; successful answers of the probe routes
// (/health, /metrics: polled by load balancers and scrapers) are at debug. Its time runs from
// the request's arrival (fully read) to the end of its answer. The status is the one sent
// ("-": none could be, the client had left).
// Threading: I/O thread only, like the exchange it wraps (so it is never destroyed elsewhere).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "http/http_server.h"

namespace arbor::server {

// The client's X-Request-Id when usable, else a new random id.
std::string request_id_for(const http::HttpRequest& request);

class LoggedExchange final : public http::HttpExchange {
 public:
  // Adds the X-Request-Id header to the answer.
  LoggedExchange(std::shared_ptr<http::HttpExchange> inner, std::string method, std::string path,
                 std::string request_id);
  // Logs the line if the answer never ended.
  ~LoggedExchange() override;

  void respond(http::HttpResponse response) override;
  void start_stream(int status, const std::string& content_type) override;
  void write(std::string data) override;
  void finish_stream() override;
  void add_header(std::string name, std::string value) override;
  void set_on_disconnect(std::function<void()> fn) override;
  bool disconnected() const override;
  int sent_status() const override;

  const std::string& request_id() const { return request_id_; }
  // The id the answer's body carries ("chatcmpl-..."): the line names it instead.
  void set_response_id(std::string id) { response_id_ = std::move(id); }
  // Successful answers are logged at debug (probe routes).
  void set_quiet_success(bool quiet) { quiet_success_ = quiet; }
  // The request's Last-Event-ID header (a reconnecting SSE client), "" if none.
  void set_last_event_id(std::string id) { last_event_id_ = std::move(id); }
  const std::string& last_event_id() const { return last_event_id_; }
  // The request's X-Session-Id header, "" if none.
  void set_session(std::string session) { session_ = std::move(session); }
  const std::string& session() const { return session_; }
  // Put after the time ("prompt=24 completion=16").
  void set_detail(std::string detail) { detail_ = std::move(detail); }
  // Why the request failed, put at the end of the line.
  void set_error(std::string message) { error_ = std::move(message); }

 private:
  void log_line();

  std::shared_ptr<http::HttpExchange> inner_;
  std::string method_;
  std::string path_;
  std::string request_id_;
  std::string response_id_;
  std::string last_event_id_;
  std::string session_;
  std::string detail_;
  std::string error_;
  std::chrono::steady_clock::time_point start_;
  bool quiet_success_ = false;
  bool logged_ = false;
};

}  // namespace arbor::server
