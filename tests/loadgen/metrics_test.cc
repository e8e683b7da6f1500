// vLLM's serving metrics on hand-made timelines, with exact expectations.
#include "loadgen/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace arbor::loadgen {
namespace {

RequestRecord ok(double ttft, double e2e, std::vector<double> itl, int64_t out, int64_t prompt) {
  RequestRecord r;
  r.outcome = Outcome::kOk;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.itl_s = std::move(itl);
  r.output_tokens = out;
  r.prompt_tokens = prompt;
  return r;
}

RequestRecord with_outcome(Outcome o) {
  RequestRecord r;
  r.outcome = o;
  r.error = "x";
  r.ttft_s = 9;  // must not count
  r.output_tokens = 100;
  return r;
}

TEST(Percentile, MatchesNumpyLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = [1, 2.5, 3.7, 3.97, 4]
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({10, 20}, 90), 19.0);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  // 101 values 0..100: the p-th percentile is p exactly.
  std::vector<double> h;
  for (int i = 100; i >= 0; --i) h.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(h, 99), 99.0);
  EXPECT_DOUBLE_EQ(percentile(h, 90), 90.0);
}

TEST(Summarize, MeanPopulationStdMedianPercentilesMax) {
  const Distribution d = summarize({1, 2, 3, 4});
  EXPECT_EQ(d.count, 4);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.std, std::sqrt(1.25));  // numpy.std, ddof = 0
  EXPECT_DOUBLE_EQ(d.median, 2.5);
  EXPECT_DOUBLE_EQ(d.p90, 3.7);
  EXPECT_DOUBLE_EQ(d.p99, 3.97);
  EXPECT_DOUBLE_EQ(d.max, 4.0);
  const Distribution e = summarize({});
  EXPECT_EQ(e.count, 0);
  EXPECT_EQ(e.mean, 0);
  EXPECT_EQ(e.p99, 0);
}

TEST(Tpot, ExcludesTheFirstToken) {
  EXPECT_DOUBLE_EQ(tpot_s(ok(0.5, 1.5, {}, 11, 0)), 0.1);   // (1.5 - 0.5) / 10
  EXPECT_DOUBLE_EQ(tpot_s(ok(0.25, 0.75, {}, 2, 0)), 0.5);  // one gap
  EXPECT_DOUBLE_EQ(tpot_s(ok(0.25, 0.75, {}, 1, 0)), 0.0);  // undefined: 0, as vLLM's goodput
}

// Three completed requests, one failed, one aborted, one never sent, over 2 s:
//   A: TTFT 100 ms, E2E 500 ms, 4 tokens (ITL 100, 100, 200), 10 prompt tokens, TPOT 133.3 ms
//   B: TTFT 250 ms, E2E 250 ms, 1 token, 20 prompt tokens (no TPOT)
//   C: TTFT 200 ms, E2E 1200 ms, 3 tokens (ITL 500, 500), 5 prompt tokens, TPOT 500 ms
std::vector<RequestRecord> timeline() {
  return {ok(0.1, 0.5, {0.1, 0.1, 0.2}, 4, 10),
          with_outcome(Outcome::kFailed),
          ok(0.25, 0.25, {}, 1, 20),
          with_outcome(Outcome::kAborted),
          ok(0.2, 1.2, {0.5, 0.5}, 3, 5),
          with_outcome(Outcome::kNotSent)};
}

TEST(ComputeMetrics, CountsAndThroughput) {
  const ServingMetrics m = compute_metrics(timeline(), 2.0, {});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.aborted, 1);
  EXPECT_EQ(m.not_sent, 1);
  EXPECT_EQ(m.total_input_tokens, 35);
  EXPECT_EQ(m.total_output_tokens, 8);
  EXPECT_DOUBLE_EQ(m.duration_s, 2.0);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 21.5);
  EXPECT_EQ(m.good_completed, 0);  // no SLOs given
  EXPECT_EQ(m.request_goodput, 0);
}

TEST(ComputeMetrics, Distributions) {
  const ServingMetrics m = compute_metrics(timeline(), 2.0, {});
  EXPECT_EQ(m.ttft.count, 3);
  EXPECT_DOUBLE_EQ(m.ttft.mean, (0.1 + 0.25 + 0.2) / 3);
  EXPECT_DOUBLE_EQ(m.ttft.median, 0.2);
  EXPECT_DOUBLE_EQ(m.ttft.max, 0.25);
  // TPOT only over A and C.
  EXPECT_EQ(m.tpot.count, 2);
  EXPECT_DOUBLE_EQ(m.tpot.median, (0.4 / 3 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(m.tpot.max, 0.5);
  // ITL pooled: {0.1, 0.1, 0.2, 0.5, 0.5}.
  EXPECT_EQ(m.itl.count, 5);
  EXPECT_DOUBLE_EQ(m.itl.mean, 1.4 / 5);
  EXPECT_DOUBLE_EQ(m.itl.median, 0.2);
  EXPECT_DOUBLE_EQ(m.itl.p90, 0.5);
  EXPECT_EQ(m.e2el.count, 3);
  EXPECT_DOUBLE_EQ(m.e2el.median, 0.5);
  EXPECT_DOUBLE_EQ(m.e2el.max, 1.2);
}

TEST(ComputeMetrics, GoodputCountsRequestsMeetingEverySlo) {
  // ttft <= 250 and tpot <= 200: A (100, 133) and B (250 inclusive, TPOT 0) are good; C's TPOT
  // of 500 is not.
  SloSpec s;
  s.ttft_ms = 250;
  s.tpot_ms = 200;
  ServingMetrics m = compute_metrics(timeline(), 2.0, s);
  EXPECT_EQ(m.good_completed, 2);
  EXPECT_DOUBLE_EQ(m.request_goodput, 1.0);
  // e2el <= 400 ms: only B.
  SloSpec e;
  e.e2el_ms = 400;
  m = compute_metrics(timeline(), 2.0, e);
  EXPECT_EQ(m.good_completed, 1);
  EXPECT_DOUBLE_EQ(m.request_goodput, 0.5);
  // ttft <= 150: only A.
  SloSpec t;
  t.ttft_ms = 150;
  EXPECT_EQ(compute_metrics(timeline(), 2.0, t).good_completed, 1);
  // A failed request never counts, whatever its numbers.
  EXPECT_FALSE(meets_slos(with_outcome(Outcome::kFailed), SloSpec{}));
}

TEST(ParseSlos, VllmSyntax) {
  auto s = parse_slos({"ttft:500", "tpot:50.5", "e2el:2000"});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s->ttft_ms, 500);
  EXPECT_EQ(*s->tpot_ms, 50.5);
  EXPECT_EQ(*s->e2el_ms, 2000);
  EXPECT_TRUE(parse_slos({})->empty());
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "ttft:0", "ttft:abc", "itl:5", "ttft:nan"}) {
    auto r = parse_slos({bad});
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
    }
  }
  EXPECT_FALSE(parse_slos({"ttft:1", "ttft:2"}).ok());
}

}  // namespace
}  // namespace arbor::loadgen
