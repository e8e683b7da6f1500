// Engine metrics: latency histograms and counters, published by the engine thread after every
// step as an immutable snapshot that any thread may read (EngineCore::metrics()).
//
// Histograms keep bucket counts (Prometheus-style cumulative buckets are derived by the
// exporter), a sum and a count — enough for rates, means and approximate quantiles.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "step/model_executor.h"

namespace arbor::engine {

class Histogram {
 public:
  Histogram() = default;
  // `bounds`: increasing upper bounds; a last +inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);
  // Exponential bounds: first, first * factor, ... (count bounds).
  static Histogram exponential(double first, double factor, int count);

  void observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // [bounds.size() + 1] observations per bucket (not cumulative); the last one is +inf.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  double mean() const { return count_ == 0 ? 0.0 : sum_ / static_cast<double>(count_); }
  // Upper bound of the bucket holding quantile q in [0, 1] (0 if empty).
  double quantile_upper_bound(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_ = std::vector<uint64_t>(1, 0);
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

struct EngineMetricsSnapshot {
  // Seconds.
  Histogram queue_time_s = Histogram::exponential(1e-4, 2.0, 20);   // arrival -> first scheduled
  Histogram ttft_s = Histogram::exponential(1e-4, 2.0, 20);         // arrival -> first token
  Histogram inter_token_s = Histogram::exponential(1e-4, 2.0, 20);  // between tokens of a sample
  Histogram e2e_s = Histogram::exponential(1e-3, 2.0, 20);          // arrival -> finished
  // Per step.
  Histogram batch_size = Histogram::exponential(1, 2.0, 11);        // requests scheduled
  Histogram tokens_per_step = Histogram::exponential(1, 2.0, 14);   // tokens scheduled
  int64_t num_requests_submitted = 0;
  int64_t num_requests_finished = 0;   // including aborted ones
  int64_t num_requests_aborted = 0;
  int64_t num_requests_rejected = 0;   // admission control / invalid
  int64_t num_prompt_tokens = 0;       // of admitted requests
  int64_t num_generation_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_priority_preemptions = 0;  // ... of those, for a more important waiting request
  int64_t num_steps = 0;
  // When the last step's outputs were applied: std::chrono::steady_clock seconds since its epoch
  // (0: no step yet). /health reads it: requests running and no step for long is a stuck engine.
  double last_step_time_s = 0.0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_usage = 0.0;               // used / usable blocks, after the last step
  // KV cache groups (docs/kv_layout.md), [num_groups] each: the group's window (0 = full
  // attention), the blocks its tables hold after the last step, and the blocks it released
  // because they left every query's sliding window (a counter).
  std::vector<int32_t> kv_group_windows;
  std::vector<int32_t> kv_group_used_blocks;
  std::vector<int64_t> kv_group_released_blocks;
  int32_t kv_usable_blocks = 0;
  double prefix_cache_hit_rate = 0.0;  // hit tokens / queried tokens
  int64_t num_prefix_cache_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t num_prefix_cache_hit_tokens = 0;    // ... of which served from cached blocks
  // A recurrent model's state checkpoints (prefix caching's saved states): held, saved, and
  // admissions that continued one.
  int32_t num_state_checkpoints = 0;
  int64_t num_state_checkpoint_saves = 0;
  int64_t num_state_checkpoint_hits = 0;
  // Engine-thread time, seconds: all of it (taking requests in, steps, output processing) and
  // the part spent inside ModelExecutor::execute. The difference is the engine's own overhead.
  double engine_busy_s = 0.0;
  double executor_s = 0.0;
  // Speculative decoding (vLLM's vocabulary: accepted / recovered / bonus tokens).
  int64_t num_draft_tokens = 0;            // drafts verified
  int64_t num_accepted_draft_tokens = 0;   // ... of which accepted
  int64_t num_verify_steps = 0;            // (request, step) pairs that verified >= 1 draft
  int64_t num_recovered_tokens = 0;        // ... that ended in a rejection (a recovered token)
  int64_t num_bonus_tokens = 0;            // ... that accepted every draft (a bonus token)
  // Token trees: verifications of a tree, the nodes they verified, the drafts they accepted.
  int64_t num_tree_verify_steps = 0;
  int64_t num_tree_nodes = 0;
  int64_t num_tree_accepted_tokens = 0;
  // [kMaxSpecTokens] verifications reaching draft position i (0 = the first draft; a tree's
  // depth i + 1) / accepting a draft there.
  std::vector<int64_t> drafts_at_position = std::vector<int64_t>(16, 0);
  std::vector<int64_t> accepted_at_position = std::vector<int64_t>(16, 0);
  int64_t num_spec_candidates = 0;         // decoding requests that had drafts to verify
  int64_t num_spec_declined = 0;           // ... for which the policy chose to verify none
  double spec_acceptance_estimate = 0.0;   // the policy's engine-wide acceptance estimate
  int64_t num_spec_probes = 0;             // probes made where no draft paid (kProbeInterval)
  // The served curve the policy plans with (sched::StepTimeFit): its steepness relative to the
  // startup measurement, and a speculative step's extra cost in 1-token steps.
  double spec_steepness = 1.0;
  double spec_overhead = 0.0;
  // Model shards (docs/shards.md), [num_shards]; empty when the model runs in process.
  std::vector<step::ShardStats> shards;
  int64_t num_executor_faults = 0;      // steps the executor lost (a shard died, hung, refused)
  int64_t num_executor_recoveries = 0;  // ... after which a new incarnation took over
  // false after a fault the executor could not recover from within --recover-timeout, until a
  // step runs again: /health answers 503 with executor_error meanwhile.
  bool executor_healthy = true;
  std::string executor_error;
};

// The engine's periodic log line (`arbor serve --log-stats-interval`), in the words of vLLM's:
//
//   Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 45.3 tokens/s,
//   Running: 3 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%,
//   Spec acceptance rate: 62.5% (75/120 drafts), Mean accepted length: 2.40
//
// from two snapshots `seconds` apart (with model shards, each shard's mean step, forward and
// wait times over the interval follow: "Shard 0: step 1.20 ms = forward 1.10 + wait 0.10"): throughputs, the prefix-cache hit rate and the speculation
// figures are over the interval (the speculation part only when drafts were verified in it);
// running, waiting and KV use are as of the last step. With more than one KV cache group the
// KV use is followed by each group's share of the pool: "(full 10.2%, window 512 1.5%, ...)".
std::string stats_line(const EngineMetricsSnapshot& before, const EngineMetricsSnapshot& now,
                       double seconds);
// Whether the engine stepped between the two snapshots or holds requests: the line is logged at
// info only then (at debug when idle, as vLLM does, so an idle server's log stays quiet).
bool engine_active(const EngineMetricsSnapshot& before, const EngineMetricsSnapshot& now);

// The published snapshot. publish() from the engine thread, read() from any thread.
class MetricsBoard {
 public:
  void publish(const EngineMetricsSnapshot& snapshot) {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_ = snapshot;
  }
  EngineMetricsSnapshot read() const {
    std::lock_guard<std::mutex> lock(mu_);
    return snapshot_;
  }

 private:
  mutable std::mutex mu_;
  EngineMetricsSnapshot snapshot_;
};

}  // namespace arbor::engine
