// Iteration tables: which requests run with how many tokens at each step.
#include <gtest/gtest.h>

#include <tuple>

#include "sched_harness.h"

namespace arbor::sched {
namespace {

using testing::Harness;
using testing::iota_prompt;
using testing::kopts;
using Table = std::vector<std::string>;

SchedulerOptions sopts(int32_t budget, int32_t max_seqs = 8, int32_t chunk_cap = 0) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = max_seqs;
  o.long_prefill_token_threshold = chunk_cap;
  return o;
}

TEST(SchedulerTable, ChunkedPrefillFillsTheBudgetRunningFirst) {
  Harness h(sopts(32), kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(50), 3).ok());
  ASSERT_TRUE(h.add("B", iota_prompt(10, 40), 2).ok());
  // Step 0: A's first chunk takes the whole budget, B waits. Step 1: A's last 18 prompt
  // tokens, B's whole prompt in the remaining 14. Then one decode token each.
  EXPECT_EQ(h.run(), (Table{"A:32", "A:18 B:10", "A:1 B:1 done:B", "A:1 done:A"}));
  EXPECT_EQ(h.kv.num_free_blocks(), 63);
}

TEST(SchedulerTable, LongPrefillThresholdCapsEachChunk) {
  Harness h(sopts(16, 8, /*chunk_cap=*/8), kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(20), 2).ok());
  ASSERT_TRUE(h.add("B", iota_prompt(5, 40), 2).ok());
  ASSERT_TRUE(h.add("C", iota_prompt(3, 60), 1).ok());
  EXPECT_EQ(h.run(), (Table{"A:8 B:5 C:3 done:C", "A:8 B:1 done:B", "A:4", "A:1 done:A"}));
}

TEST(SchedulerTable, PrefixHitSkipsCachedBlocks) {
  Harness h(sopts(64), kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(12), 2).ok());
  EXPECT_EQ(h.run(), (Table{"A:12", "A:1 done:A"}));
  // B extends A's prompt: A's 3 full prompt blocks (12 tokens) hit, 3 tokens remain.
  std::vector<int32_t> longer = iota_prompt(12);
  longer.insert(longer.end(), {70, 71, 72});
  ASSERT_TRUE(h.add("B", longer, 1).ok());
  EXPECT_EQ(h.run(), (Table{"B:3 done:B"}));
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].num_cached_tokens, 12);
  // C equals A's prompt: one token must stay to compute, so only 2 blocks (8 tokens) hit.
  ASSERT_TRUE(h.add("C", iota_prompt(12), 1).ok());
  EXPECT_EQ(h.run(), (Table{"C:4 done:C"}));
  EXPECT_EQ(h.tokens["C"][0], h.tokens["A"][0]);
}

// B waits behind A for six steps (its blocks do not fit while A runs) and is asked for its
// prefix hit every step; the prefix-cache counters count each request once, at admission.
TEST(SchedulerTable, BlockedWaitingRequestCountsOnePrefixQuery) {
  Harness h(sopts(64), kopts(8));  // 7 usable blocks of 4 tokens
  ASSERT_TRUE(h.add("A", iota_prompt(12), 6).ok());
  // B: A's first 8 tokens (2 blocks, cached after A's first step) + 19 others = 7 blocks, 5 of
  // them new: fewer are free while A runs.
  std::vector<int32_t> b = iota_prompt(8);
  const std::vector<int32_t> tail = iota_prompt(19, 50);
  b.insert(b.end(), tail.begin(), tail.end());
  ASSERT_TRUE(h.add("B", b, 1).ok());
  EXPECT_EQ(h.run(),
            (Table{"A:12", "A:1", "A:1", "A:1", "A:1", "A:1 done:A", "B:19 done:B"}));
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].num_cached_tokens, 8);
  // (queries, hits, query tokens, hit tokens): A (12 tokens, no hit) and B (27, 8 hit), once.
  const kv::KvCacheStats s = h.kv.stats();
  EXPECT_EQ(std::tuple(s.num_queries, s.num_hits, s.num_query_tokens, s.num_hit_tokens),
            std::tuple(2, 1, 12 + 27, 8));
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 8.0 / 39.0);
}

TEST(SchedulerTable, PreemptsMostRecentlyAdmittedAndRecomputes) {
  // 6 usable blocks of 4 tokens; three requests of 4 + 10 tokens need 4 blocks each.
  Harness h(sopts(64), kopts(7));
  ASSERT_TRUE(h.add("A", iota_prompt(4, 3), 10).ok());
  ASSERT_TRUE(h.add("B", iota_prompt(4, 20), 10).ok());
  ASSERT_TRUE(h.add("C", iota_prompt(4, 40), 10).ok());
  const Table expected{
      "A:4 B:4 C:4", "A:1 B:1 C:1", "A:1 B:1 C:1", "A:1 B:1 C:1", "A:1 B:1 C:1",
      // A and B need a third block: C (admitted last) goes, and nobody is admitted that step.
      "A:1 B:1 preempt:C", "A:1 B:1", "A:1 B:1", "A:1 B:1",
      // A needs a fourth block: B (now the last admitted) goes and A takes B's freed tail
      // block (evicting its hash).
      "A:1 preempt:B done:A",
      // B resumes from its 2 surviving cached blocks (8 of 13 tokens); C needs 3 blocks for its
      // prompt + 5 outputs but only 2 are free, so it waits one more step.
      "B:5 done:B", "C:9", "C:1", "C:1", "C:1", "C:1 done:C"};
  EXPECT_EQ(h.run(), expected);
  EXPECT_EQ(h.sched.stats().num_preemptions, 2);
  EXPECT_EQ(h.kv.num_free_blocks(), 6);
}

TEST(SchedulerTable, PriorityPolicyPreemptsLowestPriorityFirst) {
  SchedulerOptions o = sopts(64);
  o.policy = SchedulingPolicy::kPriority;
  Harness h(o, kopts(7));
  ASSERT_TRUE(h.add("A", iota_prompt(4, 3), 12, /*priority=*/1).ok());
  EXPECT_EQ(h.step(), "A:4");
  ASSERT_TRUE(h.add("B", iota_prompt(4, 20), 12, /*priority=*/0).ok());
  Table rows;
  for (int i = 0; i < 9; ++i) rows.push_back(h.step());
  // B (priority 0) runs before A once admitted; when blocks run out, A (admitted first but
  // priority 1) is the victim.
  EXPECT_EQ(rows, (Table{"A:1 B:4", "B:1 A:1", "B:1 A:1", "B:1 A:1", "B:1 A:1", "B:1 A:1",
                         "B:1 A:1", "B:1 A:1", "B:1 preempt:A"}));
}

// Priority policy, 6 usable blocks of 4 tokens: A (priority 1), B and C (priority 2, C arrived
// last) have 6-token prompts and 3 outputs, so each holds exactly 2 blocks to the end and the
// pool is full after step 0. H arrives after step 0.
SchedulerOptions with_policy(SchedulerOptions o, SchedulingPolicy policy) {
  o.policy = policy;
  return o;
}

struct PriorityCase {
  explicit PriorityCase(SchedulingPolicy policy, const SchedulerOptions& o = sopts(64),
                        const kv::KvCacheManagerOptions& k = kopts(7))
      : h(with_policy(o, policy), k) {
    EXPECT_TRUE(h.add("A", iota_prompt(6, 3), 3, /*priority=*/1).ok());
    EXPECT_TRUE(h.add("B", iota_prompt(6, 20), 3, /*priority=*/2).ok());
    EXPECT_TRUE(h.add("C", iota_prompt(6, 40), 3, /*priority=*/2).ok());
  }
  // Every request's tokens equal those it generates alone.
  void expect_solo_outputs(const std::map<std::string, std::pair<std::vector<int32_t>, int32_t>>&
                               requests) {
    for (const auto& [name, r] : requests) {
      EXPECT_EQ(h.tokens[name], testing::alone_tokens(r.first, r.second)) << name;
    }
  }
  Harness h;
};

TEST(SchedulerTable, WaitingHigherPriorityPreemptsLowestPriorityLatestArrival) {
  PriorityCase c(SchedulingPolicy::kPriority);
  EXPECT_EQ(c.h.step(), "A:6 B:6 C:6");
  ASSERT_TRUE(c.h.add("H", iota_prompt(4, 60), 2, /*priority=*/0).ok());
  // H needs 1 block, none is free: C (priority 2, arrived after B) is preempted and taken out of
  // this step, and H runs at once. A and B are left alone: one victim suffices.
  EXPECT_EQ(c.h.step(), "A:1 B:1 H:4 preempt:C");
  EXPECT_EQ(c.h.sched.stats().num_priority_preemptions, 1);
  EXPECT_EQ(c.h.run(), (Table{"H:1 A:1 B:1 done:H done:A done:B",
                              // C recomputes its prompt + 1 output (its blocks were reused).
                              "C:7", "C:1 done:C"}));
  EXPECT_EQ(c.h.sched.stats().num_preemptions, 1);
  EXPECT_EQ(c.h.kv.num_free_blocks(), 6);
  c.expect_solo_outputs({{"A", {iota_prompt(6, 3), 3}},
                         {"B", {iota_prompt(6, 20), 3}},
                         {"C", {iota_prompt(6, 40), 3}},
                         {"H", {iota_prompt(4, 60), 2}}});
}

TEST(SchedulerTable, FcfsAndEqualPriorityNeverPreemptForWaiting) {
  // The same arrivals under FCFS, and under priority with H's priority equal to B's and C's:
  // H waits until blocks free up.
  const Table expected{"A:1 B:1 C:1", "A:1 B:1 C:1 done:A done:B done:C", "H:4", "H:1 done:H"};
  for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    PriorityCase c(policy);
    EXPECT_EQ(c.h.step(), "A:6 B:6 C:6");
    ASSERT_TRUE(c.h.add("H", iota_prompt(4, 60), 2, /*priority=*/2).ok());
    EXPECT_EQ(c.h.run(), expected);
    EXPECT_EQ(c.h.sched.stats().num_preemptions, 0);
  }
}

TEST(SchedulerTable, PriorityPreemptsAsManyAsNeededLatestFirst) {
  PriorityCase c(SchedulingPolicy::kPriority);
  EXPECT_EQ(c.h.step(), "A:6 B:6 C:6");
  // H needs 3 blocks: C's 2 do not suffice, C's and B's 4 do; A keeps running.
  ASSERT_TRUE(c.h.add("H", iota_prompt(12, 60), 1, /*priority=*/0).ok());
  EXPECT_EQ(c.h.step(), "A:1 H:12 preempt:C preempt:B done:H");
  c.h.run();
  EXPECT_EQ(c.h.sched.stats().num_preemptions, 2);
  c.expect_solo_outputs({{"A", {iota_prompt(6, 3), 3}},
                         {"B", {iota_prompt(6, 20), 3}},
                         {"C", {iota_prompt(6, 40), 3}},
                         {"H", {iota_prompt(12, 60), 1}}});
}

TEST(SchedulerTable, PriorityDoesNotPreemptWhenVictimsCannotMakeRoom) {
  PriorityCase c(SchedulingPolicy::kPriority);
  EXPECT_EQ(c.h.step(), "A:6 B:6 C:6");
  // H (priority 1) needs 5 blocks; only B and C (4 blocks) have a lower priority, and A's equal
  // priority protects it: nobody is preempted in vain.
  ASSERT_TRUE(c.h.add("H", iota_prompt(17, 60), 1, /*priority=*/1).ok());
  EXPECT_EQ(c.h.run(), (Table{"A:1 B:1 C:1", "A:1 B:1 C:1 done:A done:B done:C", "H:17 done:H"}));
  EXPECT_EQ(c.h.sched.stats().num_preemptions, 0);
}

TEST(SchedulerTable, PriorityPreemptsForMaxNumSeqs) {
  SchedulerOptions o = sopts(64, /*max_seqs=*/2);
  o.policy = SchedulingPolicy::kPriority;
  Harness h(o, kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(4, 3), 3, /*priority=*/1).ok());
  ASSERT_TRUE(h.add("B", iota_prompt(4, 20), 3, /*priority=*/2).ok());
  EXPECT_EQ(h.step(), "A:4 B:4");
  ASSERT_TRUE(h.add("H", iota_prompt(4, 40), 2, /*priority=*/0).ok());
  // Blocks are plenty but both sequence slots are taken: B (the lowest priority) goes.
  EXPECT_EQ(h.step(), "A:1 H:4 preempt:B");
  // B resumes from its cached prompt block: 4 of its 5 tokens hit.
  EXPECT_EQ(h.run(), (Table{"H:1 A:1 done:H done:A", "B:1", "B:1 done:B"}));
  EXPECT_EQ(h.tokens["B"], testing::alone_tokens(iota_prompt(4, 20), 3));
  EXPECT_EQ(h.tokens["H"], testing::alone_tokens(iota_prompt(4, 40), 2));
}

TEST(SchedulerTable, RequestPreemptedForPriorityIsNotReadmittedInTheSameStep) {
  // Chunks of at most 4 tokens and no prefix caching: after H takes one of C's two freed
  // blocks, C's next 4-token chunk would fit in the other. It must wait for the next step.
  SchedulerOptions o = sopts(64, 8, /*chunk_cap=*/4);
  kv::KvCacheManagerOptions k = kopts(7);
  k.enable_prefix_caching = false;
  PriorityCase c(SchedulingPolicy::kPriority, o, k);
  EXPECT_EQ(c.h.step(), "A:4 B:4 C:4");
  EXPECT_EQ(c.h.step(), "A:2 B:2 C:2");
  ASSERT_TRUE(c.h.add("H", iota_prompt(4, 60), 1, /*priority=*/0).ok());
  EXPECT_EQ(c.h.step(), "A:1 B:1 H:4 preempt:C done:H");
  EXPECT_EQ(c.h.run(), (Table{"A:1 B:1 C:4 done:A done:B", "C:3", "C:1 done:C"}));
  c.expect_solo_outputs({{"A", {iota_prompt(6, 3), 3}},
                         {"B", {iota_prompt(6, 20), 3}},
                         {"C", {iota_prompt(6, 40), 3}},
                         {"H", {iota_prompt(4, 60), 1}}});
}

TEST(SchedulerTable, MaxModelLenFinishesWithLengthAtExactlyTheLimit) {
  SchedulerOptions o = sopts(64);
  o.max_model_len = 10;
  Harness h(o, kopts(64));
  ASSERT_TRUE(h.add("A", iota_prompt(4), 50).ok());      // max_tokens allows far more
  ASSERT_TRUE(h.add("B", iota_prompt(4, 40), 3).ok());   // max_tokens comes first
  // 4 prompt + 6 generated = max_model_len; the 10th token is sampled, never run.
  EXPECT_EQ(h.run(), (Table{"A:4 B:4", "A:1 B:1", "A:1 B:1 done:B", "A:1", "A:1", "A:1 done:A"}));
  EXPECT_EQ(h.tokens["A"], testing::alone_tokens(iota_prompt(4), 6));
  EXPECT_EQ(h.tokens["B"].size(), 3u);
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].stop_reason, StopReason{.kind = StopKind::kMaxModelLen});
  // K/V written for 9 positions, in 3 blocks of 4: nothing at or past max_model_len.
  EXPECT_EQ(h.tokens_run["A"], 9);
  EXPECT_EQ(h.max_blocks["A"], 3);
  EXPECT_EQ(h.kv.num_free_blocks(), 63);
}

TEST(SchedulerTable, PromptOfMaxModelLenIsRejectedAndHoldsNoBlock) {
  SchedulerOptions o = sopts(64);
  o.max_model_len = 10;
  Harness h(o, kopts(64));
  const Status s = h.add("X", iota_prompt(10), 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("prompt has 10 tokens, max_model_len is 10"), std::string::npos)
      << s.message();
  EXPECT_FALSE(h.sched.has_unfinished_requests());
  EXPECT_EQ(h.kv.num_requests(), 0);
  EXPECT_EQ(h.kv.num_free_blocks(), 63);
  // One token shorter: admitted, generates exactly one token.
  ASSERT_TRUE(h.add("Y", iota_prompt(9), 5).ok());
  EXPECT_EQ(h.run(), (Table{"Y:9 done:Y"}));
  EXPECT_EQ(h.last_outputs[0].stop_reason, StopReason{.kind = StopKind::kMaxModelLen});
  EXPECT_EQ(h.kv.num_free_blocks(), 63);
}

TEST(SchedulerTable, AdmissionLimits) {
  SchedulerOptions o = sopts(64, /*max_seqs=*/2);
  o.max_waiting_requests = 2;
  Harness h(o, kopts(9));  // 8 usable blocks = 32 tokens
  ASSERT_TRUE(h.add("A", iota_prompt(4), 3).ok());
  ASSERT_TRUE(h.add("B", iota_prompt(4, 20), 3).ok());
  const Status full = h.add("C", iota_prompt(4, 40), 3);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.to_string();
  EXPECT_NE(full.message().find("waiting queue is full"), std::string::npos);
  const Status too_long = h.add("X", iota_prompt(20), 13);  // 33 tokens > 32 slots
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument) << too_long.to_string();
  EXPECT_EQ(h.step(), "A:4 B:4");
  ASSERT_TRUE(h.add("C", iota_prompt(4, 40), 3).ok());
  // max_num_seqs = 2: C waits until a slot frees.
  EXPECT_EQ(h.run(), (Table{"A:1 B:1", "A:1 B:1 done:A done:B", "C:4", "C:1", "C:1 done:C"}));
}

TEST(SchedulerTable, ForkSharesPromptBlocksAndCopiesTheTail) {
  Harness h(sopts(64), kopts(64));
  const int32_t free_at_start = h.kv.num_free_blocks();
  ASSERT_TRUE(h.add("P", iota_prompt(10), 2, 0, /*best_of=*/3).ok());
  // The parent computes 9 of 10 prompt tokens, then forks into P0..P2.
  EXPECT_EQ(h.step(), "P:9");
  const RequestId p = h.id("P");
  std::vector<std::span<const kv::BlockId>> tables;
  for (int i = 0; i < 3; ++i) tables.push_back(h.kv.block_ids(child_request_id(p, i)));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tables[i].size(), 3u);
    EXPECT_EQ(tables[i][0], tables[0][0]);
    EXPECT_EQ(tables[i][1], tables[0][1]);
  }
  EXPECT_NE(tables[0][2], tables[1][2]);
  EXPECT_NE(tables[1][2], tables[2][2]);
  EXPECT_FALSE(h.kv.has_request(p));
  const std::string copies = "copy:3>" + std::to_string(tables[0][2]) + " copy:3>" +
                             std::to_string(tables[1][2]) + " copy:3>" +
                             std::to_string(tables[2][2]) + " ";
  EXPECT_EQ(h.step(), copies + "P.0:1 P.1:1 P.2:1");
  EXPECT_EQ(h.run(), (Table{"P.0:1 P.1:1 P.2:1 done:P.0 done:P.1 done:P.2"}));
  EXPECT_EQ(h.tokens["P.0"], h.tokens["P.1"]);  // greedy fake: same tokens
  EXPECT_EQ(h.kv.num_free_blocks(), free_at_start);
}

TEST(SchedulerTable, AbortMidGenerationReturnsEveryBlock) {
  Harness h(sopts(16), kopts(32));
  const int32_t free_at_start = h.kv.num_free_blocks();
  ASSERT_TRUE(h.add("P", iota_prompt(30), 20, 0, /*best_of=*/4).ok());
  ASSERT_TRUE(h.add("Q", iota_prompt(7, 50), 20).ok());
  for (int i = 0; i < 4; ++i) h.step();
  EXPECT_GT(h.kv.stats().num_used_blocks, 0);
  const std::vector<RequestId> ids = h.sched.finish_request(h.id("P"), StopReason{.kind = StopKind::kAbort});
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(h.sched.finish_request(h.id("Q"), StopReason{.kind = StopKind::kAbort}).size(), 1u);
  EXPECT_FALSE(h.sched.has_unfinished_requests());
  EXPECT_EQ(h.kv.num_free_blocks(), free_at_start);
  EXPECT_EQ(h.kv.stats().num_used_blocks, 0);
  EXPECT_TRUE(h.sched.finish_request(h.id("P"), StopReason{.kind = StopKind::kAbort}).empty());
}

TEST(SchedulerTable, StopTokenAndEos) {
  Harness h(sopts(64), kopts(64));
  RequestSpec spec;
  spec.request_id = 7;
  spec.prompt_token_ids = iota_prompt(5);
  spec.stop.max_tokens = 50;
  spec.sampling.temperature = 0;
  const int32_t first = testing::fake_next_token(spec.prompt_token_ids);
  spec.stop.eos_token_ids = {first};
  spec.stop.ignore_eos = true;  // EOS ignored ...
  std::vector<int32_t> with_first = spec.prompt_token_ids;
  with_first.push_back(first);
  spec.stop.stop_token_ids = {testing::fake_next_token(with_first)};  // ... the stop id is not
  ASSERT_TRUE(h.sched.add_request(make_request(spec)).ok());
  h.run();
  ASSERT_EQ(h.last_outputs.size(), 1u);
  EXPECT_EQ(h.last_outputs[0].stop_reason,
            (StopReason{.kind = StopKind::kStopToken, .token_id = spec.stop.stop_token_ids[0]}));
  EXPECT_EQ(h.tokens["?"].size(), 2u);
}

// max_num_seqs counts a running fork parent as the children it will fork into: two parents of
// best_of 2 fill 4 sequences, so a third waits (before, each parent counted as one, and three
// parents forked into 6 > 4 running sequences: a recurrent model's executor ran out of slots).
TEST(SchedulerTable, ForkParentsCountAsTheirChildrenTowardMaxNumSeqs) {
  Harness h(sopts(64, /*max_seqs=*/4), kopts(64));
  ASSERT_TRUE(h.add("P", iota_prompt(6), 2, 0, /*best_of=*/2).ok());
  ASSERT_TRUE(h.add("Q", iota_prompt(6, 20), 2, 0, /*best_of=*/2).ok());
  ASSERT_TRUE(h.add("R", iota_prompt(6, 40), 2, 0, /*best_of=*/2).ok());
  EXPECT_EQ(h.step(), "P:5 Q:5");
  for (int i = 0; i < 12; ++i) {
    const std::string row = h.step();
    EXPECT_LE(h.sched.num_running_seqs(), 4) << row;
  }
  EXPECT_EQ(h.tokens["R.0"].size(), 2u);  // R ran once P's and Q's children finished
}

// The recurrent-state checkpoints' bookkeeping: slots handed out, registered under a hash,
// found, least recently used out first, a hash registered again replaces its checkpoint.
TEST(StateCheckpoints, LeastRecentlyUsedOutFirst) {
  StateCheckpoints c(2);
  const kv::BlockHash a{1, 1}, b{2, 2}, d{3, 3};
  const std::optional<int32_t> s0 = c.acquire(), s1 = c.acquire();
  ASSERT_TRUE(s0 && s1);
  EXPECT_NE(*s0, *s1);
  EXPECT_EQ(c.acquire(), std::nullopt);  // both being written
  c.register_slot(a, *s0);
  c.register_slot(b, *s1);
  EXPECT_EQ(c.size(), 2);
  EXPECT_EQ(c.find(a), s0);  // a is now the most recently used
  const std::optional<int32_t> s2 = c.acquire();
  EXPECT_EQ(s2, s1);  // b's slot: the least recently used
  EXPECT_FALSE(c.contains(b));
  c.register_slot(d, *s2);
  EXPECT_EQ(c.find(d), s1);
  // a registered again (a second save of the same prefix) replaces its old checkpoint.
  const std::optional<int32_t> s3 = c.acquire();
  ASSERT_TRUE(s3);
  EXPECT_EQ(s3, s0);  // a's slot was the least recently used
  c.register_slot(a, *s3);
  EXPECT_EQ(c.size(), 2);
  const std::optional<int32_t> s4 = c.acquire();
  c.release(*s4);  // a failed save gives its slot back unregistered
  EXPECT_EQ(c.size(), 1);
  c.clear();
  EXPECT_EQ(c.size(), 0);
  EXPECT_FALSE(c.contains(a));
  EXPECT_TRUE(c.acquire() && c.acquire());
}


}  // namespace
}  // namespace arbor::sched

namespace arbor::sched {
namespace {

// An executor fault (docs/shards.md): the step is scheduled but never happens; preempt_all()
// and reset_prefix_cache() drop every block and every hash, and the requests recompute from the
// front of the queue, in their order, into exactly the tokens they would have generated.
TEST(SchedulerTable, PreemptAllAfterAFaultRecomputesEveryRequest) {
  Harness h(sopts(64), kopts(40));
  const std::vector<int32_t> a = iota_prompt(9, 3), b = iota_prompt(6, 30), c = iota_prompt(5, 60);
  ASSERT_TRUE(h.add("A", a, 8).ok());
  ASSERT_TRUE(h.add("B", b, 8).ok());
  ASSERT_TRUE(h.add("C", c, 8).ok());
  EXPECT_EQ(h.step(), "A:9 B:6 C:5");
  EXPECT_EQ(h.step(), "A:1 B:1 C:1");
  EXPECT_EQ(h.step(), "A:1 B:1 C:1");
  const SchedulerOutput lost = h.sched.schedule();  // the step the dead shard never answered
  ASSERT_EQ(lost.requests.size(), 3u);
  EXPECT_GT(h.kv.block_pool().num_cached_blocks(), 0);
  EXPECT_EQ(h.sched.preempt_all(), 3);
  // Computed and committed full blocks of 4: A 11 tokens -> 2, B 8 -> 2, C 7 -> 1.
  EXPECT_EQ(h.kv.reset_prefix_cache(), 5);
  EXPECT_EQ(h.kv.block_pool().num_cached_blocks(), 0);
  EXPECT_EQ(h.kv.num_free_blocks(), 39);
  EXPECT_EQ(h.kv.block_pool().num_evictions(), 0);
  h.kv.check_invariants();
  h.model = testing::FakeModel{};  // the new incarnation knows nothing
  const SchedulerOutput again = h.sched.schedule();
  ASSERT_EQ(again.new_requests.size(), 3u);
  EXPECT_EQ(again.new_requests[0].request_id, h.id("A"));
  EXPECT_EQ(again.new_requests[0].token_ids.size(), 9u + 3u);  // prompt + 3 committed tokens
  EXPECT_EQ(again.requests[0].num_computed_tokens, 0) << "the prefix cache must be empty";
  EXPECT_EQ(again.requests[1].request_id, h.id("B"));
  EXPECT_EQ(again.requests[2].request_id, h.id("C"));
  Result<std::vector<RequestOutput>> outs = h.sched.update_from_output(again, h.model.execute(again));
  ASSERT_TRUE(outs.ok()) << outs.status().to_string();
  for (const RequestOutput& o : *outs) {
    for (const SampledToken& t : o.new_tokens) h.tokens[h.name(o.request_id)].push_back(t.token_id);
  }
  h.kv.calls.clear();  // the lost step's and this one's allocations, made outside h.step()
  h.run();
  EXPECT_EQ(h.tokens["A"], testing::alone_tokens(a, 8));
  EXPECT_EQ(h.tokens["B"], testing::alone_tokens(b, 8));
  EXPECT_EQ(h.tokens["C"], testing::alone_tokens(c, 8));
  EXPECT_EQ(h.kv.num_free_blocks(), 39);
}

}  // namespace
}  // namespace arbor::sched
