// HttpServer: an HTTP/1.1 server on Boost.Asio/Beast with one I/O thread.
//
// Every connection is a state machine on that thread (no thread per connection), so thousands of
// idle or streaming clients cost memory, not threads. Requests are parsed with Beast (body limit,
// header limit, keep-alive); responses are written as plain bytes: a complete response with
// Content-Length, or a chunked stream (server-sent events) with keep-alive comments while idle.
// While a request is being handled the connection keeps a read pending, so a client that hangs
// up is noticed at once and the handler's disconnect callback runs (the engine request is
// aborted there). Beast and Asio appear only in http_server.cc.
//
// Threading: the handler, every HttpExchange method and every post()ed function run on the I/O
// thread (the one inside run()); post() and stop() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace arbor::http {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/v1/completions?x=1"
  HttpHeaders headers;  // as received, in order
  std::string body;
  // The first header named `name` (case-insensitive), or "" when absent.
  std::string_view header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int status, std::string content_type, std::string body, HttpHeaders headers = {})
      : status(status), content_type(std::move(content_type)), body(std::move(body)),
        headers(std::move(headers)) {}

  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;  // sent after Content-Type
};

// One request/response exchange on a connection. The handler answers exactly once: respond(),
// or start_stream() + write()* + finish_stream(). Calls after the client disconnected are ignored.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void respond(HttpResponse response) = 0;
  // Sends the status line and headers of a chunked response ("text/event-stream").
  virtual void start_stream(int status, const std::string& content_type) = 0;
  virtual void write(std::string data) = 0;
  virtual void finish_stream() = 0;
  // Adds a header to the response this exchange will send (respond() or start_stream()).
  virtual void add_header(std::string name, std::string value) = 0;
  // `fn` runs once if the client disconnects before the exchange ends; replaced by a later call.
  virtual void set_on_disconnect(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
  // The status line sent (respond() may send 503 instead of the response it was given, see
  // HttpServerOptions::max_queued_output); 0 before an answer or when none could be sent.
  virtual int sent_status() const = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;                       // 0 = any free port (see HttpServer::port())
  size_t body_limit = 8u << 20;               // bytes; larger bodies get 413
  double sse_keepalive_s = 15.0;              // ": keep-alive" comment after this much silence
  double idle_timeout_s = 120.0;              // close a connection idle between requests
  // Open connections beyond this are answered 503 and closed at once; 0 = no cap.
  int64_t max_connections = 0;
  // Output bounds, so clients that do not read cannot grow the server: a connection whose
  // unsent bytes would pass max_connection_output is closed (its request aborted); a response
  // that would take all connections' unsent bytes past max_queued_output is answered 503
  // instead; a connection that takes no byte for write_timeout_s is closed (0 = never).
  size_t max_connection_output = 64u << 20;
  int64_t max_queued_output = int64_t{512} << 20;
  double write_timeout_s = 60.0;
  // Every response status sent (the handler's and the server's own: 400, 413, 431, 503 ...),
  // on the I/O thread; for /metrics.
  std::function<void(int)> on_status;
  // Body of the errors the server answers itself (413, malformed request line or headers, a
  // handler that threw): (status, code, message) -> JSON. Empty = {"error": {"message": ...,
  // "type": ..., "code": ...}}, OpenAI's shape; the API layer passes its own.
  std::function<std::string(int, std::string_view, std::string_view)> error_body;
};

// The default error_body: OpenAI's shape with `message` JSON-escaped.
std::string default_error_body(int status, std::string_view code, std::string_view message);

class HttpServer {
 public:
  // Binds and listens; errors name the address. `handler` must stay valid until run() returns.
  static Result<std::unique_ptr<HttpServer>> create(const HttpServerOptions& options,
                                                    HttpHandler handler);
  ~HttpServer();

  uint16_t port() const;
  // I/O thread: exchanges not yet complete on the wire (a response still being written counts
  // until its last byte is sent or the client is gone).
  int64_t open_exchanges() const;
  // Runs the event loop on the calling thread until stop().
  void run();
  // Any thread: ends run() (pending connections are dropped).
  void stop();
  // Any thread: runs `fn` on the I/O thread.
  void post(std::function<void()> fn);
  // I/O thread: runs `fn` there after `seconds`.
  void run_after(double seconds, std::function<void()> fn);
  // I/O thread: closes the listening socket; open connections keep going, each closed once its
  // current exchange is written (responses say "Connection: close").
  void stop_accepting();
  // Runs `fn(signal)` on the I/O thread on each SIGINT or SIGTERM.
  void on_signal(std::function<void(int)> fn);

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor::http
