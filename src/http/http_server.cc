// Beast/Asio implementation of HttpServer (the only file that includes them).
#include "http/http_server.h"

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>

#include "base/log.h"

namespace arbor::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Bytes a connection may buffer ahead (pipelined requests) while a request is being handled.
constexpr size_t kMaxReadAhead = 1u << 20;
constexpr size_t kHeaderLimit = 16u << 10;
constexpr size_t kLingerBytes = 64u << 20;

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
  uint16_t port = 0;

  void accept();
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
        idle_timer_(server.ioc) {}

  void start() { do_read(); }

  void respond(HttpResponse r) override {
    if (closed_ || !in_exchange_) return;
    ending_ = true;
    enqueue(str_cat(status_line(r.status), "Content-Type: ", r.content_type,
                    "\r\nContent-Length: ", r.body.size(), "\r\nConnection: ",
                    keep_alive_ ? "keep-alive" : "close", "\r\n\r\n", r.body));
  }

  void start_stream(int status, const std::string& content_type) override {
    if (closed_ || !in_exchange_) return;
    streaming_ = true;
    enqueue(str_cat(status_line(status), "Content-Type: ", content_type,
                    "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: ",
                    keep_alive_ ? "keep-alive" : "close", "\r\n\r\n"));
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

  void set_on_disconnect(std::function<void()> fn) override { on_disconnect_ = std::move(fn); }
  bool disconnected() const override { return closed_; }

 private:
  // Closes the connection if no request arrives in time (slow or forgotten clients).
  void arm_idle() {
    if (server_.options.idle_timeout_s <= 0) return;
    idle_timer_.expires_after(std::chrono::milliseconds(
        static_cast<int64_t>(server_.options.idle_timeout_s * 1000)));
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && !self->in_exchange_ && !self->closed_) self->close();
    });
  }

  void do_read() {
    arm_idle();
    parser_.emplace();
    parser_->body_limit(server_.options.body_limit);
    parser_->header_limit(kHeaderLimit);
    bhttp::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->on_read(ec);
                     });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec == bhttp::error::body_limit) {
      reject(413, server_.error_body(413, "body_too_large",
                                     str_cat("request body exceeds the limit of ",
                                             server_.options.body_limit, " bytes")));
      return;
    }
    if (ec == bhttp::error::header_limit || ec == bhttp::error::bad_target ||
        ec == bhttp::error::bad_method || ec == bhttp::error::bad_version) {
      reject(400, server_.error_body(400, "malformed_request",
                                     str_cat("malformed HTTP request: ", ec.message())));
      return;
    }
    if (ec) {
      close();
      return;
    }
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.body = std::move(req.body());
    keep_alive_ = req.keep_alive();
    in_exchange_ = true;
    watch();
    try {
      server_.handler(std::move(r), shared_from_this());
    } catch (const std::exception& e) {
      ARBOR_LOG(kError) << "handler threw: " << e.what();
      respond({500, "application/json",
               server_.error_body(500, "internal_error", str_cat("handler failed: ", e.what()))});
    }
  }

  // Answers a request that could not be parsed and closes the connection afterwards.
  void reject(int status, std::string body) {
    in_exchange_ = true;
    keep_alive_ = false;
    respond({status, "application/json", std::move(body)});
  }

  // A read that only notices a hang-up (or buffers pipelined bytes) while a request runs.
  void watch() {
    if (watching_ || buffer_.size() >= kMaxReadAhead) return;
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

  void enqueue(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    asio::async_write(socket_, asio::buffer(out_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->on_write(ec);
                      });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      disconnect();
      return;
    }
    out_.pop_front();
    if (!out_.empty()) {
      do_write();
    } else if (ending_) {
      end_exchange();
    }
  }

  // The response of a non-keep-alive exchange is out; only waiting to close.
  bool lingering() const { return !in_exchange_ && !keep_alive_; }

  void end_exchange() {
    in_exchange_ = false;
    ending_ = false;
    streaming_ = false;
    on_disconnect_ = nullptr;
    keepalive_timer_.cancel();
    if (!keep_alive_) {
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
    close();
    if (fn && in_exchange_) fn();
  }

  void close() {
    closed_ = true;
    out_.clear();
    keepalive_timer_.cancel();
    idle_timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);
  }

  tcp::socket socket_;
  HttpServer::Impl& server_;
  asio::steady_timer keepalive_timer_;
  asio::steady_timer idle_timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_disconnect_;
  bool writing_ = false;
  bool watching_ = false;
  bool in_exchange_ = false;  // a request is being answered
  bool ending_ = false;       // the whole response is queued
  bool streaming_ = false;
  bool wrote_since_tick_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  std::array<char, 4096> scratch_{};
  size_t lingered_ = 0;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), *this)->start();
    }
    accept();
  });
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
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

void HttpServer::on_signal(std::function<void(int)> fn) { impl_->on_signal = std::move(fn); }

}  // namespace arbor::http
