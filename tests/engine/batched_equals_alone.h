// Batched equals alone: greedy requests submitted at staggered times to one engine produce
// exactly the tokens each produces run alone through model::SingleSequence (no scheduler, no
// executor, one chunk per prompt) — under FCFS, and under the priority policy with a small KV
// pool, where important requests preempt running ones.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "executor_under_test.h"
#include "executor/local_executor.h"
#include "engine_test_util.h"
#include "model/runner.h"
#include "sampling/sampler.h"

namespace arbor::engine::testing {

struct AloneCase {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 1;
  int32_t priority = 0;  // 2, 1, 0 by thirds of the submission order (later = more important)
};

inline std::vector<AloneCase> make_cases(uint64_t seed, int num, int32_t max_prompt,
                                         int32_t max_out, int32_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<AloneCase> cases;
  for (int i = 0; i < num; ++i) {
    // Lengths from 1 to max_prompt, spread evenly, in a shuffled order.
    const int32_t len = 1 + static_cast<int32_t>((static_cast<int64_t>(i) * (max_prompt - 1)) /
                                                 std::max(1, num - 1));
    const int32_t out = std::uniform_int_distribution<int32_t>(1, max_out)(rng);
    cases.push_back({random_prompt(rng, len, vocab), out});
  }
  std::shuffle(cases.begin(), cases.end(), rng);
  for (int i = 0; i < num; ++i) cases[i].priority = 2 - (3 * i) / num;
  return cases;
}

// Greedy tokens of one request alone, through SingleSequence.
inline std::vector<std::vector<int32_t>> run_alone(const std::vector<AloneCase>& cases) {
  model::RunnerOptions ro;
  ro.num_blocks = 64;
  // Two threads here, one in the engine runs: the tokens must not depend on the thread count
  // either. (Pools of 2..4 threads on a loaded machine: ThreadPool.StressTinyUnevenJobs...)
  ro.num_threads = 2;
  auto runner = model::ModelRunner::load(stories260k_path(), ro);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  sampling::Sampler sampler;
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<std::vector<int32_t>> out;
  for (const AloneCase& c : cases) {
    model::SingleSequence seq(**runner, model::SingleSequence::contiguous_blocks(1, 63));
    std::vector<int32_t> ids;
    sampling::Rng rng(0);
    auto logits = seq.append(c.prompt);
    EXPECT_TRUE(logits.ok()) << logits.status().to_string();
    while (true) {
      ids.push_back(sampler.sample(*logits, greedy, {c.prompt, ids}, rng).token_id);
      if (static_cast<int32_t>(ids.size()) == c.max_tokens) break;
      logits = seq.append({&ids.back(), 1});
      EXPECT_TRUE(logits.ok()) << logits.status().to_string();
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// The engine's and the CPU executor's options of one test run.
struct RunOptions {
  EngineOptions engine;
  executor::ExecutorOptions cpu;
};

struct BatchedRun {
  std::vector<std::vector<int32_t>> tokens;
  EngineMetricsSnapshot metrics;
};

// Waits (at most 2 s) until requests run and hold at least half of the KV pool.
inline void wait_until_kv_busy(const EngineCore& engine) {
  for (int i = 0; i < 20000; ++i) {
    const EngineMetricsSnapshot m = engine.metrics();
    if (m.num_running > 0 && m.kv_usage >= 0.5) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Submits every case (8 at a time, 2 ms apart) to one engine and collects the tokens. With the
// priority policy, a more important third is submitted only once the less important ones hold
// the KV pool, so that it has to preempt them.
inline BatchedRun run_batched(const std::vector<AloneCase>& cases, const RunOptions& run_opts) {
  const EngineOptions& opts = run_opts.engine;
  auto exec = ::arbor::engine::testing::load_executor(stories260k_path(), run_opts.cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  EngineCoreConfig cfg;
  cfg.options = opts;
  cfg.eos_token_ids = std::vector<int32_t>{};  // run to max_tokens: longer outputs to compare
  EngineCore engine(std::move(*exec), cfg);
  const int32_t free_at_start = engine.num_free_blocks();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (opts.policy == sched::SchedulingPolicy::kPriority && i > 0 &&
        cases[i].priority < cases[i - 1].priority) {
      wait_until_kv_busy(engine);
    }
    GenerateRequest r;
    r.prompt_token_ids = cases[i].prompt;
    r.sampling.temperature = 0.0f;
    r.max_tokens = cases[i].max_tokens;
    r.priority = cases[i].priority;
    auto s = engine.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
    if (i % 8 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  BatchedRun run;
  for (auto& s : streams) {
    Collected c = drain(*s);
    EXPECT_TRUE(c.final_event.error.ok()) << c.final_event.error.to_string();
    run.tokens.push_back(std::move(c.token_ids[0]));
  }
  engine.wait_idle();
  run.metrics = engine.metrics();
  EXPECT_EQ(engine.num_free_blocks(), free_at_start)
      << "running " << run.metrics.num_running << ", waiting " << run.metrics.num_waiting
      << ", kv usage " << run.metrics.kv_usage << ", finished "
      << run.metrics.num_requests_finished << ", steps " << run.metrics.num_steps;
  return run;
}

inline RunOptions alone_options(int32_t budget, int64_t num_blocks) {
  RunOptions o;
  o.engine.max_num_seqs = 64;
  o.engine.max_num_batched_tokens = budget;
  o.cpu.block_size = 16;
  o.cpu.num_kv_blocks = num_blocks;
  o.cpu.num_threads = 1;
  o.cpu.reserve_tokens = budget;
  return o;
}

inline void check_batched_equals_alone(int num, int32_t max_prompt, int32_t max_out,
                                       int64_t small_pool_blocks) {
  const std::vector<AloneCase> cases = make_cases(42, num, max_prompt, max_out, 512);
  const std::vector<std::vector<int32_t>> alone = run_alone(cases);
  using sched::SchedulingPolicy;
  struct Config {
    int32_t budget;
    int64_t blocks;
    SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  };
  for (const Config& c : {Config{32, 2048}, Config{256, 2048}, Config{2048, 2048},
                          Config{256, small_pool_blocks},
                          Config{256, small_pool_blocks, SchedulingPolicy::kPriority}}) {
    const bool priority = c.policy == SchedulingPolicy::kPriority;
    SCOPED_TRACE(str_cat("budget ", c.budget, ", ", c.blocks, " KV blocks",
                         priority ? ", priority policy" : ""));
    RunOptions opts = alone_options(c.budget, c.blocks);
    opts.engine.policy = c.policy;
    // Whether a run batches and preempts depends on when the engine thread picks requests up.
    // Every run must equal the alone runs; a run that did not exercise what the configuration
    // is for (a busy machine spread the requests out) is run again, up to 3 times, so that the
    // test stays meaningful without depending on timing.
    BatchedRun run;
    bool exercised = false;
    for (int attempt = 0; attempt < 3 && !exercised; ++attempt) {
      run = run_batched(cases, opts);
      ASSERT_EQ(run.tokens.size(), alone.size());
      for (size_t i = 0; i < alone.size(); ++i) {
        EXPECT_EQ(run.tokens[i], alone[i]) << "request " << i << ", prompt of "
                                           << cases[i].prompt.size() << " tokens";
      }
      if (!priority) EXPECT_EQ(run.metrics.num_priority_preemptions, 0);
      exercised = run.metrics.batch_size.mean() > 1.5 &&
                  (c.blocks != small_pool_blocks || run.metrics.num_preemptions > 0) &&
                  (!priority || run.metrics.num_priority_preemptions > 0);
    }
    EXPECT_GT(run.metrics.batch_size.mean(), 1.5) << "requests did not run batched";
    if (c.blocks == small_pool_blocks) {
      EXPECT_GT(run.metrics.num_preemptions, 0);
    }
    if (priority) {
      EXPECT_GT(run.metrics.num_priority_preemptions, 0);
    }
    std::printf("budget %d, %lld blocks%s: %lld steps, mean batch %.1f, preemptions %lld "
                "(%lld for priority)\n",
                c.budget, static_cast<long long>(c.blocks), priority ? ", priority" : "",
                static_cast<long long>(run.metrics.num_steps), run.metrics.batch_size.mean(),
                static_cast<long long>(run.metrics.num_preemptions),
                static_cast<long long>(run.metrics.num_priority_preemptions));
  }
}

}  // namespace arbor::engine::testing
