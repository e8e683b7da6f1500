// `arbor router` in front of two live `arbor serve --replica-listen` replicas (docs/router.md):
// output through the router equals a replica's own; a shared prefix goes where it is cached;
// a replica killed (SIGKILL) or stopped (SIGSTOP) mid-stream loses nothing: the stream
// continues on the other replica with exactly the tokens of a fault-free run, greedy and
// seeded; the stopped replica's request is aborted when it wakes (no leaked KV block); /health
// follows the replicas; a client that hangs up frees the replica's blocks; two routers in front
// of the same replicas neither collide on request ids nor disagree about the caches.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/server_test_util.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

struct Streamed {
  int status = 0;
  std::string text;
  std::string finish_reason;
  int64_t completion_tokens = -1;
  bool done = false;  // [DONE] arrived
};

// A streamed /v1/completions through `s`: the text of every chunk, the finish reason, usage.
Streamed stream_completion(const ServerProcess& s, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const HttpResult r = s.post("/v1/completions", body);
  Streamed out;
  out.status = r.status;
  for (const std::string& p : sse_payloads(r.body)) {
    if (p == "[DONE]") {
      out.done = true;
      continue;
    }
    const json j = json::parse(p, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("usage") && j["usage"].is_object()) {
      out.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
    }
    if (!j.contains("choices")) continue;
    for (const json& c : j["choices"]) {
      out.text += c.value("text", "");
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        out.finish_reason = c["finish_reason"].get<std::string>();
      }
    }
  }
  return out;
}

json long_request(double temperature, int max_tokens = 1800) {
  return {{"prompt", "Once upon a time, there was a little"},
          {"max_tokens", max_tokens},
          {"temperature", temperature},
          {"seed", 4242},
          {"ignore_eos", true}};
}

class RouterE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) start_replica(i);
    start_router();
  }

  std::string socket(int i) const { return "unix:" + (dir_ / ("r" + std::to_string(i) + ".sock")); }

  void start_replica(int i) {
    replicas_[i] = std::make_unique<ServerProcess>(
        std::vector<std::string>{"--replica-listen", socket(i)}, 0, "",
        dir_ / ("replica" + std::to_string(i) + ".log"));
    ASSERT_TRUE(replicas_[i]->ok()) << "replica " << i;
  }

  void start_router() {
    router_ = ServerProcess::router({"--replica", socket(0), "--replica", socket(1),
                                     "--probe-interval", "0.1", "--probe-timeout", "0.5",
                                     "--no-replica-wait", "1"},
                                    dir_ / "router.log");
    ASSERT_TRUE(router_->ok());
  }

  // The replica running a request now (polled for up to 5 s); -1 if none.
  int serving_replica() const {
    for (int tries = 0; tries < 500; ++tries) {
      for (int i = 0; i < 2; ++i) {
        if (replicas_[i] && replicas_[i]->running() &&
            replicas_[i]->metric("arbor_num_requests_running") > 0) {
          return i;
        }
      }
      sleep_ms(10);
    }
    return -1;
  }

  double router_metric(const std::string& name) const { return router_->metric(name); }
  double replica_metric(int replica, const std::string& name) const {
    return router_metric(name + "{replica=\"" + socket(replica) + "\"}");
  }

  test::TempDir dir_{"router_e2e"};
  std::unique_ptr<ServerProcess> replicas_[2];
  std::unique_ptr<ServerProcess> router_;
};

TEST_F(RouterE2e, OutputThroughTheRouterEqualsAReplicasOwn) {
  for (const double temperature : {0.0, 0.9}) {
    SCOPED_TRACE(temperature);
    const json body = long_request(temperature, 64);
    const Streamed direct = stream_completion(*replicas_[0], body);
    const Streamed routed = stream_completion(*router_, body);
    ASSERT_EQ(direct.status, 200);
    ASSERT_EQ(routed.status, 200);
    EXPECT_EQ(routed.text, direct.text);
    EXPECT_EQ(routed.finish_reason, "length");
    EXPECT_EQ(routed.completion_tokens, 64);
    const HttpResult whole = router_->post("/v1/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    EXPECT_EQ(whole.json()["choices"][0]["text"].get<std::string>(), direct.text);
  }
  // n > 1, chat and TGI go through too.
  const HttpResult n2 = router_->post(
      "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 8}, {"n", 2}, {"seed", 1}});
  ASSERT_EQ(n2.status, 200) << n2.body;
  EXPECT_EQ(n2.json()["choices"].size(), 2u);
  const HttpResult chat = router_->post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}});
  EXPECT_EQ(chat.status, 200) << chat.body;
  const HttpResult tgi =
      router_->post("/generate", {{"inputs", "Once"}, {"parameters", {{"max_new_tokens", 4}}}});
  EXPECT_EQ(tgi.status, 200) << tgi.body;
  EXPECT_EQ(router_->get("/health").status, 200);
}

TEST_F(RouterE2e, ASharedPrefixGoesToTheReplicaThatHasItCached) {
  std::string prefix = "The long system prompt of this test:";
  for (int i = 0; i < 40; ++i) prefix += " the cat sat on the mat and looked at the dog.";
  const HttpResult first =
      router_->post("/v1/completions", {{"prompt", prefix}, {"max_tokens", 2}});
  ASSERT_EQ(first.status, 200) << first.body;
  const int holder = replica_metric(0, "arbor_router_replica_routed_total") > 0 ? 0 : 1;
  // The holder's cache events reach the router's index.
  for (int i = 0; i < 100 && replica_metric(holder, "arbor_router_replica_index_blocks") < 10; ++i) {
    sleep_ms(20);
  }
  ASSERT_GE(replica_metric(holder, "arbor_router_replica_index_blocks"), 10);
  for (int i = 0; i < 6; ++i) {
    const HttpResult r = router_->post(
        "/v1/completions",
        {{"prompt", prefix + " Question " + std::to_string(i) + "?"}, {"max_tokens", 2}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(replica_metric(holder, "arbor_router_replica_routed_total"), 7);
  EXPECT_EQ(replica_metric(1 - holder, "arbor_router_replica_routed_total"), 0);
  EXPECT_EQ(router_metric("arbor_router_routed_total{reason=\"prefix\"}"), 6);
  // The prediction is the replica's own count of hit tokens.
  const double predicted = router_metric("arbor_router_predicted_hit_tokens_total");
  const double hit = replicas_[holder]->metric("arbor_prefix_cache_hits_total");
  EXPECT_GT(predicted, 6 * 300);
  EXPECT_EQ(predicted, hit);
}

TEST_F(RouterE2e, ASessionStaysOnOneReplica) {
  // Prompts that share nothing: only the session (OpenAI's `user`, or X-Session-Id) keeps them
  // together.
  const char* prompts[] = {"Once", "The dog", "A cat sat", "Tom ran", "Sue saw", "Lily had"};
  for (const char* p : prompts) {
    const HttpResult r = router_->post(
        "/v1/completions", {{"prompt", p}, {"max_tokens", 2}, {"user", "alice"}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const double on0 = replica_metric(0, "arbor_router_replica_routed_total");
  const double on1 = replica_metric(1, "arbor_router_replica_routed_total");
  EXPECT_TRUE((on0 == 6 && on1 == 0) || (on0 == 0 && on1 == 6)) << on0 << " and " << on1;
  EXPECT_EQ(router_metric("arbor_router_routed_total{reason=\"session\"}"), 5);
  for (const char* p : prompts) {
    const HttpResult r = router_->request(
        "POST", "/v1/completions", json{{"prompt", p}, {"max_tokens", 2}}.dump(),
        "-H 'X-Session-Id: bob'");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_GE(router_metric("arbor_router_routed_total{reason=\"session\"}"), 5 + 4);
}

// The fault-free run, then the same request with the serving replica killed or stopped
// mid-stream: the client's text must be the same, byte for byte.
class RouterFailover : public RouterE2e,
                       public ::testing::WithParamInterface<std::tuple<int, double>> {};

TEST_P(RouterFailover, StreamContinuesOnTheOtherReplicaIdentically) {
  const auto [signal_number, temperature] = GetParam();
  const json body = long_request(temperature);
  const Streamed reference = stream_completion(*router_, body);
  ASSERT_EQ(reference.status, 200);
  ASSERT_EQ(reference.completion_tokens, 1800);
  Streamed got;
  std::thread client([&] { got = stream_completion(*router_, body); });
  const int victim = serving_replica();
  ASSERT_GE(victim, 0);
  sleep_ms(150);
  ASSERT_EQ(::kill(replicas_[victim]->pid(), signal_number), 0);
  client.join();
  EXPECT_EQ(got.status, 200);
  EXPECT_TRUE(got.done);
  EXPECT_EQ(got.finish_reason, "length");
  EXPECT_EQ(got.completion_tokens, 1800);
  EXPECT_EQ(got.text.size(), reference.text.size());
  EXPECT_EQ(got.text, reference.text);
  EXPECT_GE(router_metric("arbor_router_resumes_total"), 1);
  EXPECT_GT(router_metric("arbor_router_resumed_tokens_total"), 0);
  EXPECT_TRUE(replicas_[1 - victim]->wait_no_blocks_used()) << "the survivor leaked KV blocks";
  if (signal_number == SIGSTOP) {
    // Woken, the stopped replica finds its call cancelled: the request is aborted, its blocks
    // freed, and the router takes it back.
    ASSERT_EQ(::kill(replicas_[victim]->pid(), SIGCONT), 0);
    EXPECT_TRUE(replicas_[victim]->wait_no_blocks_used()) << "the stopped replica leaked blocks";
    for (int i = 0; i < 100 && replica_metric(victim, "arbor_router_replica_healthy") != 1; ++i) {
      sleep_ms(20);
    }
    EXPECT_EQ(replica_metric(victim, "arbor_router_replica_healthy"), 1);
  }
  EXPECT_EQ(router_->get("/health").status, 200);
}

INSTANTIATE_TEST_SUITE_P(KillAndStop, RouterFailover,
                         ::testing::Combine(::testing::Values(SIGKILL, SIGSTOP),
                                            ::testing::Values(0.0, 0.9)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == SIGKILL ? "Kill" : "Stop") +
                                  (std::get<1>(info.param) == 0.0 ? "Greedy" : "Seeded");
                         });

// Two routers (as two router pods behind one Service) in front of the same replicas: their
// first requests carry the same local id and go to the same replica at once (an empty cache,
// the tie goes to replica 0), and both answer as the replica itself would; the second router's
// index holds what the first one's requests stored (it comes from the replicas' events), so a
// shared prefix sent first through one router goes to its holder through the other.
TEST_F(RouterE2e, TwoRoutersShareTheReplicasAndTheirCaches) {
  std::unique_ptr<ServerProcess> second = ServerProcess::router(
      {"--replica", socket(0), "--replica", socket(1), "--probe-interval", "0.1",
       "--probe-timeout", "0.5", "--no-replica-wait", "1"},
      dir_ / "router2.log");
  ASSERT_TRUE(second->ok());
  const json body = long_request(0.0, 64);
  Streamed through[2];
  std::thread other([&] { through[1] = stream_completion(*second, body); });
  through[0] = stream_completion(*router_, body);
  other.join();
  const Streamed direct = stream_completion(*replicas_[1], body);
  for (const Streamed& s : through) {
    EXPECT_EQ(s.status, 200);
    EXPECT_EQ(s.text, direct.text);
    EXPECT_EQ(s.completion_tokens, 64);
  }
  std::string prefix = "Another long system prompt:";
  for (int i = 0; i < 40; ++i) prefix += " the dog ran to the park and played with a ball.";
  auto routed = [&](const ServerProcess& router, int i) {
    return router.metric("arbor_router_replica_routed_total{replica=\"" + socket(i) + "\"}");
  };
  auto blocks_on = [&](int i) {
    return second->metric("arbor_router_replica_index_blocks{replica=\"" + socket(i) + "\"}");
  };
  const double routed_before = routed(*router_, 0);
  const double blocks_before[2] = {blocks_on(0), blocks_on(1)};
  const HttpResult first =
      router_->post("/v1/completions", {{"prompt", prefix}, {"max_tokens", 2}});
  ASSERT_EQ(first.status, 200) << first.body;
  const int holder = routed(*router_, 0) > routed_before ? 0 : 1;
  for (int i = 0; i < 100 && blocks_on(holder) < blocks_before[holder] + 10; ++i) sleep_ms(20);
  ASSERT_GE(blocks_on(holder), blocks_before[holder] + 10);
  const double second_before = routed(*second, holder);
  for (int i = 0; i < 4; ++i) {
    const HttpResult r = second->post(
        "/v1/completions",
        {{"prompt", prefix + " Question " + std::to_string(i) + "?"}, {"max_tokens", 2}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(routed(*second, holder), second_before + 4);
  EXPECT_EQ(second->metric("arbor_router_routed_total{reason=\"prefix\"}"), 4);
  EXPECT_EQ(second->terminate(), 0);
}

TEST_F(RouterE2e, HealthFollowsTheReplicas) {
  EXPECT_EQ(router_->get("/health").status, 200);
  for (int i = 0; i < 2; ++i) {
    ::kill(replicas_[i]->pid(), SIGKILL);
    replicas_[i]->wait_exit();
  }
  int status = 0;
  for (int i = 0; i < 100 && (status = router_->get("/health").status) != 503; ++i) sleep_ms(20);
  EXPECT_EQ(status, 503);
  const HttpResult refused = router_->post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}});
  EXPECT_GE(refused.status, 500) << refused.body;
  start_replica(1);  // on the same socket
  // gRPC reconnects with backoff (at most 0.5 s between attempts; a connection attempt that
  // lands while the replica starts can take seconds more).
  for (int i = 0; i < 750 && (status = router_->get("/health").status) != 200; ++i) sleep_ms(20);
  EXPECT_EQ(status, 200);
  const HttpResult ok = router_->post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(RouterE2e, AClientThatHangsUpFreesTheReplicasBlocks) {
  json body = long_request(0.0);
  body["stream"] = true;
  const HttpResult cut = router_->request("POST", "/v1/completions", body.dump(), "--max-time 0.3");
  (void)cut;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(replicas_[i]->wait_no_blocks_used()) << "replica " << i;
  double running = -1;
  for (int i = 0; i < 100 && (running = router_metric("arbor_num_requests_running")) != 0; ++i) {
    sleep_ms(20);
  }
  EXPECT_EQ(running, 0);
}

}  // namespace
}  // namespace arbor::server::testing
