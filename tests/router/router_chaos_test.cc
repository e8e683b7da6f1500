// The chaos suite (docs/router.md, "Chaos suite"): `arbor router` + 2 replicas, 32 seeded
// streams (greedy and sampled) from clients that reconnect with Last-Event-ID whenever their
// connection drops, while faults are injected on a seeded schedule:
//
//   * every router <-> replica link runs through chaos_proxy.py: each chunk delayed, and
//     connections reset at random (the network's delay and loss, on loopback)
//   * SIGKILL of a replica (restarted a second later on the same socket)
//   * SIGSTOP of a replica for 1.5 s
//   * SIGKILL of the router (restarted on the same port; every client reconnects)
//
// The property checker: every stream ends with its final event; its text equals the fault-free
// run's (no token lost, duplicated or different); every replica ends with 0 KV blocks used and
// nothing running; no child is left a zombie; then /health goes 200 -> 503 (both replicas
// down) -> 200 (one back). The counts (faults, resumes, reconnects, tokens compared) are
// printed. Bounded: about a minute on a 2-core machine.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/server_test_util.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

constexpr int kStreams = 32;
constexpr uint64_t kScheduleSeed = 20261129;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A chaos_proxy.py child: TCP 127.0.0.1:port() -> the replica's Unix socket.
class Proxy {
 public:
  Proxy(const std::string& dir, const std::string& socket_path, int index) {
    const std::string port_file = dir + "/proxy" + std::to_string(index) + ".port";
    const std::string script = std::string(ARBOR_SOURCE_DIR) + "/tests/router/chaos_proxy.py";
    const std::string log = dir + "/proxy" + std::to_string(index) + ".log";
    pid_ = fork();
    if (pid_ == 0) {
      std::freopen(log.c_str(), "w", stderr);
      execl("/usr/bin/python3", "python3", script.c_str(), port_file.c_str(), socket_path.c_str(),
            "0.3", "1.5", std::to_string(kScheduleSeed + index).c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      port_ = std::atoi(test::read_file(port_file).c_str());
      if (port_ == 0) sleep_ms(25);
    }
    log_ = log;
  }
  ~Proxy() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  int resets() const {
    const std::string s = test::read_file(log_);
    int n = 0;
    for (size_t at = s.find("reset"); at != std::string::npos; at = s.find("reset", at + 1)) ++n;
    return n;
  }

 private:
  int pid_ = -1;
  int port_ = 0;
  std::string log_;
};

struct StreamResult {
  std::string text;
  bool done = false;
  std::string error;  // an error event's payload, if one came
  std::string finish_reason;
  int reconnects = 0;
};

// One client: streams `body`, and whenever the connection drops before [DONE], sends the same
// request again with Last-Event-ID (the router may be down for a while: retried for up to 60 s).
StreamResult run_client(const ServerProcess* const* router, const json& body, int index) {
  StreamResult out;
  std::string last_id;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!out.done && std::chrono::steady_clock::now() < give_up) {
    std::string extra = "-H 'X-Request-Id: chaos-" + std::to_string(index) + "'";
    if (!last_id.empty()) extra += " -H 'Last-Event-ID: " + last_id + "'";
    const HttpResult r = (*router)->request("POST", "/v1/completions", body.dump(), extra);
    // Whole events only (a cut one is sent again after its predecessor's id).
    size_t start = 0;
    while (true) {
      const size_t end = r.body.find("\n\n", start);
      if (end == std::string::npos) break;
      const std::string event = r.body.substr(start, end - start);
      start = end + 2;
      std::string id, data;
      size_t line_start = 0;
      while (line_start < event.size()) {
        size_t line_end = event.find('\n', line_start);
        if (line_end == std::string::npos) line_end = event.size();
        const std::string line = event.substr(line_start, line_end - line_start);
        line_start = line_end + 1;
        if (line.starts_with("id: ")) id = line.substr(4);
        if (line.starts_with("data: ")) data = line.substr(6);
      }
      if (data == "[DONE]") {
        out.done = true;
        break;
      }
      const json j = json::parse(data, nullptr, false);
      if (!j.is_discarded() && j.contains("error")) out.error = data;
      if (!j.is_discarded() && j.contains("choices")) {
        for (const json& c : j["choices"]) {
          out.text += c.value("text", "");
          if (c["finish_reason"].is_string()) out.finish_reason = c["finish_reason"];
        }
      }
      if (!id.empty()) last_id = id;
    }
    if (!out.done) {
      ++out.reconnects;
      sleep_ms(50);
    }
  }
  return out;
}

TEST(RouterChaos, FaultsLoseNothing) {
  test::TempDir dir("router_chaos");
  auto sock = [&](int i) { return dir / ("r" + std::to_string(i) + ".sock"); };
  std::unique_ptr<ServerProcess> replicas[2];
  auto start_replica = [&](int i) {
    replicas[i] = std::make_unique<ServerProcess>(
        std::vector<std::string>{"--replica-listen", "unix:" + sock(i), "--spec", "ngram"}, 0, "",
        dir / ("replica" + std::to_string(i) + ".log"));
    ASSERT_TRUE(replicas[i]->ok()) << "replica " << i;
  };
  for (int i = 0; i < 2; ++i) start_replica(i);
  Proxy proxies[2] = {Proxy(dir.path(), sock(0), 0), Proxy(dir.path(), sock(1), 1)};
  for (const Proxy& p : proxies) {
    ASSERT_GT(p.port(), 0) << "tests/router/chaos_proxy.py did not start (it needs "
                              "/usr/bin/python3, installed by scripts/install_deps.sh --tests)";
  }
  std::vector<std::string> router_args = {
      "--replica", "127.0.0.1:" + std::to_string(proxies[0].port()),
      "--replica", "127.0.0.1:" + std::to_string(proxies[1].port()),
      "--probe-interval", "0.1", "--probe-timeout", "0.5"};
  std::unique_ptr<ServerProcess> router = ServerProcess::router(router_args, dir / "router.log");
  ASSERT_TRUE(router->ok());
  router_args.insert(router_args.end(), {"--port", std::to_string(router->port())});

  // The fault-free runs, straight from a replica (output is a function of request and seed).
  std::vector<json> bodies;
  std::vector<std::string> reference;
  const char* openings[] = {"Once upon a time", "The little dog", "One day, Lily", "Tom and Sue"};
  for (int i = 0; i < kStreams; ++i) {
    json b = {{"prompt", std::string(openings[i % 4]) + " " + std::to_string(i)},
              {"max_tokens", 400 + 16 * i},
              {"temperature", i % 2 == 0 ? 0.0 : 0.9},
              {"seed", 1000 + i},
              {"ignore_eos", true},
              {"stream", true}};
    json whole = b;
    whole["stream"] = false;
    const HttpResult r = replicas[i % 2]->post("/v1/completions", whole);
    ASSERT_EQ(r.status, 200) << r.body;
    reference.push_back(r.json()["choices"][0]["text"].get<std::string>());
    bodies.push_back(b);
  }

  // The chaos run.
  const ServerProcess* current = router.get();
  const ServerProcess* const* router_ref = &current;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] { results[i] = run_client(router_ref, bodies[i], i); });
  }
  std::mt19937_64 rng(kScheduleSeed);
  auto jitter = [&](int lo, int hi) { return static_cast<int>(lo + rng() % (hi - lo + 1)); };
  int faults = 0;
  std::printf("chaos schedule seed %llu\n", static_cast<unsigned long long>(kScheduleSeed));
  sleep_ms(jitter(400, 800));
  std::printf("  t+: SIGKILL the router (restarted on port %d)\n", router->port());
  const double resumes_before_kill = router->metric("arbor_router_resumes_total");
  kill(router->pid(), SIGKILL);
  router->wait_exit();
  ++faults;
  sleep_ms(300);
  std::unique_ptr<ServerProcess> router2 = ServerProcess::router(router_args, dir / "router2.log");
  ASSERT_TRUE(router2->ok());
  current = router2.get();
  sleep_ms(jitter(300, 700));
  const int killed = static_cast<int>(rng() % 2);
  std::printf("  t+: SIGKILL replica %d\n", killed);
  kill(replicas[killed]->pid(), SIGKILL);
  replicas[killed]->wait_exit();
  ++faults;
  sleep_ms(1000);
  start_replica(killed);
  sleep_ms(jitter(300, 700));
  const int stopped = static_cast<int>(rng() % 2);
  std::printf("  t+: SIGSTOP replica %d for 1.5 s\n", stopped);
  kill(replicas[stopped]->pid(), SIGSTOP);
  ++faults;
  sleep_ms(1500);
  kill(replicas[stopped]->pid(), SIGCONT);
  for (std::thread& t : clients) t.join();

  // The property checker.
  int64_t compared_bytes = 0;
  int reconnects = 0;
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(results[i].done) << "stream " << i << " never ended";
    EXPECT_EQ(results[i].error, "") << "stream " << i << " ended with an error event";
    EXPECT_EQ(results[i].finish_reason, "length");
    EXPECT_EQ(results[i].text, reference[i]) << "stream " << i << " differs from the fault-free run";
    compared_bytes += static_cast<int64_t>(reference[i].size());
    reconnects += results[i].reconnects;
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(replicas[i]->wait_no_blocks_used(20.0)) << "replica " << i << " leaked KV blocks";
  }
  const double resumes = resumes_before_kill + router2->metric("arbor_router_resumes_total");
  const int resets = proxies[0].resets() + proxies[1].resets();
  std::printf("chaos: %d faults injected (+%d connection resets by the proxies), %d client "
              "reconnects, %.0f streams resumed on another replica by the routers, %d streams and %lld "
              "bytes of text compared with the fault-free runs\n",
              faults, resets, reconnects, resumes, kStreams, static_cast<long long>(compared_bytes));
  EXPECT_GT(reconnects, 0) << "the router's kill reached no client: the schedule proves little";

  // /health: 200, then 503 with both replicas down, then 200 with one back.
  EXPECT_EQ(router2->get("/health").status, 200);
  for (int i = 0; i < 2; ++i) {
    kill(replicas[i]->pid(), SIGKILL);
    replicas[i]->wait_exit();
  }
  int status = 0;
  for (int i = 0; i < 100 && (status = router2->get("/health").status) != 503; ++i) sleep_ms(20);
  EXPECT_EQ(status, 503);
  start_replica(0);
  for (int i = 0; i < 750 && (status = router2->get("/health").status) != 200; ++i) sleep_ms(20);
  EXPECT_EQ(status, 200);
  // No zombie: every child the test started and stopped has been reaped.
  replicas[0].reset();
  router2.reset();
  router.reset();
  int zombies = 0;
  while (waitpid(-1, nullptr, WNOHANG) > 0) ++zombies;
  EXPECT_EQ(zombies, 0) << "children left unreaped";
}

}  // namespace
}  // namespace arbor::server::testing
