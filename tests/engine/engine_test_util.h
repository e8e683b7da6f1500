// Helpers for engine tests: drain a stream, random prompts, the stories260K model path.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "gguf/gguf.h"
#include "support/shared_data.h"

namespace arbor::engine::testing {

// The stories260K model; fails the current test, naming the path, when the file is missing.
inline std::string stories260k_path() {
  EXPECT_TRUE(::arbor::test::require_shared_file(::arbor::test::kStories260K));
  return ::arbor::test::shared_path(::arbor::test::kStories260K);
}

// stories260K's tokenizer.* keys, for synthetic models that speak its vocabulary
// (model/synth_model.h); fails the current test when the file cannot be read.
inline std::vector<gguf::KeyValue> stories260k_tokenizer_keys() {
  std::vector<gguf::KeyValue> keys;
  auto f = gguf::GgufFile::open(stories260k_path());
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return keys;
  for (const gguf::KeyValue& kv : f->metadata()) {
    if (kv.key.starts_with("tokenizer.")) keys.push_back(kv);
  }
  return keys;
}

struct Collected {
  std::vector<std::vector<int32_t>> token_ids;  // [n] per sample index
  std::vector<std::string> text;                // [n]
  std::vector<std::optional<sched::FinishReason>> finish;  // [n]
  std::vector<std::optional<sched::StopReason>> stop;     // [n] why each sample ended
  std::vector<double> cumulative_logprob;       // [n]
  StreamEvent final_event;
  int num_events = 0;
};

// Reads every event of `stream` until the final one.
inline Collected drain(RequestStream& stream, int32_t n = 1) {
  Collected c;
  c.token_ids.resize(n);
  c.text.resize(n);
  c.finish.resize(n);
  c.stop.resize(n);
  c.cumulative_logprob.resize(n);
  while (std::optional<StreamEvent> e = stream.next()) {
    ++c.num_events;
    if (e->final) {
      c.final_event = std::move(*e);
      break;
    }
    EXPECT_LT(e->index, n);
    if (e->index >= n) continue;
    auto& ids = c.token_ids[e->index];
    ids.insert(ids.end(), e->token_ids.begin(), e->token_ids.end());
    c.text[e->index] += e->text;
    c.cumulative_logprob[e->index] = e->cumulative_logprob;
    if (e->stop_reason) {
      EXPECT_FALSE(c.finish[e->index].has_value()) << "two finish events for one sample";
      c.finish[e->index] = e->finish_reason();
      c.stop[e->index] = e->stop_reason;
    }
  }
  EXPECT_TRUE(c.final_event.final);
  EXPECT_FALSE(stream.next().has_value());
  return c;
}

// Token ids in [3, vocab) (no BOS/EOS/unk).
inline std::vector<int32_t> random_prompt(std::mt19937_64& rng, int32_t length, int32_t vocab) {
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  std::vector<int32_t> p(length);
  for (int32_t& t : p) t = tok(rng);
  return p;
}

// Whether two runs' tokens have one distribution at each of the first kLen positions (counts:
// [kLen][vocab]; unseeded speculation must not change the target's distribution). Two-sample
// chi-square over the tokens with >= 10 expected occurrences (rarer ones pooled); the statistic
// must stay below df + 6 sqrt(2 df) + 10 (a 6-sigma bound on a chi-square with df degrees of
// freedom: a false alarm is far rarer than 1 in 10^6 runs).
inline void expect_same_distribution(const std::vector<std::vector<int64_t>>& a,
                                     const std::vector<std::vector<int64_t>>& b, int32_t kLen) {
  for (int32_t p = 0; p < kLen; ++p) {
    double chi2 = 0;
    int64_t df = -1, pooled_a = 0, pooled_b = 0;
    for (size_t t = 0; t < a[p].size(); ++t) {
      if (a[p][t] + b[p][t] >= 20) {
        const double d = static_cast<double>(a[p][t] - b[p][t]);
        chi2 += d * d / static_cast<double>(a[p][t] + b[p][t]);
        ++df;
      } else {
        pooled_a += a[p][t];
        pooled_b += b[p][t];
      }
    }
    if (pooled_a + pooled_b > 0) {
      const double d = static_cast<double>(pooled_a - pooled_b);
      chi2 += d * d / static_cast<double>(pooled_a + pooled_b);
      ++df;
    }
    const double bound = df + 6 * std::sqrt(2.0 * df) + 10;
    std::printf("position %d: chi2 %.1f with %lld degrees of freedom (bound %.1f)\n", p, chi2,
                static_cast<long long>(df), bound);
    EXPECT_GT(df, 3) << "position " << p << ": too few distinct tokens to compare";
    EXPECT_LT(chi2, bound) << "position " << p;
  }
}

// Counts of the token sampled at each of the first `len` positions ([len][vocab]) over `n`
// unseeded temperature-1 requests from BOS (token 1) through `engine`, 64 in flight at a time;
// with spec, each verifies a fixed k = 3 drafts per step.
inline std::vector<std::vector<int64_t>> sampled_token_counts(EngineCore& engine, int32_t n,
                                                             int32_t len, int32_t vocab,
                                                             bool spec) {
  std::vector<std::vector<int64_t>> counts(len, std::vector<int64_t>(vocab, 0));
  for (int32_t done = 0; done < n; done += 64) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int32_t i = done; i < std::min(n, done + 64); ++i) {
      GenerateRequest g;
      g.prompt_token_ids = {1};  // BOS: the start of a text, many first words
      g.sampling.temperature = 1.0f;
      g.max_tokens = len;
      if (spec) g.speculation = {.mode = sched::SpecMode::kFixed, .k = 3};
      auto st = engine.submit(std::move(g));
      EXPECT_TRUE(st.ok()) << st.status().to_string();
      if (st.ok()) streams.push_back(*st);
    }
    for (auto& s : streams) {
      const std::vector<int32_t> ids = drain(*s, 1).token_ids[0];
      for (int32_t p = 0; p < len && p < static_cast<int32_t>(ids.size()); ++p) ++counts[p][ids[p]];
    }
  }
  return counts;
}

}  // namespace arbor::engine::testing
