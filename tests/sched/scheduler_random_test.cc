// Seeded random runs: random arrivals, lengths, n, priorities, aborts, max_model_len and a small
// KV pool, speculation with drafts of varying quality. Invariants every step; every request that finishes by length produced exactly the
// tokens it produces alone (cut at max_model_len).
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
};

void run_seed(uint64_t seed, Counts& counts) {
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
  testing::Harness h(so, ko);
  h.model.draft_correct = uniform(-1, 4);
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
  counts.drafts += h.num_draft_tokens;
  counts.accepted += h.num_accepted_tokens;
  counts.preemptions += h.sched.stats().num_preemptions;
  counts.priority_preemptions += h.sched.stats().num_priority_preemptions;
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

}  // namespace
}  // namespace arbor::sched
