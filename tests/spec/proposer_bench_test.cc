// Micro-benchmark, printed rather than asserted: the cost of propose() for one request with a
// 100k-token context growing by one token per step (the decode steady state), and the one-off
// cost of indexing the context on the first call. Run the binary directly to see the figures:
//   build/tests/spec/spec_bench_test
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "chain_drafts.h"
#include "spec/ngram_proposer.h"
#include "spec/suffix_proposer.h"

namespace arbor::spec {
namespace {

using Clock = std::chrono::steady_clock;
using Tokens = std::vector<int32_t>;

// Text-like tokens: fresh tokens from a 32000-token vocabulary, with every so often a copy
// of an earlier span (what quoting, code edits and multi-turn chat produce).
Tokens make_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Tokens t;
  t.reserve(n + 64);
  while (t.size() < n) {
    if (t.size() > 1000 && rng() % 40 == 0) {
      const size_t from = rng() % (t.size() - 64);
      const size_t len = 8 + rng() % 56;
      for (size_t j = 0; j < len; ++j) t.push_back(t[from + j]);
    } else {
      t.push_back(static_cast<int32_t>(rng() % 32000));
    }
  }
  t.resize(n);
  return t;
}

struct Figures {
  double first_ms;
  double median_us;
  double p90_us;
  double max_us;
  double nonempty_fraction;
};

Figures measure(Proposer& p, const Tokens& all, size_t context, int num_steps) {
  std::vector<Tokens> out;
  auto call = [&](size_t n) {
    const DraftRequest r{1, std::span<const int32_t>(all.data(), n), 0, 8};
    propose_chains(p, std::span<const DraftRequest>(&r, 1), out);
  };
  const auto t0 = Clock::now();
  call(context);
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::vector<double> us;
  int nonempty = 0;
  for (int s = 1; s <= num_steps; ++s) {
    const auto a = Clock::now();
    call(context + s);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    nonempty += !out[0].empty();
  }
  std::sort(us.begin(), us.end());
  return {first_ms, us[us.size() / 2], us[us.size() * 9 / 10], us.back(),
          static_cast<double>(nonempty) / num_steps};
}

void print(const char* name, const Figures& f) {
  std::printf(
      "[bench] %-34s first call (index 100k tokens) %8.1f ms; per step: median %6.2f us, p90 "
      "%6.2f us, max %7.1f us; drafts on %4.1f%% of steps\n",
      name, f.first_ms, f.median_us, f.p90_us, f.max_us, 100.0 * f.nonempty_fraction);
}

TEST(ProposerBench, HundredThousandTokenContextOneNewTokenPerStep) {
  constexpr size_t kContext = 100000;
  constexpr int kSteps = 2000;
  const Tokens all = make_tokens(kContext + kSteps, 1);

  NgramProposer ngram;
  print("ngram (defaults)", measure(ngram, all, kContext, kSteps));

  SuffixProposer suffix_local({.global_max_tokens = 0});
  print("suffix, request trie only", measure(suffix_local, all, kContext, kSteps));

  // A global trie full of other requests' outputs (its default 256k-token budget).
  SuffixProposer suffix;
  const Tokens others = make_tokens(size_t{1} << 18, 2);
  const auto g0 = Clock::now();
  for (size_t i = 0; i + 512 <= others.size(); i += 512) {
    suffix.forget(100 + i, std::span<const int32_t>(others.data() + i, 512), 0);
  }
  const double global_ms = std::chrono::duration<double, std::milli>(Clock::now() - g0).count();
  std::printf(
      "[bench] global trie: %lld tokens in %d sequences, %d nodes, %.1f MB, built in "
      "%.1f ms\n",
      static_cast<long long>(suffix.global_trie().num_tokens()),
      suffix.global_trie().num_sequences(), suffix.global_trie().num_nodes(),
      suffix.global_trie().memory_bytes() / 1e6, global_ms);
  print("suffix, request + global trie", measure(suffix, all, kContext, kSteps));
  const SuffixTrie* own = suffix.request_trie(1);
  ASSERT_NE(own, nullptr);
  std::printf("[bench] request trie: %lld tokens, %d nodes, %.1f MB\n",
              static_cast<long long>(own->num_tokens()), own->num_nodes(),
              own->memory_bytes() / 1e6);
  EXPECT_LE(own->num_nodes(), 2 * own->num_tokens() + 1);
}

}  // namespace
}  // namespace arbor::spec
