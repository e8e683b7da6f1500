// engine::stats_line and engine_active: the periodic engine line of `arbor serve`.
#include <gtest/gtest.h>

#include <string>

#include "engine/metrics.h"

namespace arbor::engine {
namespace {

EngineMetricsSnapshot busy_after(const EngineMetricsSnapshot& before) {
  EngineMetricsSnapshot now = before;
  now.num_steps += 40;
  now.num_prompt_tokens += 1000;
  now.num_generation_tokens += 250;
  now.num_prefix_cache_query_tokens += 800;
  now.num_prefix_cache_hit_tokens += 200;
  now.num_running = 3;
  now.num_waiting = 2;
  now.kv_usage = 0.125;
  return now;
}

TEST(StatsLine, ThroughputsAndRatesAreOverTheInterval) {
  EngineMetricsSnapshot before;
  before.num_steps = 100;
  before.num_prompt_tokens = 5000;  // earlier traffic must not count
  before.num_generation_tokens = 9000;
  before.num_prefix_cache_query_tokens = 4000;
  before.num_prefix_cache_hit_tokens = 4000;
  const EngineMetricsSnapshot now = busy_after(before);
  EXPECT_EQ(stats_line(before, now, 10.0),
            "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 25.0 tokens/s, "
            "Running: 3 reqs, Waiting: 2 reqs, KV cache usage: 12.5%, "
            "Prefix cache hit rate: 25.0%");
  // Half the time, twice the rate.
  EXPECT_NE(stats_line(before, now, 5.0).find("Avg prompt throughput: 200.0 tokens/s, "
                                              "Avg generation throughput: 50.0 tokens/s"),
            std::string::npos);
}

TEST(StatsLine, SpeculationFiguresOnlyWhenDraftsWereVerified) {
  EngineMetricsSnapshot before;
  before.num_draft_tokens = 1000;
  before.num_accepted_draft_tokens = 900;
  before.num_verify_steps = 300;
  EngineMetricsSnapshot now = busy_after(before);
  EXPECT_EQ(stats_line(before, now, 1.0).find("Spec"), std::string::npos)
      << "no drafts in the interval: no speculation figures";
  now.num_draft_tokens += 120;
  now.num_accepted_draft_tokens += 75;
  now.num_verify_steps += 30;
  const std::string line = stats_line(before, now, 1.0);
  EXPECT_NE(line.find(", Spec acceptance rate: 62.5% (75/120 drafts), Mean accepted length: 3.50"),
            std::string::npos)
      << line;
}

TEST(StatsLine, KvCacheGroupsShowTheirShareOfThePool) {
  EngineMetricsSnapshot before;
  EngineMetricsSnapshot now = busy_after(before);
  now.kv_usable_blocks = 1000;
  now.kv_group_windows = {0, 512, 512};
  now.kv_group_used_blocks = {100, 15, 10};
  EXPECT_NE(stats_line(before, now, 1.0)
                .find("KV cache usage: 12.5% (full 10.0%, window 512 1.5%, window 512 1.0%), "
                      "Prefix cache hit rate: 25.0%"),
            std::string::npos)
      << stats_line(before, now, 1.0);
  // One group: the line as without groups.
  now.kv_group_windows = {0};
  now.kv_group_used_blocks = {125};
  EXPECT_NE(stats_line(before, now, 1.0).find("KV cache usage: 12.5%, Prefix"), std::string::npos);
}

TEST(StatsLine, ActiveWhileSteppingOrHoldingRequests) {
  EngineMetricsSnapshot before;
  before.num_steps = 7;
  EXPECT_FALSE(engine_active(before, before));
  EngineMetricsSnapshot stepped = before;
  stepped.num_steps = 8;
  EXPECT_TRUE(engine_active(before, stepped)) << "work done in the interval";
  EngineMetricsSnapshot waiting = before;
  waiting.num_waiting = 1;
  EXPECT_TRUE(engine_active(before, waiting)) << "a request still queued";
  EngineMetricsSnapshot running = before;
  running.num_running = 1;
  EXPECT_TRUE(engine_active(before, running));
  // Idle: rates are zero, not NaN.
  EXPECT_EQ(stats_line(before, before, 10.0),
            "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
            "Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0.0%, Prefix cache hit rate: 0.0%");
}

// Model shards: each shard's mean step, forward and wait over the interval (not since start).
TEST(StatsLine, ShardTimesArePerStepOverTheInterval) {
  EngineMetricsSnapshot before;
  before.shards.resize(1);
  before.shards[0].num_steps = 1000;
  before.shards[0].step_s = 100.0;  // earlier steps must not count
  before.shards[0].forward_s = 50.0;
  before.shards[0].wait_s = 50.0;
  before.shards[0].up = true;
  EngineMetricsSnapshot now = busy_after(before);
  now.shards[0].num_steps += 40;
  now.shards[0].step_s += 0.060;  // 1.5 ms a step
  now.shards[0].forward_s += 0.048;
  now.shards[0].wait_s += 0.012;
  EXPECT_NE(stats_line(before, now, 10.0)
                .find(", Shard 0: step 1.50 ms = forward 1.20 + wait 0.30"),
            std::string::npos)
      << stats_line(before, now, 10.0);
  now.shards[0].up = false;
  EXPECT_NE(stats_line(before, now, 10.0).find("wait 0.30 (down)"), std::string::npos);
}

}  // namespace
}  // namespace arbor::engine
