// The engine over a RemoteExecutor and a launched `arbor shard` (docs/shards.md) against the
// same engine in process on stories260K: greedy and seeded outputs (with logprobs), speculation
// and prompt logprobs identical; a shard killed with SIGKILL at a random step, or stopped with
// SIGSTOP, costs a recompute and nothing else (every stream identical to the fault-free run, no
// leaked block, no zombie); a shard that cannot come back ends every stream with an error event
// naming the shard and the signal. The same through a tensor-parallel group of 2 launched ranks
// (`--shards 2`): outputs bitwise equal to one process (n-gram chains and draft-model trees
// included), and a killed or stopped rank 1 restarts the whole group, identically.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <random>
#include <thread>

#include "../engine/engine_test_util.h"
#include "executor/local_executor.h"
#include "shard/remote_executor.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::shard {
namespace {

using engine::EngineCore;
using engine::GenerateRequest;
using engine::testing::Collected;
using engine::testing::drain;

struct ShardSetup {
  std::string model;
  executor::ExecutorOptions exec;
  engine::EngineOptions engine;
  double recover_timeout_s = 30.0;
  int32_t world = 1;  // launched ranks: the tensor-parallel degree
};

ShardSetup base_setup() {
  ShardSetup s;
  s.model = engine::testing::stories260k_path();
  s.exec.device = executor::Device::kCpu;
  s.exec.num_threads = 1;
  s.exec.num_kv_blocks = 256;
  s.exec.block_size = 16;
  s.engine.max_num_seqs = 32;
  s.engine.max_num_batched_tokens = 512;
  return s;
}

std::vector<std::string> shard_argv(const ShardSetup& s, const std::string& model) {
  std::vector<std::string> argv = {test::arbor_bin(), "shard", "-m", model, "--log-level", "warn",
                                   "--device", "cpu", "-t", "1", "--num-kv-blocks",
                                   std::to_string(s.exec.num_kv_blocks), "--block-size",
                                   std::to_string(s.exec.block_size), "--max-num-batched-tokens",
                                   std::to_string(s.engine.max_num_batched_tokens)};
  if (s.exec.proposer == executor::SpecProposer::kNgram) {
    argv.insert(argv.end(), {"--spec", "ngram"});
  }
  if (s.exec.proposer == executor::SpecProposer::kDraft) {
    argv.insert(argv.end(), {"--spec", "draft", "--draft-model", s.exec.draft_model,
                             "--spec-tree-budget", std::to_string(s.exec.tree_budget),
                             "--spec-tree-width", std::to_string(s.exec.tree_width)});
  }
  return argv;
}

struct Engine {
  std::unique_ptr<EngineCore> core;
  RemoteExecutor* remote = nullptr;  // null in process
};

Engine make_engine(const ShardSetup& s, bool sharded, const std::string& model = "") {
  Engine e;
  std::unique_ptr<step::ModelExecutor> exec;
  if (sharded) {
    RemoteExecutorOptions o;
    o.launch_argv = shard_argv(s, model.empty() ? s.model : model);
    o.num_launched = s.world;
    o.recover_timeout_s = s.recover_timeout_s;
    auto r = RemoteExecutor::start(o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return e;
    e.remote = r->get();
    exec = std::move(*r);
  } else {
    auto l = executor::LocalExecutor::load(s.model, s.exec);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    if (!l.ok()) return e;
    exec = std::move(*l);
  }
  engine::EngineCoreConfig cfg;
  cfg.options = s.engine;
  cfg.eos_token_ids = std::vector<int32_t>{};
  EXPECT_TRUE(EngineCore::validate_config(*exec, cfg).ok());
  e.core = std::make_unique<EngineCore>(std::move(exec), cfg);
  return e;
}

// num requests: even ones greedy, odd ones seeded at temperature 0.9; all with 2 logprobs.
std::vector<GenerateRequest> workload(int num, int32_t max_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < num; ++i) {
    GenerateRequest r;
    r.prompt_token_ids = engine::testing::random_prompt(rng, 5 + (i * 7) % 40, 512);
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    if (i % 2 == 1) r.sampling.seed = seed + i;
    r.sampling.logprobs = 2;
    r.max_tokens = max_tokens;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct RunOutput {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<double> cumulative_logprob;
  std::vector<Status> errors;
};

// Submits every request, calls on_event(i, events so far) after each event of request 0, and
// drains every stream.
RunOutput run(EngineCore& core, std::vector<GenerateRequest> reqs,
              const std::function<void(int)>& on_event = {}) {
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (GenerateRequest& r : reqs) {
    auto s = core.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  RunOutput out;
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> tokens;
    double cum = 0;
    Status error;
    int events = 0;
    while (std::optional<engine::StreamEvent> e = streams[i]->next()) {
      tokens.insert(tokens.end(), e->token_ids.begin(), e->token_ids.end());
      if (!e->token_ids.empty()) cum = e->cumulative_logprob;
      if (e->final) error = e->error;
      if (i == 0 && on_event) on_event(++events);
    }
    out.tokens.push_back(std::move(tokens));
    out.cumulative_logprob.push_back(cum);
    out.errors.push_back(error);
  }
  core.wait_idle();
  return out;
}

// Children of this process that are zombies (ended, not reaped).
int num_zombie_children() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(entry.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == getpid() && state == 'Z') ++n;
  }
  return n;
}

// Shared-memory TP groups this engine process named that are still in /dev/shm.
int shm_groups_of(int pid) {
  int n = 0;
  const std::string prefix = str_cat("arbor-tp-", pid, "-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(prefix)) ++n;
  }
  return n;
}

bool process_exists(int64_t pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) == 0; }

void expect_same(const RunOutput& a, const RunOutput& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    EXPECT_TRUE(a.errors[i].ok()) << "request " << i << ": " << a.errors[i].to_string();
    EXPECT_TRUE(b.errors[i].ok()) << "request " << i << ": " << b.errors[i].to_string();
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "request " << i;
    EXPECT_EQ(a.cumulative_logprob[i], b.cumulative_logprob[i]) << "request " << i;
  }
}

TEST(ShardEngine, GreedyAndSeededOutputsEqualInProcess) {
  const ShardSetup s = base_setup();
  Engine local = make_engine(s, false);
  Engine remote = make_engine(s, true);
  ASSERT_TRUE(local.core && remote.core);
  const RunOutput a = run(*local.core, workload(12, 24, 5));
  const RunOutput b = run(*remote.core, workload(12, 24, 5));
  expect_same(a, b);
  EXPECT_EQ(a.tokens[0].size(), 24u);
  const engine::EngineMetricsSnapshot m = remote.core->metrics();
  ASSERT_EQ(m.shards.size(), 1u);
  EXPECT_GT(m.shards[0].num_steps, 20);
  EXPECT_GT(m.shards[0].forward_s, 0);
  EXPECT_GT(m.shards[0].wait_s, 0);
  EXPECT_EQ(m.shards[0].num_faults, 0);
  EXPECT_TRUE(local.core->metrics().shards.empty());
}

// Repetitive prompts (so that drafts exist and get accepted) through `s` with speculation in
// process and through `world` launched ranks: identical outputs, drafts and acceptances.
void check_speculation_equals_in_process(ShardSetup s, int32_t world) {
  s.engine.max_spec_tokens = 3;
  std::vector<GenerateRequest> reqs = workload(6, 32, 9);
  for (GenerateRequest& r : reqs) {
    r.speculation = sched::SpecRequest{.mode = sched::SpecMode::kFixed, .k = 3};
    std::vector<int32_t> p = r.prompt_token_ids;
    for (int k = 0; k < 3; ++k) r.prompt_token_ids.insert(r.prompt_token_ids.end(), p.begin(), p.end());
  }
  Engine local = make_engine(s, false);
  s.world = world;
  Engine remote = make_engine(s, true);
  ASSERT_TRUE(local.core && remote.core);
  expect_same(run(*local.core, reqs), run(*remote.core, reqs));
  const engine::EngineMetricsSnapshot m = remote.core->metrics();
  EXPECT_GT(m.num_accepted_draft_tokens, 0) << "no draft crossed the protocol and was accepted";
  EXPECT_EQ(m.num_draft_tokens, local.core->metrics().num_draft_tokens);
  EXPECT_EQ(m.num_accepted_draft_tokens, local.core->metrics().num_accepted_draft_tokens);
}

TEST(ShardEngine, SpeculationEqualsInProcess) {
  ShardSetup s = base_setup();
  s.exec.proposer = executor::SpecProposer::kNgram;
  check_speculation_equals_in_process(s, 1);
}

// Chunked prompts with 3 prompt logprobs in process and through `world` launched ranks: every
// position's logprob, rank and top tokens equal.
void check_prompt_logprobs_equal_in_process(int32_t world, int num_requests) {
  ShardSetup s = base_setup();
  s.engine.max_num_batched_tokens = 32;  // chunked prompts: logprobs over several steps
  std::vector<GenerateRequest> reqs = workload(num_requests, 4, 11);
  for (GenerateRequest& r : reqs) {
    r.sampling.prompt_logprobs = 3;
    std::mt19937_64 rng(r.prompt_token_ids[0]);
    r.prompt_token_ids = engine::testing::random_prompt(rng, 70, 512);
  }
  std::vector<engine::PromptLogprobs> got[2];
  for (int sharded = 0; sharded < 2; ++sharded) {
    s.world = sharded == 1 ? world : 1;
    Engine e = make_engine(s, sharded == 1);
    ASSERT_TRUE(e.core);
    for (GenerateRequest r : reqs) {
      auto stream = e.core->submit(std::move(r));
      ASSERT_TRUE(stream.ok());
      engine::PromptLogprobs p;
      while (std::optional<engine::StreamEvent> ev = (*stream)->next()) {
        if (ev->prompt_logprobs) p = *ev->prompt_logprobs;
      }
      got[sharded].push_back(std::move(p));
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[0][i].size(), 69u);
    ASSERT_EQ(got[1][i].size(), 69u);
    for (size_t p = 0; p < got[0][i].size(); ++p) {
      EXPECT_EQ(got[0][i][p].token_id, got[1][i][p].token_id);
      EXPECT_EQ(got[0][i][p].logprob, got[1][i][p].logprob) << "request " << i << " position " << p;
      EXPECT_EQ(got[0][i][p].rank, got[1][i][p].rank);
      ASSERT_EQ(got[0][i][p].top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got[0][i][p].top[k].token_id, got[1][i][p].top[k].token_id);
      }
    }
  }
}

TEST(ShardEngine, PromptLogprobsEqualInProcess) { check_prompt_logprobs_equal_in_process(1, 4); }

// Runs 32 seeded streams fault-free in process, then through `world` launched ranks of which
// rank `victim` gets `signal` when request 0 has seen a random number of events; every stream
// must match, and the whole group comes back as a new incarnation.
void check_fault_recomputes(int signal, uint64_t seed, int32_t world = 1, int32_t victim = 0) {
  ShardSetup s = base_setup();
  s.engine.max_num_seqs = 32;
  s.world = world;
  const std::vector<GenerateRequest> reqs = workload(32, 32, seed);
  Engine local = make_engine(s, false);
  ASSERT_TRUE(local.core);
  const RunOutput reference = run(*local.core, reqs);
  Engine remote = make_engine(s, true);
  ASSERT_TRUE(remote.core);
  const int32_t free_at_start = remote.core->num_free_blocks();
  std::vector<int64_t> pids;
  for (int32_t r = 0; r < world; ++r) pids.push_back(remote.remote->shard_pid(r));
  const int64_t pid = pids[victim];
  ASSERT_TRUE(process_exists(pid));
  std::mt19937_64 rng(seed);
  const int at_event = std::uniform_int_distribution<int>(2, 20)(rng);
  const RunOutput got = run(*remote.core, reqs, [&](int events) {
    if (events == at_event) {
      ASSERT_EQ(::kill(static_cast<pid_t>(pid), signal), 0);
    }
  });
  SCOPED_TRACE(str_cat("seed ", seed, ", signal ", signal, " to rank ", victim, " of ", world,
                       " after ", at_event, " events"));
  expect_same(reference, got);
  const engine::EngineMetricsSnapshot m = remote.core->metrics();
  EXPECT_EQ(m.num_executor_faults, 1);
  EXPECT_EQ(m.num_executor_recoveries, 1);
  EXPECT_TRUE(m.executor_healthy);
  ASSERT_EQ(m.shards.size(), static_cast<size_t>(world));
  for (int32_t r = 0; r < world; ++r) {
    EXPECT_EQ(m.shards[r].incarnation, 2u) << "rank " << r;
    EXPECT_EQ(m.shards[r].num_restarts, 1) << "rank " << r;
    EXPECT_TRUE(m.shards[r].up) << "rank " << r;
    // The whole group was restarted: every rank is a new process.
    EXPECT_FALSE(process_exists(pids[r])) << "rank " << r << " of the faulted group still runs";
    EXPECT_NE(remote.remote->shard_pid(r), pids[r]) << "rank " << r;
    EXPECT_TRUE(process_exists(remote.remote->shard_pid(r))) << "rank " << r;
  }
  EXPECT_EQ(m.shards[victim].num_faults, 1);
  EXPECT_NE(m.shards[victim].last_fault.find(signal == SIGKILL ? "SIGKILL" : "SIGSTOP"),
            std::string::npos)
      << m.shards[victim].last_fault;
  EXPECT_GT(m.num_preemptions, 0);
  EXPECT_EQ(remote.core->num_free_blocks(), free_at_start) << "leaked KV blocks";
  EXPECT_EQ(num_zombie_children(), 0);
  if (world > 1) EXPECT_EQ(shm_groups_of(getpid()), 0) << "a TP group's shared memory was left";
}

TEST(ShardFaults, KillNineAtARandomStepRecomputesIdentically) {
  check_fault_recomputes(SIGKILL, 101);
}

TEST(ShardFaults, SigstopIsDetectedAtTheDeadlineAndRecomputedIdentically) {
  check_fault_recomputes(SIGSTOP, 202);
}

// The shard's model file disappears, then the shard is killed: its restart fails, so every
// stream ends with an error naming the shard and the signal, and no block leaks.
TEST(ShardFaults, RecoveryImpossibleEndsEveryStreamWithAnError) {
  ShardSetup s = base_setup();
  s.recover_timeout_s = 2.0;
  test::TempDir dir("shard_fault");
  const std::string model = dir.path() + "/model.gguf";
  std::filesystem::copy_file(s.model, model);
  Engine remote = make_engine(s, true, model);
  ASSERT_TRUE(remote.core);
  const int32_t free_at_start = remote.core->num_free_blocks();
  const int64_t pid = remote.remote->shard_pid();
  const RunOutput got = run(*remote.core, workload(8, 64, 3), [&](int events) {
    if (events == 3) {
      std::filesystem::remove(model);
      ::kill(static_cast<pid_t>(pid), SIGKILL);
    }
  });
  for (size_t i = 0; i < got.errors.size(); ++i) {
    EXPECT_EQ(got.errors[i].code(), StatusCode::kFailedPrecondition) << "request " << i;
    EXPECT_NE(got.errors[i].message().find("shard 0"), std::string::npos) << got.errors[i].to_string();
    EXPECT_NE(got.errors[i].message().find("SIGKILL"), std::string::npos) << got.errors[i].to_string();
  }
  EngineCore& core = *remote.core;
  EXPECT_FALSE(core.metrics().executor_healthy);
  EXPECT_EQ(core.num_free_blocks(), free_at_start);
  EXPECT_EQ(num_zombie_children(), 0);
  // The file is back: the next request brings a new incarnation up and runs.
  std::filesystem::copy_file(s.model, model);
  const RunOutput after = run(core, workload(2, 8, 4));
  EXPECT_TRUE(after.errors[0].ok()) << after.errors[0].to_string();
  EXPECT_EQ(after.tokens[0].size(), 8u);
  EXPECT_TRUE(core.metrics().executor_healthy);
}

// Tensor parallelism across shard processes: 2 launched ranks meeting in shared memory.
TEST(ShardTp, GreedyAndSeededOutputsAtTp2EqualOneProcess) {
  ShardSetup s = base_setup();
  Engine local = make_engine(s, false);
  s.world = 2;
  Engine remote = make_engine(s, true);
  ASSERT_TRUE(local.core && remote.core);
  ASSERT_NE(remote.remote->shard_pid(0), remote.remote->shard_pid(1));
  const RunOutput a = run(*local.core, workload(12, 24, 5));
  const RunOutput b = run(*remote.core, workload(12, 24, 5));
  expect_same(a, b);
  const engine::EngineMetricsSnapshot m = remote.core->metrics();
  ASSERT_EQ(m.shards.size(), 2u);
  for (const step::ShardStats& st : m.shards) {
    EXPECT_GT(st.num_steps, 20) << "rank " << st.rank;
    EXPECT_GT(st.forward_s, 0) << "rank " << st.rank;
    EXPECT_EQ(st.num_faults, 0) << "rank " << st.rank;
  }
  EXPECT_EQ(shm_groups_of(getpid()), 0) << "rank 0 unlinks the group's name after the first call";
}

TEST(ShardTp, NgramChainsAndDraftModelTreesAtTp2EqualOneProcess) {
  struct Case {
    const char* name;
    executor::SpecProposer proposer;
    int32_t tree_budget;
  };
  for (const Case c : {Case{"n-gram chains", executor::SpecProposer::kNgram, 0},
                       Case{"draft-model trees", executor::SpecProposer::kDraft, 8}}) {
    SCOPED_TRACE(c.name);
    ShardSetup s = base_setup();
    s.exec.proposer = c.proposer;
    s.exec.tree_budget = c.tree_budget;
    s.exec.tree_width = 3;
    if (c.proposer == executor::SpecProposer::kDraft) s.exec.draft_model = s.model;
    check_speculation_equals_in_process(s, 2);
  }
}

TEST(ShardTp, PromptLogprobsAtTp2EqualOneProcess) { check_prompt_logprobs_equal_in_process(2, 3); }

TEST(ShardTp, KillNineOfRank1RestartsTheGroupAndRecomputesIdentically) {
  check_fault_recomputes(SIGKILL, 303, /*world=*/2, /*victim=*/1);
}

TEST(ShardTp, SigstopOfRank1IsNamedAndRecomputedIdentically) {
  check_fault_recomputes(SIGSTOP, 404, /*world=*/2, /*victim=*/1);
}

// What an engine killed with SIGKILL leaves (its socket folder) is removed by the next one.
TEST(ShardFaults, StaleSocketFoldersOfGoneEnginesAreRemoved) {
  // A pid that is surely gone: a child that has been reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string stale = str_cat("/tmp/arbor-shards-", child, "-test");
  const std::string alive = str_cat("/tmp/arbor-shards-", getpid(), "-test");
  for (const std::string& d : {stale, alive}) {
    std::filesystem::create_directories(d);
    std::ofstream(d + "/shard-0.sock") << "";
  }
  Engine e = make_engine(base_setup(), true);
  ASSERT_TRUE(e.core);
  EXPECT_FALSE(std::filesystem::exists(stale)) << "the gone engine's folder is still there";
  EXPECT_TRUE(std::filesystem::exists(alive)) << "a live process's folder was removed";
  std::filesystem::remove_all(alive);
}

// A rank started for another group size refuses the engine's Hello by name.
TEST(ShardTp, RankOfAnotherWorldSizeIsRefused) {
  ShardSetup s = base_setup();
  RemoteExecutorOptions o;
  o.launch_argv = shard_argv(s, s.model);
  o.launch_argv.insert(o.launch_argv.end(), {"--rank", "0", "--world-size", "2"});
  o.start_timeout_s = 20;
  auto r = RemoteExecutor::start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("this shard was started as rank 0 of 2"), std::string::npos)
      << r.status().to_string();
  EXPECT_EQ(num_zombie_children(), 0);
}

}  // namespace
}  // namespace arbor::shard
