// The client against the in-process null server: exact token counts, ITL counts, chat, HTTP
// errors, refused connections, the deadline and the concurrency cap.
#include "loadgen/client.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "loadgen/null_server.h"
#include "loadgen/plan.h"

namespace arbor::loadgen {
namespace {

class NullServerThread {
 public:
  explicit NullServerThread(NullServerOptions o = {}) {
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    auto s = NullServer::create(o);
    ARBOR_CHECK(s.ok()) << s.status().message();
    server_ = std::move(*s);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~NullServerThread() {
    server_->stop();
    thread_.join();
  }
  ServerUrl url() const {
    auto u = parse_server_url("http://127.0.0.1:" + std::to_string(server_->port()));
    return *u;
  }

 private:
  std::unique_ptr<NullServer> server_;
  std::thread thread_;
};

struct Batch {
  std::vector<std::string> requests;
  std::vector<double> arrivals;
  std::vector<int64_t> prompt_lens;
};

Batch batch(const ServerUrl& url, int n, int max_tokens, bool chat, double rate = kInfiniteRate,
            bool usage = true) {
  SyntheticOptions so;
  so.num_prompts = n;
  so.input_len = 5;
  so.output_len = max_tokens;
  so.token_ids = !chat;
  auto plans = synthetic_plan(so);
  Batch b;
  BodyOptions bo;
  bo.chat = chat;
  bo.include_usage = usage;
  for (const RequestPlan& p : *plans) {
    b.requests.push_back(http_post_text(url, chat ? "/v1/chat/completions" : "/v1/completions",
                                        *request_body(p, bo)));
    b.prompt_lens.push_back(p.prompt_len);
  }
  b.arrivals = arrival_offsets(n, rate, 1.0, 0);
  return b;
}

LoadResult run(const LoadOptions& o, const Batch& b) {
  auto r = run_load(o, b.requests, b.arrivals, b.prompt_lens);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : LoadResult{};
}

TEST(Client, CompletionsAgainstNullServer) {
  NullServerThread server;
  LoadOptions o;
  o.server = server.url();
  const LoadResult r = run(o, batch(o.server, 50, 9, false));
  ASSERT_EQ(r.records.size(), 50u);
  for (const RequestRecord& rec : r.records) {
    ASSERT_EQ(rec.outcome, Outcome::kOk) << rec.error;
    EXPECT_EQ(rec.output_tokens, 9);
    EXPECT_EQ(rec.prompt_tokens, 5);
    EXPECT_EQ(rec.itl_s.size(), 8u);  // one gap between each pair of the 9 chunks
    EXPECT_GT(rec.ttft_s, 0);
    EXPECT_GE(rec.e2e_s, rec.ttft_s);
  }
  EXPECT_EQ(r.send_s.size(), 50u);
  EXPECT_GT(r.duration_s, 0);
  EXPECT_LE(r.connections_opened, 50);
  const ServingMetrics m = compute_metrics(r.records, r.duration_s, {});
  EXPECT_EQ(m.total_output_tokens, 450);
}

TEST(Client, WithoutUsageCountsChunks) {
  NullServerThread server;
  LoadOptions o;
  o.server = server.url();
  const LoadResult r = run(o, batch(o.server, 5, 6, false, kInfiniteRate, /*usage=*/false));
  for (const RequestRecord& rec : r.records) {
    ASSERT_EQ(rec.outcome, Outcome::kOk) << rec.error;
    EXPECT_EQ(rec.output_tokens, 6);
    EXPECT_EQ(rec.prompt_tokens, 5);  // the planned length
  }
}

TEST(Client, ChatSkipsTheRoleChunk) {
  NullServerThread server;
  LoadOptions o;
  o.server = server.url();
  o.chat = true;
  const LoadResult r = run(o, batch(o.server, 10, 4, true, kInfiniteRate, /*usage=*/false));
  for (const RequestRecord& rec : r.records) {
    ASSERT_EQ(rec.outcome, Outcome::kOk) << rec.error;
    EXPECT_EQ(rec.output_tokens, 4);  // 4 content chunks; the role chunk is not a token
    EXPECT_EQ(rec.itl_s.size(), 3u);
  }
}

TEST(Client, PacedStreamsTimeTheGaps) {
  NullServerOptions so;
  so.tokens_per_second = 100;  // 10 ms apart
  so.ttft_ms = 30;
  NullServerThread server(so);
  LoadOptions o;
  o.server = server.url();
  o.keep_alive = false;
  const LoadResult r = run(o, batch(o.server, 4, 5, false));
  for (const RequestRecord& rec : r.records) {
    ASSERT_EQ(rec.outcome, Outcome::kOk) << rec.error;
    EXPECT_GE(rec.ttft_s, 0.029);
    ASSERT_EQ(rec.itl_s.size(), 4u);
    double last = rec.ttft_s;  // the last chunk's time: TTFT plus every gap
    for (double g : rec.itl_s) last += g;
    EXPECT_GE(last, 0.069);  // chunk 4 is due 70 ms after the request arrived
    EXPECT_LE(last, rec.e2e_s + 1e-9);
    EXPECT_GE(rec.e2e_s, 0.069);
  }
  EXPECT_EQ(r.connections_opened, 4);
}

TEST(Client, HttpErrorsAreCountedWithTheirBody) {
  NullServerThread server;
  LoadOptions o;
  o.server = server.url();
  const std::vector<std::string> reqs = {
      http_post_text(o.server, "/v1/completions", "{\"max_tokens\": 0, \"stream\": true}"),
      http_post_text(o.server, "/v1/nothing", "{}")};
  auto r = run_load(o, reqs, {0, 0}, {-1, -1});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->records[0].outcome, Outcome::kFailed);
  EXPECT_NE(r->records[0].error.find("HTTP 400"), std::string::npos) << r->records[0].error;
  EXPECT_NE(r->records[0].error.find("max_tokens"), std::string::npos) << r->records[0].error;
  EXPECT_NE(r->records[1].error.find("HTTP 404"), std::string::npos) << r->records[1].error;
}

TEST(Client, ConnectionRefused) {
  ServerUrl url;
  {
    NullServerThread server;  // a port that was free a moment ago and is closed now
    url = server.url();
  }
  LoadOptions o;
  o.server = url;
  const LoadResult r = run(o, batch(url, 3, 2, false));
  for (const RequestRecord& rec : r.records) {
    EXPECT_EQ(rec.outcome, Outcome::kFailed);
    EXPECT_NE(rec.error.find("connect to 127.0.0.1:"), std::string::npos) << rec.error;
  }
}

TEST(Client, DeadlineAbortsInFlightAndSkipsTheRest) {
  NullServerOptions so;
  so.tokens_per_second = 20;  // 50 tokens: 2.5 s per request
  NullServerThread server(so);
  LoadOptions o;
  o.server = server.url();
  o.max_seconds = 0.3;
  o.max_concurrency = 2;
  const auto start = std::chrono::steady_clock::now();
  const LoadResult r = run(o, batch(o.server, 5, 50, false));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 2.0);
  EXPECT_TRUE(r.deadline_hit);
  EXPECT_GE(r.duration_s, 0.3);
  EXPECT_LT(r.duration_s, 1.5);
  const ServingMetrics m = compute_metrics(r.records, r.duration_s, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.aborted, 2);   // the two in flight
  EXPECT_EQ(m.not_sent, 3);  // waiting for a slot
  EXPECT_EQ(r.max_in_flight, 2);
}

TEST(Client, ConcurrencyCapAndKeepAlive) {
  NullServerOptions so;
  so.tokens_per_second = 1000;
  NullServerThread server(so);
  LoadOptions o;
  o.server = server.url();
  o.max_concurrency = 3;
  const LoadResult r = run(o, batch(o.server, 30, 4, false));
  EXPECT_EQ(r.max_in_flight, 3);
  EXPECT_LE(r.connections_opened, 3);  // later requests reuse the keep-alive connections
  EXPECT_EQ(compute_metrics(r.records, r.duration_s, {}).completed, 30);
}

TEST(Client, PoissonArrivalsAreIssuedOnTime) {
  NullServerThread server;
  LoadOptions o;
  o.server = server.url();
  const Batch b = batch(o.server, 100, 2, false, /*rate=*/200.0);
  const LoadResult r = run(o, b);
  ASSERT_EQ(r.issue_lag_s.size(), 100u);
  ASSERT_EQ(r.send_s.size(), 100u);
  // Sends follow the schedule: the last arrival is ~0.5 s in, and none is early.
  for (size_t i = 0; i < r.send_s.size(); ++i) EXPECT_GE(r.send_s[i] + 1e-9, b.arrivals[i]);
  EXPECT_NEAR(r.send_s.back(), b.arrivals.back(), 0.5);
}

}  // namespace
}  // namespace arbor::loadgen
