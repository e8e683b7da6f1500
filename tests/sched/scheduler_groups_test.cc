// Iteration tables with KV cache groups (sliding-window layers): the scheduler's "doesn't fit"
// logic, admission bound and preemption count every group, and a sliding group's released blocks
// make room. The fake executor's shadow K/V store checks every step that each request reads only
// its own tokens in every group's window.
#include <gtest/gtest.h>

#include "sched_harness.h"

namespace arbor::sched {
namespace {

using testing::Harness;
using testing::iota_prompt;
using Table = std::vector<std::string>;

SchedulerOptions sopts(int32_t budget, int32_t chunk_cap = 0) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = 8;
  o.long_prefill_token_threshold = chunk_cap;
  return o;
}

kv::KvCacheManagerOptions gopts(int32_t num_blocks, std::vector<int32_t> windows) {
  return {.num_blocks = num_blocks, .block_size = 4, .group_windows = std::move(windows)};
}

void watch_kv(Harness& h, const kv::KvCacheManagerOptions& o) {
  h.model.kv_windows = o.group_windows;
  h.model.kv_block_size = o.block_size;
}

Table repeat(const std::string& row, int n) { return Table(static_cast<size_t>(n), row); }

Table concat(std::initializer_list<Table> parts) {
  Table t;
  for (const Table& p : parts) t.insert(t.end(), p.begin(), p.end());
  return t;
}

// A (prompt 4, 28 outputs) and B (prompt 4, 20 outputs) over 16 usable blocks of 4 tokens, with
// two groups. Two full-attention groups need 2 blocks per 4 tokens of each request: at step 13
// both have computed 16 tokens (16 blocks used) and A's 17th position needs 2 more: B, admitted
// last, is preempted, and A's growth evicts B's cached blocks, so B recomputes its 16 computed
// tokens (one budget of 16) at step 28. With the second group sliding (window 4: a query reads
// its own position and the 3 before) that group holds at most 2 blocks per request: no
// preemption, and both finish in 28 steps.
Table run_pair(const std::vector<int32_t>& windows) {
  const kv::KvCacheManagerOptions o = gopts(17, windows);
  Harness h(sopts(16), o);
  watch_kv(h, o);
  EXPECT_TRUE(h.add("A", iota_prompt(4), 28).ok());
  EXPECT_TRUE(h.add("B", iota_prompt(4, 40), 20).ok());
  Table t = h.run();
  EXPECT_EQ(h.tokens["A"], testing::alone_tokens(iota_prompt(4), 28));
  EXPECT_EQ(h.tokens["B"], testing::alone_tokens(iota_prompt(4, 40), 20));
  EXPECT_EQ(h.kv.num_free_blocks(), 16);
  EXPECT_GT(h.model.kv_reads_checked, 500);
  return t;
}

TEST(SchedulerGroups, SlidingReleaseAvoidsPreemption) {
  EXPECT_EQ(run_pair({0, 0}),
            concat({{"A:4 B:4"}, repeat("A:1 B:1", 12), {"A:1 preempt:B"}, repeat("A:1", 13),
                    {"A:1 done:A", "B:16"}, repeat("B:1", 6), {"B:1 done:B"}}));
  EXPECT_EQ(run_pair({0, 4}), concat({{"A:4 B:4"}, repeat("A:1 B:1", 18), {"A:1 B:1 done:B"},
                                      repeat("A:1", 7), {"A:1 done:A"}}));
}

// 40 tokens (prompt 4 + 36 outputs) in 16 usable blocks of 4: two full groups would need 20
// blocks at once; a full group (10) and a sliding group of window 4 (at most 6 blocks: a step of
// up to 16 tokens reads from 3 positions back) fit exactly, and the request runs alone to its
// end.
TEST(SchedulerGroups, AdmissionCountsEveryGroup) {
  {
    Harness h(sopts(16), gopts(17, {0, 0}));
    const Status st = h.add("A", iota_prompt(4), 36);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("needs up to 40 tokens (20 KV blocks over 2 KV cache groups), "
                                "the KV pool has 16 blocks of 4 tokens"),
              std::string::npos)
        << st.message();
  }
  const kv::KvCacheManagerOptions o = gopts(17, {0, 4});
  Harness h(sopts(16), o);
  watch_kv(h, o);
  ASSERT_TRUE(h.add("A", iota_prompt(4), 36).ok());
  EXPECT_EQ(h.run(), concat({{"A:4"}, repeat("A:1", 34), {"A:1 done:A"}}));
  EXPECT_EQ(h.tokens["A"], testing::alone_tokens(iota_prompt(4), 36));
  EXPECT_EQ(h.kv.stats().group_released_blocks, (std::vector<int64_t>{0, 9}));
}

// A prefix hit must be served by every group: a sliding group of window 4 needs only the block
// before the hit (its other blocks were released while A ran, cached).
TEST(SchedulerGroups, PrefixHitWithASlidingGroup) {
  const kv::KvCacheManagerOptions o = gopts(33, {0, 4});
  Harness h(sopts(64), o);
  watch_kv(h, o);
  ASSERT_TRUE(h.add("A", iota_prompt(20), 2).ok());
  EXPECT_EQ(h.run(), (Table{"A:20", "A:1 done:A"}));
  std::vector<int32_t> longer = iota_prompt(20);
  longer.insert(longer.end(), {70, 71, 72});
  ASSERT_TRUE(h.add("B", longer, 1).ok());
  EXPECT_EQ(h.run(), (Table{"B:3 done:B"}));
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].num_cached_tokens, 20);
}

// n > 1: the parent computes 9 of its 10 prompt tokens in 3 blocks per group (the sliding
// group's first already released: its window at position 9 starts at 6), and each child gets
// the shared blocks and a copy of the partial tail in each group: 3 > 7 and 6 > 8, 3 > 9 and
// 6 > 10.
TEST(SchedulerGroups, ForkCopiesTheTailOfEveryGroup) {
  const kv::KvCacheManagerOptions o = gopts(17, {0, 4});
  Harness h(sopts(16), o);
  watch_kv(h, o);
  ASSERT_TRUE(h.add("P", iota_prompt(10), 3, 0, 2).ok());
  EXPECT_EQ(h.run(), (Table{"P:9", "copy:3>7 copy:6>8 copy:3>9 copy:6>10 P.0:1 P.1:1",
                            "P.0:1 P.1:1", "P.0:1 P.1:1 done:P.0 done:P.1"}));
  EXPECT_EQ(h.tokens["P.0"], testing::alone_tokens(iota_prompt(10), 3));
  EXPECT_EQ(h.tokens["P.1"], h.tokens["P.0"]);
  EXPECT_EQ(h.kv.num_free_blocks(), 16);
}

}  // namespace
}  // namespace arbor::sched
