// Pooling requests (embeddings, reranking) in the scheduler: they run their prompt in chunks
// beside generation, end with the step that runs their last token (ScheduledRequest::pool) with
// the executor's vector, free their blocks at once, take no prefix-cache hit when the pooling
// reads early rows (mean, cls), and may fill max_model_len.
#include <gtest/gtest.h>

#include "sched_harness.h"

namespace arbor::sched {
namespace {

using testing::Harness;
using testing::iota_prompt;
using testing::kopts;
using Table = std::vector<std::string>;

SchedulerOptions sopts(int32_t budget, int64_t max_model_len = 0) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = 8;
  o.max_model_len = max_model_len;
  return o;
}

TEST(PoolingSchedTable, ChunkedBesideGenerationAndFreedAtOnce) {
  Harness h(sopts(8), kopts(64));
  h.pooling = step::PoolingType::kMean;
  ASSERT_TRUE(h.add("E", iota_prompt(20), 0).ok());
  h.pooling.reset();
  ASSERT_TRUE(h.add("G", iota_prompt(5, 40), 2).ok());
  h.pooling = step::PoolingType::kLast;
  ASSERT_TRUE(h.add("F", iota_prompt(3, 60), 0).ok());
  // E's prompt in chunks of the budget; G and F start in the step E's last chunk leaves room.
  EXPECT_EQ(h.run(), (Table{"E:8", "E:8", "E:4 G:4 done:E", "G:1 F:3 done:F", "G:1 done:G"}));
  EXPECT_EQ(h.pooled["E"], (std::vector<float>{20, 3, 22}));
  EXPECT_EQ(h.pooled["F"], (std::vector<float>{3, 60, 62}));
  EXPECT_FALSE(h.pooled.contains("G"));
  EXPECT_TRUE(h.tokens["E"].empty());
  EXPECT_EQ(h.kv.num_free_blocks(), 63);
}

// Every step's outputs: the pooling request's last one carries the vector and kMaxTokens, and
// its blocks are back in the pool in that same step.
TEST(PoolingSchedTable, LastChunkCarriesTheVectorAndTheStop) {
  Harness h(sopts(16), kopts(16));
  h.pooling = step::PoolingType::kCls;
  ASSERT_TRUE(h.add("E", iota_prompt(24), 0).ok());
  EXPECT_EQ(h.step(), "E:16");
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_TRUE(h.last_outputs[0].pooled.empty());
  EXPECT_FALSE(h.last_outputs[0].stop_reason.has_value());
  EXPECT_EQ(h.kv.num_free_blocks(), 15 - 4);
  EXPECT_EQ(h.step(), "E:8 done:E");
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].pooled, (std::vector<float>{24, 3, 26}));
  ASSERT_TRUE(h.last_outputs[0].stop_reason.has_value());
  EXPECT_EQ(h.last_outputs[0].stop_reason->kind, StopKind::kMaxTokens);
  EXPECT_EQ(h.kv.num_free_blocks(), 15);
}

// Mean and cls pooling read every row from the first, so a cached prefix is run again; last and
// rank pooling read the last row only and take the hit like a generation request.
TEST(PoolingSchedTable, EarlyRowPoolingTakesNoPrefixHit) {
  Harness h(sopts(64), kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(12), 1).ok());
  EXPECT_EQ(h.run(), (Table{"A:12 done:A"}));
  h.pooling = step::PoolingType::kMean;
  ASSERT_TRUE(h.add("M", iota_prompt(12), 0).ok());
  EXPECT_EQ(h.run(), (Table{"M:12 done:M"}));
  h.pooling = step::PoolingType::kCls;
  ASSERT_TRUE(h.add("C", iota_prompt(12), 0).ok());
  EXPECT_EQ(h.run(), (Table{"C:12 done:C"}));
  h.pooling = step::PoolingType::kLast;
  ASSERT_TRUE(h.add("L", iota_prompt(12), 0).ok());
  EXPECT_EQ(h.run(), (Table{"L:4 done:L"}));
  h.pooling = step::PoolingType::kRank;
  ASSERT_TRUE(h.add("R", iota_prompt(12), 0).ok());
  EXPECT_EQ(h.run(), (Table{"R:4 done:R"}));
  for (const char* name : {"M", "C", "L", "R"}) {
    EXPECT_EQ(h.pooled[name], (std::vector<float>{12, 3, 14})) << name;
  }
}

// A pooling request generates nothing, so its input may have max_model_len tokens (a generation
// prompt must leave room for one token); one more is refused, naming both numbers. A pooling
// request that asks to generate, or for n > 1, is refused.
TEST(PoolingSchedTable, LengthRuleAndRestrictions) {
  Harness h(sopts(64, /*max_model_len=*/8), kopts(64));
  EXPECT_FALSE(h.add("G", iota_prompt(8), 1).ok());
  h.pooling = step::PoolingType::kLast;
  EXPECT_TRUE(h.add("E", iota_prompt(8), 0).ok());
  const Status too_long = h.add("F", iota_prompt(9), 0);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.message(), "input has 9 tokens, max_model_len is 8");
  EXPECT_EQ(h.run(), (Table{"E:8 done:E"}));
  RequestSpec spec;
  spec.request_id = 9;
  spec.prompt_token_ids = {3, 4};
  spec.pooling = step::PoolingType::kMean;
  spec.stop.max_tokens = 1;
  EXPECT_NE(validate_request_spec(spec, 100).message().find("generates nothing"),
            std::string::npos);
  spec.stop.max_tokens = 0;
  EXPECT_TRUE(validate_request_spec(spec, 100).ok());
  spec.sampling.prompt_logprobs = 1;
  EXPECT_FALSE(validate_request_spec(spec, 100).ok());
}

// A mean-pooling request preempted mid-prompt recomputes from its first token (the executor
// forgets its partial sums with it) and still returns its vector; nothing leaks.
TEST(PoolingSchedTable, PreemptedMidPromptRecomputesFromTheStart) {
  Harness h(sopts(8), kopts(9));  // 8 usable blocks of 4
  ASSERT_TRUE(h.add("G", iota_prompt(12), 20).ok());
  h.pooling = step::PoolingType::kMean;
  ASSERT_TRUE(h.add("E", iota_prompt(24, 50), 0).ok());
  const Table t = h.run();
  bool preempted = false;
  for (const std::string& row : t) preempted |= row.find("preempt:E") != std::string::npos;
  EXPECT_TRUE(preempted) << ::testing::PrintToString(t);
  EXPECT_EQ(h.pooled["E"], (std::vector<float>{24, 50, 73}));
  EXPECT_GT(h.tokens_run["E"], 24);
  EXPECT_EQ(h.kv.num_free_blocks(), 8);
}

}  // namespace
}  // namespace arbor::sched
