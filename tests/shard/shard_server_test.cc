// `arbor serve --shards 1` end to end (docs/shards.md): the same completions as in process, the
// shard's counters in /metrics, a shard killed mid-request recomputed into the same answer, and
// a shard that cannot come back: 503 naming the shard and the signal, /health 503, then 200
// once a restart works; no zombie shard at any point.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../server/server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

struct Child {
  int pid = 0;
  char state = 0;
};

// The processes whose parent is `parent`.
std::vector<Child> children_of(int parent) {
  std::vector<Child> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(entry.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    Child c;
    int ppid = 0;
    rest >> c.state >> ppid;
    if (ppid != parent) continue;
    c.pid = std::atoi(entry.path().filename().c_str());
    out.push_back(c);
  }
  return out;
}

int shard_pid(const ServerProcess& srv) {
  for (int i = 0; i < 200; ++i) {
    for (const Child& c : children_of(srv.pid())) {
      if (c.state != 'Z') return c.pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return 0;
}

int num_zombies(const ServerProcess& srv) {
  int n = 0;
  for (const Child& c : children_of(srv.pid())) n += c.state == 'Z';
  return n;
}

nlohmann::json completion(int32_t max_tokens, uint64_t seed) {
  return {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
          {"temperature", 0.8}, {"seed", seed}, {"ignore_eos", true}};
}

TEST(ShardServe, ShardsOneAnswersAsInProcessAndSurvivesKillNine) {
  test::TempDir dir("shard_serve");
  const std::string model = dir.path() + "/stories260K.gguf";
  std::filesystem::copy_file(test::shared_path(test::kStories260K), model);
  ServerProcess local({}, 0, model);
  ServerProcess sharded({"--shards", "1", "--recover-timeout", "3"}, 0, model);
  ASSERT_TRUE(local.ok() && sharded.ok());
  const int pid = shard_pid(sharded);
  ASSERT_GT(pid, 0) << "no shard process under the server";

  const HttpResult a = local.post("/v1/completions", completion(40, 7));
  const HttpResult b = sharded.post("/v1/completions", completion(40, 7));
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]);
  EXPECT_GT(sharded.metric("arbor_shard_steps_total{shard=\"0\"}"), 30);
  EXPECT_EQ(sharded.metric("arbor_shard_up{shard=\"0\"}"), 1);
  EXPECT_GT(sharded.metric("arbor_shard_wait_seconds_total{shard=\"0\"}"), 0);
  EXPECT_EQ(sharded.metric("arbor_executor_healthy"), 1);
  EXPECT_EQ(local.metric("arbor_shard_steps_total{shard=\"0\"}"), -1);

  // Killed in the middle of a long request: the answer is the fault-free one.
  const HttpResult want = local.post("/v1/completions", completion(400, 9));
  HttpResult got;
  std::thread client([&] { got = sharded.post("/v1/completions", completion(400, 9)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  client.join();
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(want.json()["choices"][0]["text"], got.json()["choices"][0]["text"]);
  EXPECT_EQ(sharded.metric("arbor_executor_faults_total"), 1);
  EXPECT_EQ(sharded.metric("arbor_shard_restarts_total{shard=\"0\"}"), 1);
  EXPECT_EQ(sharded.metric("arbor_shard_incarnation{shard=\"0\"}"), 2);
  EXPECT_EQ(num_zombies(sharded), 0);

  // The model file goes away and the shard dies: no restart can work.
  const int second = shard_pid(sharded);
  ASSERT_GT(second, 0);
  ASSERT_NE(second, pid);
  std::filesystem::remove(model);
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  const HttpResult failed = sharded.post("/v1/completions", completion(8, 1));
  EXPECT_EQ(failed.status, 503) << failed.body;
  EXPECT_NE(failed.body.find("shard 0"), std::string::npos) << failed.body;
  EXPECT_NE(failed.body.find("SIGKILL"), std::string::npos) << failed.body;
  const HttpResult health = sharded.get("/health");
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_NE(health.body.find("shard 0"), std::string::npos) << health.body;
  EXPECT_EQ(sharded.metric("arbor_executor_healthy"), 0);
  EXPECT_EQ(num_zombies(sharded), 0);

  // Back: the next request restarts the shard and runs; /health is 200 again.
  std::filesystem::copy_file(test::shared_path(test::kStories260K), model);
  const HttpResult again = sharded.post("/v1/completions", completion(40, 7));
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.json()["choices"][0]["text"], a.json()["choices"][0]["text"]);
  EXPECT_EQ(sharded.get("/health").status, 200);
  EXPECT_TRUE(sharded.wait_no_blocks_used());
  EXPECT_EQ(num_zombies(sharded), 0);
}

TEST(ShardServe, MoreShardsThanOneAreRefusedUntilTensorParallelism) {
  const test::CommandResult r = test::run_arbor(
      "serve -m " + test::shared_path(test::kStories260K) + " --shards 2 --port 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--shards 2: tensor parallelism"), std::string::npos) << r.output();
}

}  // namespace
}  // namespace arbor::server::testing
