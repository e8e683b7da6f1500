// `arbor serve --shards 1` end to end (docs/shards.md): the same completions as in process, the
// shard's counters in /metrics, a shard killed mid-request recomputed into the same answer, and
// a shard that cannot come back: 503 naming the shard and the signal, /health 503, then 200
// once a restart works; no zombie shard at any point. `--shards 2` (tensor parallelism): the
// same answers, streamed and whole, and rank 1 killed mid-request recomputed into the same one.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
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

// Waits (up to 30 s) until shard `rank` has run `steps` steps: a request is then in progress
// whatever the machine's load (a 400-token request runs ~400 steps).
bool wait_for_steps(const ServerProcess& srv, const std::string& rank, double steps) {
  const std::string name = "arbor_shard_steps_total{shard=\"" + rank + "\"}";
  for (int i = 0; i < 30000; ++i) {
    if (srv.metric(name) >= steps) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
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
  const double steps = sharded.metric("arbor_shard_steps_total{shard=\"0\"}");
  std::thread client([&] { got = sharded.post("/v1/completions", completion(400, 9)); });
  ASSERT_TRUE(wait_for_steps(sharded, "0", steps + 20)) << "the request did not start";
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

// The live shard processes under the server, by pid.
std::vector<int> shard_pids(const ServerProcess& srv, size_t want) {
  std::vector<int> pids;
  for (int i = 0; i < 400 && pids.size() < want; ++i) {
    pids.clear();
    for (const Child& c : children_of(srv.pid())) {
      if (c.state != 'Z') pids.push_back(c.pid);
    }
    if (pids.size() < want) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

TEST(ShardServe, ShardsTwoIsTensorParallelAndAnswersAsInProcess) {
  const std::string model = test::shared_path(test::kStories260K);
  ServerProcess local({}, 0, model);
  ServerProcess tp({"--shards", "2", "--recover-timeout", "10"}, 0, model);
  ASSERT_TRUE(local.ok() && tp.ok());
  const std::vector<int> pids = shard_pids(tp, 2);
  ASSERT_EQ(pids.size(), 2u) << "two shard processes under the server";

  for (uint64_t seed : {7, 8}) {
    const HttpResult a = local.post("/v1/completions", completion(40, seed));
    const HttpResult b = tp.post("/v1/completions", completion(40, seed));
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    EXPECT_EQ(a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]) << "seed " << seed;
  }
  nlohmann::json greedy = completion(32, 1);
  greedy["temperature"] = 0;
  greedy["logprobs"] = 3;
  const HttpResult ga = local.post("/v1/completions", greedy);
  const HttpResult gb = tp.post("/v1/completions", greedy);
  ASSERT_EQ(gb.status, 200) << gb.body;
  EXPECT_EQ(ga.json()["choices"][0]["logprobs"], gb.json()["choices"][0]["logprobs"]);
  for (const char* rank : {"0", "1"}) {
    const std::string label = std::string("{shard=\"") + rank + "\"}";
    EXPECT_GT(tp.metric("arbor_shard_steps_total" + label), 30) << rank;
    EXPECT_EQ(tp.metric("arbor_shard_up" + label), 1) << rank;
  }

  // Rank 1 killed in the middle of a long request: the group restarts, the answer is the
  // fault-free one.
  const HttpResult want = local.post("/v1/completions", completion(400, 9));
  HttpResult got;
  const double steps = tp.metric("arbor_shard_steps_total{shard=\"1\"}");
  std::thread client([&] { got = tp.post("/v1/completions", completion(400, 9)); });
  ASSERT_TRUE(wait_for_steps(tp, "1", steps + 20)) << "the request did not start";
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  client.join();
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(want.json()["choices"][0]["text"], got.json()["choices"][0]["text"]);
  EXPECT_EQ(tp.metric("arbor_executor_faults_total"), 1);
  EXPECT_EQ(tp.metric("arbor_shard_incarnation{shard=\"1\"}"), 2);
  EXPECT_EQ(tp.get("/health").status, 200);
  EXPECT_TRUE(tp.wait_no_blocks_used());
  EXPECT_EQ(num_zombies(tp), 0);
  const std::vector<int> after = shard_pids(tp, 2);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(std::find(after.begin(), after.end(), pids[0]) == after.end())
      << "rank 0 of the faulted group still runs";
}

// --task embed and rerank through a tensor-parallel group (rank 0 pools the hidden states every
// rank holds; the Qwen3-Reranker rows of the LM head come from the file, since rank 0 holds only
// half of its vocabulary): the same vectors and scores as in process, bit for bit.
TEST(ShardServe, EmbeddingsAndRerankThroughTwoShardsEqualInProcess) {
  const std::vector<std::string> docs = {"Pandas eat bamboo.", "The moon is far.", "q"};
  struct Case {
    const char* task;
    std::string model;
    const char* route;
    nlohmann::json body;
    const char* field;
  };
  const Case cases[] = {
      {"embed", random_qwen3_embed_model(), "/v1/embeddings",
       {{"input", {"A cat sat.", "Dogs bark loudly", "x"}}}, "data"},
      {"rerank", random_qwen3_rank_model(), "/v1/rerank",
       {{"query", "What do pandas eat?"}, {"documents", docs}}, "results"},
      {"rerank", random_qwen3_plain_model(), "/v1/rerank",
       {{"query", "What do pandas eat?"}, {"documents", docs}}, "results"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.task) + " " + c.model);
    ServerProcess local({"--task", c.task}, 0, c.model);
    ServerProcess tp({"--task", c.task, "--shards", "2"}, 0, c.model);
    ASSERT_TRUE(local.ok() && tp.ok());
    const HttpResult a = local.post(c.route, c.body);
    const HttpResult b = tp.post(c.route, c.body);
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    EXPECT_EQ(a.json()[c.field], b.json()[c.field]);
    EXPECT_EQ(tp.metric("arbor_shard_up{shard=\"1\"}"), 1);
    EXPECT_TRUE(tp.wait_no_blocks_used());
  }
}

TEST(ShardServe, UnsupportedTensorParallelDegreeIsRefusedByName) {
  const test::CommandResult r = test::run_arbor(
      "serve -m " + test::shared_path(test::kStories260K) + " --shards 3 --port 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--shards 3"), std::string::npos) << r.output();
  EXPECT_NE(r.err.find("1, 2 or 4"), std::string::npos) << r.output();
}

// /health answers 503 while requests run and no engine step ends (--stall-timeout): a stopped
// shard holds the step until its deadline (1 s at least), long enough to see it; then the
// engine restarts the shard and /health is 200 again, the request completing.
TEST(ShardServe, HealthIs503WhileNoStepEnds) {
  ServerProcess sharded({"--shards", "1", "--recover-timeout", "5", "--stall-timeout", "0.2"});
  ASSERT_TRUE(sharded.ok());
  const int pid = shard_pid(sharded);
  ASSERT_GT(pid, 0) << "no shard process under the server";
  EXPECT_EQ(sharded.get("/health").status, 200);
  HttpResult long_request;
  std::thread client([&] {
    long_request = sharded.post("/v1/completions",
                                {{"prompt", "Once upon a time"}, {"max_tokens", 1800},
                                 {"ignore_eos", true}, {"temperature", 0}});
  });
  for (int i = 0; i < 200 && sharded.metric("arbor_num_requests_running") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  HttpResult stalled;
  for (int i = 0; i < 100; ++i) {
    stalled = sharded.get("/health");
    if (stalled.status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(stalled.status, 503) << stalled.body;
  EXPECT_NE(stalled.body.find("no engine step"), std::string::npos) << stalled.body;
  client.join();
  EXPECT_EQ(long_request.status, 200) << long_request.body;
  EXPECT_EQ(sharded.get("/health").status, 200);
  ::kill(pid, SIGKILL);  // the stopped shard, if the engine has not reaped it yet
}

}  // namespace
}  // namespace arbor::server::testing
