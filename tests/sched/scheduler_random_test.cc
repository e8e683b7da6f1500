// Seeded random runs: random arrivals, lengths, n, priorities, aborts, max_model_len and a small
// KV pool, speculation with drafts (chains and token trees) of varying quality. Invariants every
// step; every request that finishes by length produced exactly the tokens it produces alone
// (cut at max_model_len). Then the same with KV cache groups of sliding windows: the fake
// executor's shadow K/V store checks every step that each request reads only its own tokens in
// every group's window (released blocks are never read) while blocks are released.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "sched_harness.h"

namespace arbor::sched {
namespace {

struct Counts {
  int64_t preemptions = 0;
  int64_t priority_preemptions = 0;
  int64_t compared = 0;
  int64_t forks = 0;
  int64_t drafts = 0;
  int64_t accepted = 0;
  int64_t kv_reads = 0;
  int64_t released = 0;
};

// KV cache groups of a run: 0 one full-attention group; 1 full attention and two sliding groups
// of one window (Gemma 3's shape); 2 sliding layers only.
enum class Groups { kFull, kMixed, kSlidingOnly };

void run_seed(uint64_t seed, Counts& counts, Groups groups = Groups::kFull) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  SchedulerOptions so;
  so.max_num_seqs = uniform(1, 8);
  so.max_num_batched_tokens = uniform(4, 64);
  so.long_prefill_token_threshold = uniform(0, 1) ? 0 : uniform(1, 16);
  so.policy = uniform(0, 1) ? SchedulingPolicy::kFcfs : SchedulingPolicy::kPriority;
  so.max_model_len = uniform(0, 2) == 0 ? uniform(8, 40) : 0;
  so.max_spec_tokens = uniform(0, 1) ? 0 : uniform(1, 8);
  kv::KvCacheManagerOptions ko{.num_blocks = uniform(12, 40), .block_size = uniform(1, 8)};
  if (groups != Groups::kFull) {
    const int32_t w = uniform(1, 12);
    ko.group_windows = groups == Groups::kMixed ? std::vector<int32_t>{0, w, w}
                                                : std::vector<int32_t>{w};
    ko.num_blocks *= static_cast<int32_t>(ko.group_windows.size());
    so.max_tree_nodes = uniform(0, 1) ? 0 : uniform(2, 6);
  }
  // Half the seeds plan as for a draft model (lookahead slots, backoff, catch-up gates), from the
  // seed alone so that the random workload stays the same.
  so.reserve_draft_slots = so.max_spec_tokens > 0 && seed % 2 == 0;
  so.spec_cost.draft_cost = so.reserve_draft_slots ? 0.05 : 0.0;
  testing::Harness h(so, ko);
  h.model.draft_correct = uniform(-1, 4);
  if (groups != Groups::kFull) {
    h.model.kv_windows = ko.group_windows;
    h.model.kv_block_size = ko.block_size;
    h.model.trees = so.max_tree_nodes > 0;
  }
  const int32_t free_at_start = h.kv.num_free_blocks();
  std::map<std::string, std::vector<int32_t>> prompts;
  std::map<std::string, int32_t> max_tokens;
  for (int i = 0; i < 40; ++i) {
    const std::string name = "R" + std::to_string(i);
    std::vector<int32_t> prompt(uniform(1, 30));
    for (int32_t& t : prompt) t = uniform(3, 6);  // tiny vocabulary: lots of prefix sharing
    const int32_t mt = uniform(1, 12);
    const int32_t best_of = uniform(0, 4) == 0 ? uniform(2, std::min(3, so.max_num_seqs + 1)) : 1;
    const Status s = h.add(name, prompt, mt, uniform(0, 2), std::min(best_of, so.max_num_seqs));
    if (s.ok()) {
      prompts[name] = prompt;
      // max_model_len cuts generation short: prompt + outputs never exceed it.
      const auto len = static_cast<int32_t>(prompt.size());
      max_tokens[name] = so.max_model_len > 0 ? std::min<int32_t>(mt, so.max_model_len - len) : mt;
    }
    for (int k = uniform(0, 3); k > 0; --k) h.step();
    if (uniform(0, 9) == 0) h.sched.finish_request(h.id(name), StopReason{.kind = StopKind::kAbort});
  }
  h.run(100000);
  EXPECT_EQ(h.kv.max_calls, 1) << "one allocate_slots per request per step (Harness::step)";
  counts.drafts += h.num_draft_tokens;
  counts.accepted += h.num_accepted_tokens;
  counts.preemptions += h.sched.stats().num_preemptions;
  counts.priority_preemptions += h.sched.stats().num_priority_preemptions;
  counts.kv_reads += h.model.kv_reads_checked;
  for (int64_t r : h.kv.stats().group_released_blocks) counts.released += r;
  ASSERT_FALSE(h.sched.has_unfinished_requests());
  EXPECT_EQ(h.kv.num_free_blocks(), free_at_start);
  for (const auto& [name, toks] : h.tokens) {
    const std::string base = name.substr(0, name.find('.'));
    auto p = prompts.find(base);
    if (p == prompts.end()) continue;
    if (so.max_model_len > 0) {
      EXPECT_LE(static_cast<int64_t>(p->second.size() + toks.size()), so.max_model_len) << name;
    }
    if (static_cast<int32_t>(toks.size()) != max_tokens[base]) continue;  // aborted
    EXPECT_EQ(toks, testing::alone_tokens(p->second, max_tokens[base])) << name;
    ++counts.compared;
    if (name != base) ++counts.forks;
  }
}

TEST(SchedulerRandom, InvariantsAndBatchedEqualsAlone) {
  Counts counts;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    run_seed(seed, counts);
    if (::testing::Test::HasFailure()) break;
  }
  // The runs must exercise what they claim to check.
  EXPECT_GT(counts.preemptions, 100);
  EXPECT_GT(counts.priority_preemptions, 50);
  EXPECT_GT(counts.compared, 2000);
  // Speculation (drafts verified and accepted) ran under all of the above.
  EXPECT_GT(counts.drafts, 5000);
  EXPECT_GT(counts.accepted, 2000);
  EXPECT_LT(counts.accepted, counts.drafts);
  EXPECT_GT(counts.forks, 100);
  std::printf("preemptions %lld (for priority %lld), compared %lld, fork children %lld\n",
              static_cast<long long>(counts.preemptions),
              static_cast<long long>(counts.priority_preemptions),
              static_cast<long long>(counts.compared),
              static_cast<long long>(counts.forks));
}

TEST(SchedulerRandom, SlidingWindowGroupsReadOnlyTheirOwnKv) {
  for (Groups groups : {Groups::kMixed, Groups::kSlidingOnly}) {
    Counts counts;
    for (uint64_t seed = 1; seed <= 100; ++seed) {
      run_seed(seed, counts, groups);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_GT(counts.preemptions, 50);
    EXPECT_GT(counts.compared, 1000);
    EXPECT_GT(counts.drafts, 2000);
    EXPECT_GT(counts.forks, 50);
    EXPECT_GT(counts.released, 2000);
    EXPECT_GT(counts.kv_reads, 50000);
    std::printf("groups %d: preemptions %lld, compared %lld, fork children %lld, drafts %lld, "
                "released blocks %lld, K/V reads checked %lld\n",
                static_cast<int>(groups), static_cast<long long>(counts.preemptions),
                static_cast<long long>(counts.compared), static_cast<long long>(counts.forks),
                static_cast<long long>(counts.drafts), static_cast<long long>(counts.released),
                static_cast<long long>(counts.kv_reads));
  }
}

}  // namespace
}  // namespace arbor::sched
