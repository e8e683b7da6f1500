// Beast/Asio implementation of the load generator's client (the only file that includes them).
#include "loadgen/client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <limits>
#include <memory>
#include <optional>

#include "loadgen/openai_chunk.h"
#include "loadgen/sse_parser.h"

namespace arbor::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadSize = 16384;
constexpr size_t kMaxErrorText = 300;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string clip(std::string_view s) {
  std::string out(s.substr(0, kMaxErrorText));
  if (s.size() > kMaxErrorText) out += "...";
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

std::string host_header(const ServerUrl& s) {
  const std::string host =
      s.host.find(':') != std::string::npos && s.host[0] != '[' ? "[" + s.host + "]" : s.host;
  return host + ":" + std::to_string(s.port);
}

using ChunkCallback = std::function<size_t(uint64_t, beast::string_view, beast::error_code&)>;

// One request in flight. Lives (at a stable address) until the run ends, so handlers that
// complete after it ended (cancelled reads) can still look at `ended`.
struct Exchange {
  size_t index = 0;
  std::unique_ptr<tcp::socket> sock;
  bool reused = false;     // on a pooled keep-alive connection
  bool any_bytes = false;  // a byte of the response arrived
  bool ended = false;
  Clock::time_point send;
  Clock::time_point now;  // when the bytes being parsed arrived
  std::unique_ptr<char[]> buf;
  std::string pending;  // bytes the HTTP parser has not consumed yet
  std::optional<http::response_parser<http::string_body>> parser;
  ChunkCallback on_chunk;  // Beast keeps a reference to it
  SseParser::EventFn on_event;
  SseParser sse;
  size_t plain_body_fed = 0;  // SSE without chunked encoding: body bytes already fed
  std::string error_body;     // a non-200 chunked body
  bool got_first = false;
  Clock::time_point last_token;
  int64_t chunks = 0;
  int64_t usage_prompt = -1;
  int64_t usage_completion = -1;
  std::string error;  // the first error chunk or malformed chunk
};

class LoadRun {
 public:
  LoadRun(const LoadOptions& o, const std::vector<std::string>& requests,
          const std::vector<double>& arrivals, const std::vector<int64_t>& prompt_lens)
      : o_(o),
        requests_(requests),
        arrivals_(arrivals),
        prompt_lens_(prompt_lens),
        endpoint_(asio::ip::make_address(o.server.address), o.server.port),
        arrival_timer_(io_),
        deadline_timer_(io_),
        ex_(requests.size()) {
    result_.records.resize(requests.size());
  }

  LoadResult run() {
    start_ = Clock::now();
    if (o_.max_seconds > 0) {
      deadline_timer_.expires_at(start_ + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(o_.max_seconds)));
      deadline_timer_.async_wait([this](const beast::error_code& ec) {
        if (!ec) on_deadline();
      });
    }
    schedule();
    io_.run();
    return std::move(result_);
  }

 private:
  size_t size() const { return requests_.size(); }
  Clock::time_point due(size_t i) const {
    return start_ +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals_[i]));
  }

  void schedule() {
    while (next_ < size() && !stopping_) {
      const Clock::time_point now = Clock::now();
      if (due(next_) > now) break;
      result_.issue_lag_s.push_back(seconds(now - due(next_)));
      issue(next_++);
    }
    if (next_ < size() && !stopping_) {
      arrival_timer_.expires_at(due(next_));
      arrival_timer_.async_wait([this](const beast::error_code& ec) {
        if (!ec) schedule();
      });
    }
  }

  void issue(size_t i) {
    if (o_.max_concurrency > 0 && in_flight_ >= o_.max_concurrency) {
      waiting_.push_back(i);
    } else {
      start(i);
    }
  }

  void start(size_t i) {
    ex_[i] = std::make_unique<Exchange>();
    Exchange& x = *ex_[i];
    x.index = i;
    x.send = Clock::now();
    result_.send_s.push_back(seconds(x.send - start_));
    ++in_flight_;
    result_.max_in_flight = std::max(result_.max_in_flight, in_flight_);
    x.buf = std::make_unique<char[]>(kReadSize);
    x.on_event = [this, &x](std::string_view data) { on_event(x, data); };
    x.on_chunk = [this, &x](uint64_t, beast::string_view body, beast::error_code&) -> size_t {
      if (x.parser->get().result_int() == 200) {
        x.sse.feed(std::string_view(body.data(), body.size()), x.on_event);
      } else if (x.error_body.size() < kMaxErrorText) {
        x.error_body.append(body.data(), body.size());
      }
      return body.size();
    };
    if (o_.keep_alive && !idle_.empty()) {
      x.sock = std::move(idle_.back());
      idle_.pop_back();
      x.reused = true;
      write(x);
    } else {
      connect(x);
    }
  }

  void connect(Exchange& x) {
    x.sock = std::make_unique<tcp::socket>(io_);
    ++result_.connections_opened;
    x.sock->async_connect(endpoint_, [this, &x](const beast::error_code& ec) {
      if (x.ended) return;
      if (ec) {
        return fail(
            x, str_cat("connect to ", o_.server.address, ":", o_.server.port, ": ", ec.message()));
      }
      beast::error_code ignored;
      x.sock->set_option(tcp::no_delay(true), ignored);
      write(x);
    });
  }

  void write(Exchange& x) {
    x.parser.emplace();
    x.parser->eager(true);
    x.parser->body_limit(std::numeric_limits<uint64_t>::max());
    x.parser->on_chunk_body(x.on_chunk);
    asio::async_write(*x.sock, asio::buffer(requests_[x.index]),
                      [this, &x](const beast::error_code& ec, size_t) {
                        if (x.ended) return;
                        if (ec) return io_error(x, "write", ec);
                        read(x);
                      });
  }

  void read(Exchange& x) {
    x.sock->async_read_some(asio::buffer(x.buf.get(), kReadSize),
                            [this, &x](const beast::error_code& ec, size_t n) {
                              const Clock::time_point t = Clock::now();
                              if (x.ended) return;
                              x.now = t;
                              if (ec == asio::error::eof) return on_eof(x);
                              if (ec) return io_error(x, "read", ec);
                              x.any_bytes = true;
                              on_bytes(x, n);
                            });
  }

  void on_bytes(Exchange& x, size_t n) {
    x.pending.append(x.buf.get(), n);
    auto& p = *x.parser;
    size_t off = 0;
    while (off < x.pending.size() && !p.is_done()) {
      beast::error_code ec;
      const size_t used = p.put(asio::buffer(x.pending.data() + off, x.pending.size() - off), ec);
      off += used;
      if (ec == http::error::need_more) break;
      if (ec) return fail(x, "bad HTTP response: " + ec.message());
      if (used == 0) break;
    }
    const bool leftover = off < x.pending.size();
    x.pending.erase(0, off);
    if (p.is_header_done() && !p.chunked() && p.get().result_int() == 200) feed_plain_body(x);
    if (p.is_done()) return finish(x, !leftover);
    read(x);
  }

  // An event stream sent without chunked encoding (Content-Length or until close).
  void feed_plain_body(Exchange& x) {
    const std::string& body = x.parser->get().body();
    x.sse.feed(std::string_view(body).substr(x.plain_body_fed), x.on_event);
    x.plain_body_fed = body.size();
  }

  void on_event(Exchange& x, std::string_view data) {
    const ChunkInfo c = classify_chunk(data, o_.chat);
    if (c.malformed || c.error) {
      if (x.error.empty()) x.error = (c.error ? "error chunk: " : "malformed chunk: ") + clip(data);
      return;
    }
    if (c.done) return;
    if (c.prompt_tokens >= 0) x.usage_prompt = c.prompt_tokens;
    if (c.completion_tokens >= 0) x.usage_completion = c.completion_tokens;
    if (!c.has_token) return;
    RequestRecord& r = result_.records[x.index];
    if (!x.got_first) {
      x.got_first = true;
      r.ttft_s = seconds(x.now - x.send);
    } else {
      r.itl_s.push_back(seconds(x.now - x.last_token));
    }
    x.last_token = x.now;
    ++x.chunks;
  }

  void on_eof(Exchange& x) {
    if (x.reused && !x.any_bytes && !stopping_) return retry(x);
    if (x.parser && x.parser->is_header_done() && x.parser->need_eof()) {
      beast::error_code ec;
      x.parser->put_eof(ec);
      if (!ec && x.parser->is_done()) {
        if (!x.parser->chunked() && x.parser->get().result_int() == 200) feed_plain_body(x);
        return finish(x, false);
      }
    }
    fail(x, "the server closed the connection before the response ended");
  }

  void io_error(Exchange& x, const char* what, const beast::error_code& ec) {
    if (x.reused && !x.any_bytes && !stopping_) return retry(x);
    fail(x, str_cat(what, ": ", ec.message()));
  }

  // A pooled connection the server had closed: send again on a new one (the clock keeps
  // running from the first send).
  void retry(Exchange& x) {
    beast::error_code ignored;
    x.sock->close(ignored);
    x.reused = false;
    x.pending.clear();
    connect(x);
  }

  void finish(Exchange& x, bool clean) {
    auto& p = *x.parser;
    RequestRecord& r = result_.records[x.index];
    r.e2e_s = seconds(x.now - x.send);
    const int status = p.get().result_int();
    if (status != 200) {
      return fail(
          x, str_cat("HTTP ", status, ": ", clip(p.chunked() ? x.error_body : p.get().body())));
    }
    if (!x.error.empty()) return fail(x, x.error);
    if (!x.got_first) return fail(x, "the stream ended without an output chunk");
    r.output_tokens = x.usage_completion >= 0 ? x.usage_completion : x.chunks;
    r.prompt_tokens =
        x.usage_prompt >= 0 ? x.usage_prompt : std::max<int64_t>(prompt_lens_[x.index], 0);
    end(x, Outcome::kOk, o_.keep_alive && clean && p.get().keep_alive() && !stopping_);
  }

  void fail(Exchange& x, std::string error) {
    result_.records[x.index].error = std::move(error);
    end(x, Outcome::kFailed, false);
  }

  void end(Exchange& x, Outcome outcome, bool reuse) {
    x.ended = true;
    result_.records[x.index].outcome = outcome;
    if (reuse) {
      idle_.push_back(std::move(x.sock));
    } else if (x.sock) {
      beast::error_code ignored;
      x.sock->close(ignored);  // cancels a pending operation; its handler sees `ended`
    }
    x.parser.reset();
    x.buf.reset();
    x.pending = std::string();
    --in_flight_;
    ++ended_;
    if (o_.on_progress) o_.on_progress(ended_, static_cast<int64_t>(size()));
    while (!stopping_ && !waiting_.empty() &&
           (o_.max_concurrency <= 0 || in_flight_ < o_.max_concurrency)) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      start(i);
    }
    maybe_done();
  }

  void on_deadline() {
    stopping_ = true;
    result_.deadline_hit = true;
    result_.duration_s = seconds(Clock::now() - start_);
    arrival_timer_.cancel();
    waiting_.clear();  // never sent: their records stay kNotSent
    for (auto& x : ex_) {
      if (x && !x->ended) {
        result_.records[x->index].error = "aborted at the --max-seconds deadline";
        end(*x, Outcome::kAborted, false);
      }
    }
    maybe_done();
  }

  void maybe_done() {
    if (in_flight_ > 0 || done_) return;
    if (!stopping_ && (next_ < size() || !waiting_.empty())) return;
    done_ = true;
    if (!stopping_) result_.duration_s = seconds(Clock::now() - start_);
    deadline_timer_.cancel();
    arrival_timer_.cancel();
    for (auto& s : idle_) {
      beast::error_code ignored;
      s->close(ignored);
    }
    idle_.clear();
  }

  const LoadOptions& o_;
  const std::vector<std::string>& requests_;
  const std::vector<double>& arrivals_;
  const std::vector<int64_t>& prompt_lens_;
  asio::io_context io_{1};
  tcp::endpoint endpoint_;
  asio::steady_timer arrival_timer_;
  asio::steady_timer deadline_timer_;
  Clock::time_point start_;
  std::vector<std::unique_ptr<Exchange>> ex_;       // [requests]; null until started
  std::deque<size_t> waiting_;                      // issued, waiting for a concurrency slot
  std::vector<std::unique_ptr<tcp::socket>> idle_;  // keep-alive pool
  size_t next_ = 0;                                 // next request to issue
  int32_t in_flight_ = 0;
  int64_t ended_ = 0;
  bool stopping_ = false;
  bool done_ = false;
  LoadResult result_;
};

}  // namespace

std::string http_post_text(const ServerUrl& server, const std::string& path,
                           const std::string& body) {
  return str_cat("POST ", server.base_path, path, " HTTP/1.1\r\nHost: ", host_header(server),
                 "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                 "Connection: keep-alive\r\nContent-Length: ",
                 body.size(), "\r\n\r\n", body);
}

Result<LoadResult> run_load(const LoadOptions& options, const std::vector<std::string>& requests,
                            const std::vector<double>& arrivals_s,
                            const std::vector<int64_t>& prompt_lens) {
  if (requests.empty()) return invalid_argument("no requests to run");
  if (arrivals_s.size() != requests.size() || prompt_lens.size() != requests.size()) {
    return invalid_argument("run_load: ", requests.size(), " requests but ", arrivals_s.size(),
                            " arrival times and ", prompt_lens.size(), " prompt lengths");
  }
  for (size_t i = 1; i < arrivals_s.size(); ++i) {
    if (arrivals_s[i] < arrivals_s[i - 1]) return invalid_argument("arrival times must ascend");
  }
  beast::error_code ec;
  asio::ip::make_address(options.server.address, ec);
  if (ec) return invalid_argument("bad server address '", options.server.address, "'");
  LoadRun run(options, requests, arrivals_s, prompt_lens);
  return run.run();
}

Result<HttpReply> http_request(const ServerUrl& server, const std::string& method,
                               const std::string& path, const std::string& body, double timeout_s) {
  beast::error_code ec;
  const asio::ip::address addr = asio::ip::make_address(server.address, ec);
  if (ec) return invalid_argument("bad server address '", server.address, "'");
  asio::io_context io;
  tcp::socket sock(io);
  beast::flat_buffer buf;
  http::request<http::string_body> req{http::string_to_verb(method), server.base_path + path, 11};
  req.set(http::field::host, host_header(server));
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::response<http::string_body> res;
  std::string error;
  bool done = false;
  const std::string where =
      str_cat(method, " http://", host_header(server), server.base_path, path);
  sock.async_connect(tcp::endpoint(addr, server.port), [&](const beast::error_code& e1) {
    if (e1) {
      error = "connect: " + e1.message();
      return;
    }
    http::async_write(sock, req, [&](const beast::error_code& e2, size_t) {
      if (e2) {
        error = "write: " + e2.message();
        return;
      }
      http::async_read(sock, buf, res, [&](const beast::error_code& e3, size_t) {
        if (e3) error = "read: " + e3.message();
        done = !e3;
      });
    });
  });
  io.run_for(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s)));
  if (!error.empty()) return io_error(where, ": ", error);
  if (!done) return io_error(where, ": no answer within ", timeout_s, " s");
  return HttpReply{static_cast<int>(res.result_int()), res.body()};
}

}  // namespace arbor::loadgen
