// KV bookkeeping microbenchmarks. Targets: <= 2 us per block for allocate + free of a 1k-token
// request and for a 2k-token prefix hit; a decode step over 1k running requests well under 1 ms.
//
//   ninja -C build-kv kv_bench && build-kv/bench/kv/kv_bench --benchmark_repetitions=5
//
// cpu_ns_per_block / wall_ns_per_block: thread CPU / wall time of the timed loop per block.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace arbor::kv {
namespace {

constexpr int32_t kBlockSize = 16;

// Per-block cost of the timed loop, from this thread's CPU time (robust on a shared, loaded
// machine) and from wall time. Plain numbers in nanoseconds.
class BlockTimer {
 public:
  BlockTimer() : cpu_start_(cpu_ns()), wall_start_(std::chrono::steady_clock::now()) {}
  void report(benchmark::State& state, int64_t blocks_per_iteration) const {
    const double blocks = static_cast<double>(state.iterations()) *
                          static_cast<double>(blocks_per_iteration);
    const double wall = std::chrono::duration<double, std::nano>(
                            std::chrono::steady_clock::now() - wall_start_).count();
    state.counters["cpu_ns_per_block"] = (cpu_ns() - cpu_start_) / blocks;
    state.counters["wall_ns_per_block"] = wall / blocks;
  }

 private:
  static double cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  }
  double cpu_start_;
  std::chrono::steady_clock::time_point wall_start_;
};

std::vector<int32_t> random_tokens(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(0, 32000);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = tok(rng);
  return t;
}

// Admission of a 1k-token prompt without a prefix hit, then free. With arg 1 the prompt's 64
// blocks are also hashed and cached (distinct prompts each time, so the pool fills with cached
// free blocks and allocation evicts them, as in steady state).
void BM_AllocateFree1kTokens(benchmark::State& state) {
  const bool cache = state.range(0) != 0;
  KvCacheManager kv(KvCacheManagerOptions{.num_blocks = 4096, .block_size = kBlockSize});
  std::mt19937 rng(1);
  std::vector<int32_t> tokens = random_tokens(1025, rng);
  int32_t iteration = 0;
  const BlockTimer timer;
  for (auto _ : state) {
    tokens[0] = iteration++;
    const KvRequest view{.request_id = 1, .token_ids = tokens, .num_computed_tokens = 0};
    auto slots = kv.allocate_slots(view, 1024);
    benchmark::DoNotOptimize(slots);
    if (cache) {
      kv.cache_full_blocks(KvRequest{.request_id = 1, .token_ids = tokens,
                                     .num_computed_tokens = 1024});
    }
    kv.free(1);
  }
  timer.report(state, 1024 / kBlockSize);
  state.counters["evictions"] = static_cast<double>(kv.stats().num_evictions);
}
BENCHMARK(BM_AllocateFree1kTokens)->Arg(0)->Arg(1);

// A new request whose first 2048 tokens are cached (in the free queue): get_computed_blocks
// (128 hashes + lookups), allocate_slots reviving the 128 blocks plus one new block, free.
void BM_PrefixHit2kTokens(benchmark::State& state) {
  KvCacheManager kv(KvCacheManagerOptions{.num_blocks = 4096, .block_size = kBlockSize});
  std::mt19937 rng(2);
  const std::vector<int32_t> tokens = random_tokens(2049, rng);
  const KvRequest warm{.request_id = 1, .token_ids = tokens, .num_computed_tokens = 2048};
  if (!kv.allocate_slots(KvRequest{.request_id = 1, .token_ids = tokens}, 2049)) {
    state.SkipWithError("warm-up allocation failed");
    return;
  }
  kv.cache_full_blocks(warm);
  kv.free(1);
  int64_t hit_blocks = 0;
  const BlockTimer timer;
  for (auto _ : state) {
    const KvRequest view{.request_id = 2, .token_ids = tokens};
    const ComputedBlocks hit = kv.get_computed_blocks(view);
    hit_blocks = hit.num_blocks();
    auto slots = kv.allocate_slots(view, 1, hit);
    benchmark::DoNotOptimize(slots);
    kv.free(2);
  }
  if (hit_blocks != 2048 / kBlockSize) state.SkipWithError("expected a 128-block hit");
  timer.report(state, 2048 / kBlockSize);
  state.counters["hit_blocks"] = static_cast<double>(hit_blocks);
}
BENCHMARK(BM_PrefixHit2kTokens);

struct LiveRequest {
  KvRequestId id = 0;
  std::vector<int32_t> tokens;
  int64_t computed = 0;
  size_t max_tokens = 0;
  KvRequest view() const {
    return KvRequest{.request_id = id, .token_ids = tokens, .num_computed_tokens = computed};
  }
};

// The KV side of schedule() over 1000 running requests: each step allocates one decode slot for
// every request (caching blocks as they fill); requests finish after 64..512 outputs and are
// replaced by new ones that share a 256-token system prompt (prefix hit + prompt allocation).
class ScheduleSim {
 public:
  ScheduleSim()
      : kv_(KvCacheManagerOptions{.num_blocks = 160000, .block_size = kBlockSize}), rng_(3) {
    system_prompt_ = random_tokens(256, rng_);
    for (int i = 0; i < 1000; ++i) admit();
  }
  void step() {
    for (LiveRequest& r : live_) {
      if (!kv_.allocate_slots(r.view(), 1)) std::abort();  // sized so it never preempts
      r.computed += 1;
      r.tokens.push_back(static_cast<int32_t>(rng_() % 32000));
    }
    for (size_t i = 0; i < live_.size(); ++i) {
      if (live_[i].tokens.size() < live_[i].max_tokens) continue;
      kv_.cache_full_blocks(live_[i].view());
      kv_.free(live_[i].id);
      live_[i] = live_.back();
      live_.pop_back();
      admit();
      ++finished_;
    }
  }
  int64_t finished() const { return finished_; }
  const KvCacheManager& kv() const { return kv_; }

 private:
  void admit() {
    LiveRequest r;
    r.id = next_id_++;
    r.tokens = system_prompt_;
    const std::vector<int32_t> user = random_tokens(64 + rng_() % 704, rng_);
    r.tokens.insert(r.tokens.end(), user.begin(), user.end());
    r.max_tokens = r.tokens.size() + 64 + rng_() % 449;
    const ComputedBlocks hit = kv_.get_computed_blocks(r.view());
    const auto n = static_cast<int64_t>(r.tokens.size()) - hit.num_computed_tokens;
    if (!kv_.allocate_slots(r.view(), n, hit)) std::abort();
    r.computed = static_cast<int64_t>(r.tokens.size());
    r.tokens.push_back(static_cast<int32_t>(rng_() % 32000));
    live_.push_back(std::move(r));
  }

  KvCacheManager kv_;
  std::mt19937 rng_;
  std::vector<int32_t> system_prompt_;
  std::vector<LiveRequest> live_;
  KvRequestId next_id_ = 1;
  int64_t finished_ = 0;
};

void BM_ScheduleStep1kRequests(benchmark::State& state) {
  ScheduleSim sim;
  for (int i = 0; i < 200; ++i) sim.step();  // reach a steady mix of request ages
  const int64_t finished_before = sim.finished();
  for (auto _ : state) sim.step();
  state.counters["finished_per_step"] =
      static_cast<double>(sim.finished() - finished_before) / static_cast<double>(state.iterations());
  state.counters["usage"] = sim.kv().usage();
  state.counters["hit_rate"] = sim.kv().stats().prefix_hit_rate;
}
BENCHMARK(BM_ScheduleStep1kRequests)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace arbor::kv

BENCHMARK_MAIN();
