// Beast/Asio implementation of HttpServer (the only file that includes them).
#include "http/http_server.h"

#include <array>
#include <cctype>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>

#include "base/log.h"
#include "base/strings.h"

namespace arbor::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes a connection may buffer ahead (pipelined requests) while a request is being handled.
constexpr size_t kMaxReadAhead = 1u << 20;
constexpr size_t kHeaderLimit = 16u << 10;
constexpr size_t kLingerBytes = 64u << 20;
// After accept() fails for want of file descriptors, wait this long before trying again (the
// pending connection stays in the backlog; retrying at once spins a core).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// After a client shuts down its sending side mid-exchange, when to look for the reset that a
// client which closed for good answers the probe with (after the probe is written).
constexpr std::array<std::chrono::milliseconds, 3> kProbeChecks = {
    std::chrono::milliseconds(1), std::chrono::milliseconds(20), std::chrono::milliseconds(250)};

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

// Beast's own parse errors (as opposed to socket errors and end of input).
bool is_parse_error(const beast::error_code& ec) {
  return ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category() &&
         ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message &&
         ec != bhttp::error::need_more;
}

std::string header_lines(const HttpHeaders& headers) {
  std::string out;
  for (const auto& [name, value] : headers) out += str_cat(name, ": ", value, "\r\n");
  return out;
}

std::string status_line(int status) {
  const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return str_cat("HTTP/1.1 ", status, " ", std::string_view(reason.data(), reason.size()),
                 "\r\n");
}

std::string chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return str_cat(size, data, "\r\n");
}

}  // namespace

std::string default_error_body(int status, std::string_view code, std::string_view message) {
  std::string escaped;
  for (const char c : message) {
    if (c == '"' || c == '\\') {
      escaped += '\\';
      escaped += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      escaped += buf;
    } else {
      escaped += c;
    }
  }
  const char* type = status >= 500 ? "internal_error" : "invalid_request_error";
  return str_cat("{\"error\": {\"message\": \"", escaped, "\", \"type\": \"", type,
                 "\", \"param\": null, \"code\": \"", code, "\"}}");
}

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::signal_set signals{ioc, SIGINT, SIGTERM};
  std::function<void(int)> on_signal;
  asio::steady_timer accept_backoff{ioc};
  uint16_t port = 0;
  int64_t connections = 0;     // open sessions
  int64_t exchanges = 0;       // sessions in an exchange (see open_exchanges())
  int64_t refused = 0;         // connections answered 503 for the cap
  bool draining = false;       // stop_accepting() was called: close after each exchange
  int64_t queued_bytes = 0;    // unsent response bytes over all sessions
  Clock::time_point last_fd_warning{};
  Clock::time_point last_busy_warning{};

  void accept();
  void refuse(tcp::socket socket);
  void answer_and_close(tcp::socket& socket, int status, std::string_view code,
                        std::string_view message, std::string_view headers);
  void count_status(int status) const {
    if (options.on_status) options.on_status(status);
  }
  void wait_signal();
  std::string error_body(int status, std::string_view code, std::string_view message) const {
    return options.error_body ? options.error_body(status, code, message)
                              : default_error_body(status, code, message);
  }
};

namespace {

class Session : public HttpExchange, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server)
      : socket_(std::move(socket)), server_(server), keepalive_timer_(server.ioc),
        idle_timer_(server.ioc), write_timer_(server.ioc) {
    ++server_.connections;
  }
  ~Session() override {
    --server_.connections;
    set_in_exchange(false);
  }

  void start() { do_read(); }

  void respond(HttpResponse r) override {
    if (closed_ || !in_exchange_ || answered_) return;
    if (server_.queued_bytes + static_cast<int64_t>(r.body.size()) >
        server_.options.max_queued_output) {
      // Too much output waits for clients that do not read: refuse this one rather than grow.
      if (Clock::now() - server_.last_busy_warning > std::chrono::seconds(10)) {
        server_.last_busy_warning = Clock::now();
        ARBOR_LOG(kWarn) << "answering 503 while " << server_.queued_bytes
                         << " bytes of responses are unsent (--max-output-mib: "
                         << server_.options.max_queued_output << " bytes)";
      }
      r = HttpResponse(503, "application/json",
                       server_.error_body(503, "server_busy",
                                          str_cat("the server holds ", server_.queued_bytes,
                                                  " bytes of unsent responses; retry later")),
                       {{"Retry-After", "5"}});
    }
    answered_ = true;
    ending_ = true;
    sent_status_ = r.status;
    server_.count_status(r.status);
    enqueue(str_cat(status_line(r.status), "Content-Type: ", r.content_type,
                    "\r\nContent-Length: ", r.body.size(), "\r\n", header_lines(r.headers),
                    header_lines(extra_headers_), "Connection: ",
                    keep_alive_ && !server_.draining ? "keep-alive" : "close", "\r\n\r\n",
                    r.body));
  }

  void start_stream(int status, const std::string& content_type) override {
    if (closed_ || !in_exchange_ || answered_) return;
    answered_ = true;
    streaming_ = true;
    sent_status_ = status;
    server_.count_status(status);
    enqueue(str_cat(status_line(status), "Content-Type: ", content_type,
                    "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n",
                    header_lines(extra_headers_), "Connection: ",
                    keep_alive_ && !server_.draining ? "keep-alive" : "close", "\r\n\r\n"));
    arm_keepalive();
  }

  void write(std::string data) override {
    if (closed_ || !streaming_ || data.empty()) return;
    wrote_since_tick_ = true;
    enqueue(chunk(data));
  }

  void finish_stream() override {
    if (closed_ || !streaming_) return;
    ending_ = true;
    enqueue("0\r\n\r\n");
  }

  void add_header(std::string name, std::string value) override {
    extra_headers_.emplace_back(std::move(name), std::move(value));
  }
  void set_on_disconnect(std::function<void()> fn) override { on_disconnect_ = std::move(fn); }
  bool disconnected() const override { return closed_; }
  int sent_status() const override { return sent_status_; }

 private:
  void set_in_exchange(bool on) {
    if (on == in_exchange_) return;
    in_exchange_ = on;
    server_.exchanges += on ? 1 : -1;
  }

  // Closes the connection if no request arrives in time (slow or forgotten clients).
  void arm_idle() {
    if (server_.options.idle_timeout_s <= 0) return;
    idle_timer_.expires_after(std::chrono::milliseconds(
        static_cast<int64_t>(server_.options.idle_timeout_s * 1000)));
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->in_exchange_ || self->closed_) return;
      if (self->buffer_.size() > 0 || (self->parser_ && self->parser_->got_some())) {
        // Part of a request came and the rest did not (a slow or stalled client): 408.
        self->answer_and_close(408, "request_timeout",
                               str_cat("the request did not arrive within ",
                                       self->server_.options.idle_timeout_s, " s"));
      } else {
        self->close();
      }
    });
  }

  // Impl::answer_and_close, then the session's close (its pending read ends).
  void answer_and_close(int status, std::string_view code, std::string_view message) {
    server_.answer_and_close(socket_, status, code, message, "");
    close();
  }

  // The header first (framing checks, Expect), then the body.
  void do_read() {
    arm_idle();
    parser_.emplace();
    parser_->body_limit(server_.options.body_limit);
    parser_->header_limit(kHeaderLimit);
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               self->on_header(ec);
                             });
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec) {
      on_read_error(ec);
      return;
    }
    const auto& req = parser_->get();
    // RFC 9112 6.1 / 6.3: a body is framed by exactly one of Content-Length and a final
    // `chunked`; anything else (another coding, both headers) could smuggle a second request
    // past us, so the request is refused and the connection closed.
    const auto te = req.find(bhttp::field::transfer_encoding);
    if (te != req.end()) {
      const std::string_view v = trim(std::string_view(te->value().data(), te->value().size()));
      if (!equal_ignore_case(v, "chunked")) {
        reject(400, "bad_framing",
               str_cat("Transfer-Encoding '", v, "' is not supported: only 'chunked' is"));
        return;
      }
      if (req.find(bhttp::field::content_length) != req.end()) {
        reject(400, "bad_framing", "both Transfer-Encoding and Content-Length are present");
        return;
      }
    }
    const auto expect = req.find(bhttp::field::expect);
    if (expect != req.end()) {
      const std::string_view v =
          trim(std::string_view(expect->value().data(), expect->value().size()));
      if (!equal_ignore_case(v, "100-continue")) {
        reject(417, "expectation_failed", str_cat("Expect '", v, "' is not supported"));
        return;
      }
      enqueue("HTTP/1.1 100 Continue\r\n\r\n");  // the body limit was checked with the header
    }
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->on_read(ec);
                      });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {
      reject(413, "body_too_large",
             str_cat("request body exceeds the limit of ", server_.options.body_limit,
                     " bytes"));
    } else if (ec == bhttp::error::header_limit) {
      const auto data = buffer_.data();
      const std::string_view got(static_cast<const char*>(data.data()), data.size());
      if (got.find("\r\n") == std::string_view::npos) {  // the request line alone is too long
        reject(414, "uri_too_long",
               str_cat("the request line exceeds the limit of ", kHeaderLimit, " bytes"));
      } else {
        reject(431, "headers_too_large",
               str_cat("request line and headers exceed the limit of ", kHeaderLimit, " bytes"));
      }
    } else if (is_parse_error(ec)) {
      reject(400, "malformed_request", str_cat("malformed HTTP request: ", ec.message()));
    } else {
      close();  // the client went away (or the idle timer closed the socket)
    }
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec) {
      on_read_error(ec);
      return;
    }
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    for (const auto& field : req) {
      r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    r.body = std::move(req.body());
    keep_alive_ = req.keep_alive();
    set_in_exchange(true);
    answered_ = false;
    sent_status_ = 0;
    extra_headers_.clear();
    watch();
    try {
      server_.handler(std::move(r), shared_from_this());
    } catch (const std::exception& e) {
      ARBOR_LOG(kError) << "handler threw: " << e.what();
      respond({500, "application/json",
               server_.error_body(500, "internal_error", str_cat("handler failed: ", e.what()))});
    }
  }

  // Answers a request that could not be taken (framing, limits) and closes the connection
  // afterwards.
  void reject(int status, std::string_view code, std::string_view message) {
    ARBOR_LOG(kInfo) << "HTTP " << status << ": " << message;
    set_in_exchange(true);
    answered_ = false;
    sent_status_ = 0;
    keep_alive_ = false;
    extra_headers_.clear();
    respond({status, "application/json", server_.error_body(status, code, message)});
  }

  // A read that only notices a hang-up (or buffers pipelined bytes) while a request runs.
  void watch() {
    if (watching_ || peer_done_ || buffer_.size() >= kMaxReadAhead) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->on_watch(ec, n);
                            });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (lingering()) {
      if (ec) {
        close();
      } else {
        discard();
      }
      return;
    }
    if (ec == asio::error::operation_aborted && !in_exchange_) {
      do_read();
      return;
    }
    if (ec == asio::error::eof && in_exchange_) {
      on_peer_shutdown();
      return;
    }
    if (ec) {
      disconnect();
      return;
    }
    buffer_.commit(n);
    if (in_exchange_) {
      watch();
    } else {
      do_read();
    }
  }

  // The client sent FIN while its request runs: it either closed for good or only shut its
  // sending side (`nc -N`, some proxies) and still waits for the answer. A stream finds out by
  // writing; before a plain response, an interim "100 Continue" (which every HTTP/1.1 client
  // must accept before the final response) is sent as a probe: a closed socket answers it with
  // a reset, seen within a round trip; a half-closed one reads it and gets its response.
  void on_peer_shutdown() {
    peer_done_ = true;
    keep_alive_ = false;
    if (streaming_ || answered_) return;
    probing_ = true;
    enqueue("HTTP/1.1 100 Continue\r\n\r\n");
  }

  // Disconnects if the client reset the connection (it closed it for good: the socket left
  // CLOSE_WAIT; recv() cannot tell, it reports the FIN first); else looks again after each of
  // kProbeChecks (a reset takes a round trip to come back).
  void check_reset(size_t next = 0) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
        info.tcpi_state != TCP_CLOSE_WAIT) {
      disconnect();
      return;
    }
    if (next >= kProbeChecks.size()) return;
    idle_timer_.expires_after(kProbeChecks[next]);
    idle_timer_.async_wait([self = shared_from_this(), next](beast::error_code ec) {
      if (!ec && !self->closed_) self->check_reset(next + 1);
    });
  }

  // Queues bytes for the client. A connection whose unsent output would pass
  // max_connection_output is cut (the client is not reading; its request is aborted).
  void enqueue(std::string bytes) {
    if (out_bytes_ > 0 && out_bytes_ + bytes.size() > server_.options.max_connection_output) {
      ARBOR_LOG(kWarn) << "closing a connection whose client does not read: " << out_bytes_
                       << " bytes unsent (limit " << server_.options.max_connection_output << ")";
      disconnect();
      return;
    }
    add_out_bytes(static_cast<int64_t>(bytes.size()));
    out_.push_back(std::move(bytes));
    if (!writing_) do_write();
  }

  void add_out_bytes(int64_t n) {
    out_bytes_ += n;
    server_.queued_bytes += n;
  }

  // Writes what the socket takes of the front buffer; every bit of progress re-arms the write
  // timeout, so a slow reader is fine and one that stopped reading is cut.
  void do_write() {
    writing_ = true;
    arm_write_timeout();
    socket_.async_write_some(
        asio::buffer(out_.front().data() + front_sent_, out_.front().size() - front_sent_),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_write(ec, n); });
  }

  void arm_write_timeout() {
    if (server_.options.write_timeout_s <= 0) return;
    write_timer_.expires_after(std::chrono::milliseconds(
        static_cast<int64_t>(server_.options.write_timeout_s * 1000)));
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->writing_) return;
      ARBOR_LOG(kWarn) << "closing a connection whose client read nothing for "
                       << self->server_.options.write_timeout_s << " s (" << self->out_bytes_
                       << " bytes unsent); its request is aborted";
      self->disconnect();
    });
  }

  void on_write(beast::error_code ec, size_t n) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      disconnect();
      return;
    }
    front_sent_ += n;
    add_out_bytes(-static_cast<int64_t>(n));
    if (front_sent_ < out_.front().size()) {
      do_write();
      return;
    }
    write_timer_.cancel();
    front_sent_ = 0;
    out_.pop_front();
    if (probing_) {  // the probe is out: on loopback a closed client's reset is already here
      probing_ = false;
      check_reset();
      if (closed_) return;
    }
    if (!out_.empty()) {
      do_write();
    } else if (ending_) {
      end_exchange();
    }
  }

  // The response of a non-keep-alive exchange is out; only waiting to close.
  bool lingering() const { return !in_exchange_ && !keep_alive_; }

  void end_exchange() {
    set_in_exchange(false);
    ending_ = false;
    streaming_ = false;
    on_disconnect_ = nullptr;
    keepalive_timer_.cancel();
    if (!keep_alive_ || server_.draining) {
      linger_close();
    } else if (watching_) {
      // Pipelined requests may already sit in buffer_; stop the watch (no write is pending
      // now) and let on_watch() start parsing, so two reads never overlap.
      beast::error_code ignored;
      socket_.cancel(ignored);
    } else {
      do_read();
    }
  }

  // Closing a socket with unread input sends a reset, which can destroy the response in
  // flight (a 413 while the client still uploads). So: half-close, read and discard until the
  // client closes too (at most kLingerBytes or one second), then close.
  void linger_close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    if (peer_done_) {
      close();
      return;
    }
    keepalive_timer_.expires_after(std::chrono::seconds(1));
    keepalive_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->close();
    });
    if (!watching_) discard();
  }

  void discard() {
    watching_ = true;
    socket_.async_read_some(asio::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->watching_ = false;
                              self->lingered_ += n;
                              if (self->closed_) return;
                              if (ec || self->lingered_ > kLingerBytes) {
                                self->close();
                              } else {
                                self->discard();
                              }
                            });
  }

  void arm_keepalive() {
    if (server_.options.sse_keepalive_s <= 0) return;
    keepalive_timer_.expires_after(std::chrono::milliseconds(
        static_cast<int64_t>(server_.options.sse_keepalive_s * 1000)));
    keepalive_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->streaming_ || self->ending_) return;
      if (!self->wrote_since_tick_) self->write(": keep-alive\n\n");
      self->wrote_since_tick_ = false;
      self->arm_keepalive();
    });
  }

  void disconnect() {
    if (closed_) return;
    std::function<void()> fn = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    const bool in_exchange = in_exchange_;
    close();
    if (fn && in_exchange) fn();
  }

  void close() {
    closed_ = true;
    set_in_exchange(false);
    out_.clear();
    add_out_bytes(-out_bytes_);
    front_sent_ = 0;
    write_timer_.cancel();
    keepalive_timer_.cancel();
    idle_timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);
  }

  tcp::socket socket_;
  HttpServer::Impl& server_;
  asio::steady_timer keepalive_timer_;
  asio::steady_timer idle_timer_;  // between requests: idle timeout; in one: the FIN probe
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<std::string> out_;
  size_t front_sent_ = 0;    // bytes of out_.front() already written
  int64_t out_bytes_ = 0;    // unsent bytes in out_
  asio::steady_timer write_timer_;
  HttpHeaders extra_headers_;  // add_header()'s, for this exchange's response
  std::function<void()> on_disconnect_;
  bool writing_ = false;
  bool watching_ = false;
  bool in_exchange_ = false;  // a request is being answered (until its last byte is written)
  bool answered_ = false;     // respond() or start_stream() was called for it
  int sent_status_ = 0;       // ... and the status it sent
  bool ending_ = false;       // the whole response is queued
  bool streaming_ = false;
  bool wrote_since_tick_ = false;
  bool keep_alive_ = true;
  bool peer_done_ = false;    // the client sent FIN: nothing more to read
  bool probing_ = false;      // the probe after a FIN is queued (see on_peer_shutdown())
  bool closed_ = false;
  std::array<char, 4096> scratch_{};
  size_t lingered_ = 0;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE/ENFILE) or memory: the connection waits in the
      // backlog; try again after a pause instead of failing in a tight loop.
      const auto now = Clock::now();
      if (now - last_fd_warning > std::chrono::seconds(10)) {
        last_fd_warning = now;
        ARBOR_LOG(kWarn) << "accept failed: " << ec.message() << "; retrying every "
                         << kAcceptBackoff.count() << " ms (" << connections
                         << " connections open; raise `ulimit -n` or lower --max-connections)";
      }
      accept_backoff.expires_after(kAcceptBackoff);
      accept_backoff.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (options.max_connections > 0 && connections >= options.max_connections) {
      refuse(std::move(socket));
    } else {
      std::make_shared<Session>(std::move(socket), *this)->start();
    }
    accept();
  });
}

// A connection over --max-connections: a 503 written without blocking (it fits any socket
// buffer), then closed; the client may see a reset instead if it was still sending.
void HttpServer::Impl::refuse(tcp::socket socket) {
  if (refused++ % 1000 == 0) {
    ARBOR_LOG(kWarn) << "connection limit of " << options.max_connections
                     << " reached: answering 503 (" << refused << " refused so far)";
  }
  answer_and_close(socket, 503, "too_many_connections",
                   str_cat("the server has reached its limit of ", options.max_connections,
                           " connections"),
                   "Retry-After: 1\r\n");
  beast::error_code ignored;
  socket.close(ignored);
}

// A small error answer (it fits any socket buffer) written without waiting, counted, and the
// sending side shut: for connections with nothing else to finish.
void HttpServer::Impl::answer_and_close(tcp::socket& socket, int status, std::string_view code,
                                        std::string_view message, std::string_view headers) {
  const std::string body = error_body(status, code, message);
  const std::string bytes =
      str_cat(status_line(status), "Content-Type: application/json\r\nContent-Length: ",
              body.size(), "\r\n", headers, "Connection: close\r\n\r\n", body);
  beast::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  count_status(status);
}

void HttpServer::Impl::wait_signal() {
  signals.async_wait([this](beast::error_code ec, int sig) {
    if (ec) return;
    if (on_signal) on_signal(sig);
    wait_signal();
  });
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(const HttpServerOptions& options,
                                                       HttpHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  beast::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) return invalid_argument("--host '", options.host, "' is not an IP address");
  const tcp::endpoint endpoint(address, options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return io_error("cannot listen on ", options.host, ":", options.port, ": ", ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->accept();
  impl->wait_signal();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

uint16_t HttpServer::port() const { return impl_->port; }
int64_t HttpServer::open_exchanges() const { return impl_->exchanges; }

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (equal_ignore_case(n, name)) return v;
  }
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (equal_ignore_case(n, name)) return true;
  }
  return false;
}
void HttpServer::run() { impl_->ioc.run(); }
void HttpServer::stop() { impl_->ioc.stop(); }
void HttpServer::post(std::function<void()> fn) { asio::post(impl_->ioc, std::move(fn)); }

void HttpServer::run_after(double seconds, std::function<void()> fn) {
  auto timer = std::make_shared<asio::steady_timer>(
      impl_->ioc, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds)));
  timer->async_wait([timer, fn = std::move(fn)](beast::error_code ec) {
    if (!ec) fn();
  });
}

void HttpServer::stop_accepting() {
  impl_->draining = true;
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

void HttpServer::on_signal(std::function<void(int)> fn) { impl_->on_signal = std::move(fn); }

}  // namespace arbor::http
