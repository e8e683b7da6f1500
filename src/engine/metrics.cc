#include "engine/metrics.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "base/check.h"
#include "base/status.h"

namespace arbor::engine {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  ARBOR_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
}

Histogram Histogram::exponential(double first, double factor, int count) {
  std::vector<double> b;
  double v = first;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return Histogram(std::move(b));
}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  ++count_;
  sum_ += value;
}

double Histogram::quantile_upper_bound(double q) const {
  if (count_ == 0) return 0.0;
  const auto target = static_cast<uint64_t>(q * static_cast<double>(count_));
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen > target || seen == count_) {
      return i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
    }
  }
  return std::numeric_limits<double>::infinity();
}

namespace {

std::string fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

double ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

}  // namespace

std::string stats_line(const EngineMetricsSnapshot& before, const EngineMetricsSnapshot& now,
                       double seconds) {
  const double per_s = seconds > 0 ? 1.0 / seconds : 0.0;
  const int64_t prompt = now.num_prompt_tokens - before.num_prompt_tokens;
  const int64_t generated = now.num_generation_tokens - before.num_generation_tokens;
  const int64_t queried = now.num_prefix_cache_query_tokens - before.num_prefix_cache_query_tokens;
  const int64_t hits = now.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens;
  std::string line = str_cat(
      "Avg prompt throughput: ", fixed(static_cast<double>(prompt) * per_s, 1),
      " tokens/s, Avg generation throughput: ", fixed(static_cast<double>(generated) * per_s, 1),
      " tokens/s, Running: ", now.num_running, " reqs, Waiting: ", now.num_waiting,
      " reqs, KV cache usage: ", fixed(100.0 * now.kv_usage, 1), "%");
  if (now.kv_group_used_blocks.size() > 1) {
    for (size_t g = 0; g < now.kv_group_used_blocks.size(); ++g) {
      const int32_t w = g < now.kv_group_windows.size() ? now.kv_group_windows[g] : 0;
      line += str_cat(g == 0 ? " (" : ", ", w == 0 ? std::string("full") : str_cat("window ", w),
                      " ", fixed(100.0 * ratio(now.kv_group_used_blocks[g], now.kv_usable_blocks), 1),
                      "%");
    }
    line += ")";
  }
  line += str_cat(", Prefix cache hit rate: ", fixed(100.0 * ratio(hits, queried), 1), "%");
  const int64_t drafts = now.num_draft_tokens - before.num_draft_tokens;
  if (drafts > 0) {
    const int64_t accepted = now.num_accepted_draft_tokens - before.num_accepted_draft_tokens;
    const int64_t verifies = now.num_verify_steps - before.num_verify_steps;
    line += str_cat(", Spec acceptance rate: ", fixed(100.0 * ratio(accepted, drafts), 1), "% (",
                    accepted, "/", drafts, " drafts), Mean accepted length: ",
                    fixed(1.0 + ratio(accepted, verifies), 2));
  }
  for (size_t i = 0; i < now.shards.size(); ++i) {
    const step::ShardStats& n = now.shards[i];
    const step::ShardStats b = i < before.shards.size() ? before.shards[i] : step::ShardStats{};
    const int64_t steps = n.num_steps - b.num_steps;
    const double ms = steps > 0 ? 1e3 / static_cast<double>(steps) : 0.0;
    line += str_cat(", Shard ", n.rank, ": step ", fixed((n.step_s - b.step_s) * ms, 2),
                    " ms = forward ", fixed((n.forward_s - b.forward_s) * ms, 2), " + wait ",
                    fixed((n.wait_s - b.wait_s) * ms, 2), n.up ? "" : " (down)");
  }
  return line;
}

bool engine_active(const EngineMetricsSnapshot& before, const EngineMetricsSnapshot& now) {
  return now.num_steps != before.num_steps || now.num_running > 0 || now.num_waiting > 0;
}

}  // namespace arbor::engine
