#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"

namespace arbor::sampling {
namespace {

std::vector<int32_t> ids_of(const std::vector<Candidate>& cands) {
  std::vector<int32_t> ids;
  for (const Candidate& c : cands) ids.push_back(c.token_id);
  return ids;
}

// Logits whose softmax at temperature 1 is exactly these probabilities (up to rounding).
std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// Probabilities 0.05, 0.4, 0.25, 0.2, 0.1 for ids 0..4: sorted order is 1, 2, 3, 4, 0.
const std::vector<float> kFive = logits_from_probs({0.05, 0.4, 0.25, 0.2, 0.1});

SamplingParams params_with(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  Sampler sampler;
  Rng rng(1);
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  SampleResult r = sampler.sample(logits, params_with(0.0f), {}, rng);
  EXPECT_EQ(r.token_id, 1);
  const std::vector<float> last = {-5.0f, -4.0f, -3.0f};
  EXPECT_EQ(sampler.sample(last, params_with(0.0f), {}, rng).token_id, 2);
  // A temperature below the greedy epsilon is greedy too.
  EXPECT_EQ(sampler.sample(logits, params_with(1e-6f), {}, rng).token_id, 1);
}

TEST(SamplerTest, GreedyStillConsumesOneDraw) {
  Sampler sampler;
  Rng rng(42);
  Rng reference(42);
  const std::vector<float> logits = {0.0f, 1.0f};
  (void)sampler.sample(logits, params_with(0.0f), {}, rng);
  (void)reference.next_u64();
  EXPECT_EQ(rng.next_u64(), reference.next_u64());
}

TEST(SamplerTest, TopKKeepsKBestWithTiesByLowestId) {
  Sampler sampler;
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, -1.0f};
  SamplingParams p = params_with(1.0f);
  p.top_k = 3;
  EXPECT_EQ(ids_of(sampler.distribution(logits, p)), (std::vector<int32_t>{1, 3, 2}));
  p.top_k = 1;
  EXPECT_EQ(ids_of(sampler.distribution(logits, p)), (std::vector<int32_t>{1}));
  p.top_k = 100;  // more than the vocabulary: everything
  EXPECT_EQ(sampler.distribution(logits, p).size(), 6u);
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingP) {
  Sampler sampler;
  SamplingParams p = params_with(1.0f);
  struct Row {
    float top_p;
    std::vector<int32_t> kept;
  };
  // Mass before each sorted token: id1 0, id2 0.4, id3 0.65, id4 0.85, id0 0.95.
  const std::vector<Row> table = {{0.3f, {1}}, {0.6f, {1, 2}}, {0.7f, {1, 2, 3}},
                                  {0.9f, {1, 2, 3, 4}}, {0.99f, {1, 2, 3, 4, 0}}};
  for (const Row& row : table) {
    p.top_p = row.top_p;
    EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), row.kept) << "top_p " << row.top_p;
  }
  p.top_p = 0.6f;
  auto d = sampler.distribution(kFive, p);
  EXPECT_NEAR(d[0].prob, 0.4 / 0.65, 1e-6);
  EXPECT_NEAR(d[1].prob, 0.25 / 0.65, 1e-6);
}

TEST(SamplerTest, TopPUsesTemperatureScaledProbabilities) {
  Sampler sampler;
  SamplingParams p = params_with(1.0f);
  p.top_p = 0.55f;  // T=1: mass before id3 is 0.65 -> {1, 2}
  EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), (std::vector<int32_t>{1, 2}));
  // T=2: p ~ sqrt(p) -> 0.2984, 0.2359, 0.2110, ...; mass before id3 is 0.5343 -> {1, 2, 3}.
  p.temperature = 2.0f;
  EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), (std::vector<int32_t>{1, 2, 3}));
}

TEST(SamplerTest, MinPKeepsTokensAboveFractionOfMax) {
  Sampler sampler;
  SamplingParams p = params_with(1.0f);
  struct Row {
    float min_p;
    std::vector<int32_t> kept;
  };
  // p_max = 0.4: thresholds 0.22, 0.18, 0.08, 0.012.
  const std::vector<Row> table = {
      {0.55f, {1, 2}}, {0.45f, {1, 2, 3}}, {0.2f, {1, 2, 3, 4}}, {0.03f, {1, 2, 3, 4, 0}}};
  for (const Row& row : table) {
    p.min_p = row.min_p;
    EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), row.kept) << "min_p " << row.min_p;
  }
}

TEST(SamplerTest, FiltersComposeMinPThenTopKThenTopP) {
  Sampler sampler;
  SamplingParams p = params_with(1.0f);
  p.top_p = 0.6f;
  EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), (std::vector<int32_t>{1, 2}));
  // top_k = 2 first: renormalised over {1, 2}, id1 alone holds 0.4 / 0.65 = 0.615 >= 0.6.
  p.top_k = 2;
  EXPECT_EQ(ids_of(sampler.distribution(kFive, p)), (std::vector<int32_t>{1}));
  // min_p 0.55 leaves {1, 2}; top_k 3 keeps both; top_p 0.99 keeps both.
  p.top_k = 3;
  p.top_p = 0.99f;
  p.min_p = 0.55f;
  auto d = sampler.distribution(kFive, p);
  EXPECT_EQ(ids_of(d), (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(d[0].prob + d[1].prob, 1.0, 1e-6);
}

TEST(SamplerTest, PenaltiesChangeLogitsAsHandComputed) {
  Sampler sampler;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  const std::vector<int32_t> prompt = {0, 1};
  const std::vector<int32_t> output = {2, 2, 1};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  sampler.apply_penalties(logits, p, {prompt, output});
  // id0: prompt only, positive -> 2/2. id1: negative, seen, generated once -> -2 - 0.5 - 0.25.
  // id2: generated twice -> 0.5/2 - 0.5 - 0.5. id3, id4: untouched.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.75f, -0.75f, 3.0f, -2.0f}));

  // Presence/frequency look only at generated tokens; a second call sees clean scratch.
  std::vector<float> again = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  SamplingParams only_counts;
  only_counts.presence_penalty = 1.0f;
  only_counts.frequency_penalty = -0.5f;
  sampler.apply_penalties(again, only_counts, {prompt, output});
  EXPECT_EQ(again, (std::vector<float>{2.0f, -1.5f, 0.5f, 3.0f, -2.0f}));
}

TEST(SamplerTest, LogitBiasIsAddedAndSteersGreedy) {
  Sampler sampler;
  Rng rng(3);
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  SamplingParams p = params_with(0.0f);
  p.logit_bias = {{3, -100.0f}, {4, 10.0f}};
  std::vector<float> biased = logits;
  sampler.apply_penalties(biased, p, {});
  EXPECT_EQ(biased, (std::vector<float>{2.0f, -1.0f, 0.5f, -97.0f, 8.0f}));
  EXPECT_EQ(sampler.sample(logits, p, {}, rng).token_id, 4);
}

// Pearson chi-square of `draws` samples against the expected probabilities.
double chi_square(Sampler& sampler, const std::vector<float>& logits, const SamplingParams& p,
                  const std::vector<double>& expected, uint64_t seed, int draws) {
  Rng rng(seed);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits, p, {}, rng).token_id];
  double chi = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = expected[i] * draws;
    if (e == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

std::vector<double> softmax(const std::vector<float>& logits, double t) {
  std::vector<double> p(logits.size());
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - m) / t);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplerTest, TemperatureSamplesMatchSoftmaxChiSquare) {
  Sampler sampler;
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -0.3f, 0.8f, -2.0f};
  const SamplingParams p = params_with(0.7f);
  // 7 degrees of freedom: P(chi2 > 24.32) = 0.001. Fixed seed, so the test is deterministic.
  const double chi = chi_square(sampler, logits, p, softmax(logits, 0.7), 1234, 200000);
  EXPECT_LT(chi, 24.32);
  // The test has power: the same draws are far from the T=1 distribution.
  EXPECT_GT(chi_square(sampler, logits, p, softmax(logits, 1.0), 1234, 200000), 1000.0);
}

TEST(SamplerTest, FilteredSamplesMatchDistribution) {
  Sampler sampler;
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -0.3f, 0.8f, -2.0f};
  SamplingParams p = params_with(1.3f);
  p.top_k = 5;
  p.top_p = 0.9f;
  std::vector<double> expected(logits.size(), 0.0);
  for (const Candidate& c : sampler.distribution(logits, p)) expected[c.token_id] = c.prob;
  EXPECT_EQ(std::count(expected.begin(), expected.end(), 0.0), 4);  // top_k 5, top_p drops one
  // Degrees of freedom 3 (4 kept tokens): P(chi2 > 16.27) = 0.001.
  EXPECT_LT(chi_square(sampler, logits, p, expected, 99, 200000), 16.27);
}

std::vector<int32_t> draw_sequence(uint64_t seed, int n) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(50);
  for (float& x : logits) x = normal(gen);
  Sampler sampler;
  Rng rng(seed);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.sample(logits, params_with(1.0f), {}, rng).token_id);
  return out;
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  EXPECT_EQ(draw_sequence(7, 100), draw_sequence(7, 100));
  EXPECT_NE(draw_sequence(7, 100), draw_sequence(8, 100));
}

TEST(SamplerTest, RequestsInterleavedInOneSamplerMatchRunningAlone) {
  const std::vector<float> a_logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.0f, -0.5f};
  const std::vector<float> b_logits = {1.0f, -1.0f, 0.5f, 0.0f, 0.25f, 0.75f};
  SamplingParams pa = params_with(0.9f);
  SamplingParams pb = params_with(1.5f);
  pb.top_k = 4;
  pb.frequency_penalty = 0.3f;
  auto run = [](Sampler& s, const std::vector<float>& logits, const SamplingParams& p, Rng& rng,
                std::vector<int32_t>& out) {
    out.push_back(s.sample(logits, p, {{}, out}, rng).token_id);
  };
  Sampler shared;
  Rng ra(11), rb(12);
  std::vector<int32_t> a_mixed, b_mixed;
  for (int i = 0; i < 40; ++i) {
    run(shared, a_logits, pa, ra, a_mixed);
    run(shared, b_logits, pb, rb, b_mixed);
  }
  Sampler alone;
  Rng ra2(11), rb2(12);
  std::vector<int32_t> a_alone, b_alone;
  for (int i = 0; i < 40; ++i) run(alone, a_logits, pa, ra2, a_alone);
  for (int i = 0; i < 40; ++i) run(alone, b_logits, pb, rb2, b_alone);
  EXPECT_EQ(a_mixed, a_alone);
  EXPECT_EQ(b_mixed, b_alone);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmaxAndTopNSorted) {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = normal(gen);
  logits[10] = logits[20] = 15.0f;  // a tie among the best: id 10 must come first
  std::vector<double> ref(logits.size());
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - m);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = logits[i] - m - std::log(sum);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  Sampler sampler;
  Rng rng(5);
  SamplingParams p = params_with(0.5f);  // transforms must not leak into the logprobs
  p.repetition_penalty = 1.5f;
  p.logprobs = 5;
  const std::vector<int32_t> prompt = {10, 20, 30};
  for (int step = 0; step < 20; ++step) {
    SampleResult r = sampler.sample(logits, p, {prompt, {}}, rng);
    EXPECT_NEAR(r.logprob, ref[r.token_id], 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token_id, order[i]);
      EXPECT_NEAR(r.top_logprobs[i].logprob, ref[order[i]], 1e-5);
    }
  }
  EXPECT_EQ(order[0], 10);
  EXPECT_EQ(order[1], 20);
  p.logprobs = 0;
  SampleResult r = sampler.sample(logits, p, {prompt, {}}, rng);
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_NEAR(r.logprob, ref[r.token_id], 1e-5);
}

// On a large flat vocabulary top_p needs far more than the first 256-candidate prefix.
TEST(SamplerTest, TopPOnLargeVocabMatchesFullSortReference) {
  std::mt19937 gen(23);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> logits(150000);
  for (float& x : logits) x = normal(gen);
  SamplingParams p = params_with(0.8f);
  p.top_p = 0.9f;
  const float m = *std::max_element(logits.begin(), logits.end());
  std::vector<float> w(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < w.size(); ++i) total += w[i] = std::exp((logits[i] - m) * (1.0f / 0.8f));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::set<int32_t> expected;
  double cum = 0.0;
  for (int32_t id : order) {
    if (cum >= 0.9 * total) break;
    expected.insert(id);
    cum += w[id];
  }
  ASSERT_GT(expected.size(), 10000u);
  Sampler sampler;
  const auto d = sampler.distribution(logits, p);
  const auto ids = ids_of(d);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), expected);
  EXPECT_TRUE(std::is_sorted(d.begin(), d.end(),
                             [](const Candidate& a, const Candidate& b) { return a.prob > b.prob; }));
}

// Small k selects with a heap, large k (> 1024) with nth_element: both must equal a full sort,
// ties (many here: logits are rounded to 1/4) resolved toward lower ids.
TEST(SamplerTest, TopKMatchesFullSortReferenceOnBothSelectionPaths) {
  std::mt19937 gen(31);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(20000);
  for (float& x : logits) x = std::round(normal(gen) * 4.0f) / 4.0f;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  Sampler sampler;
  for (int32_t k : {1, 7, 40, 1024, 1025, 3000}) {
    SamplingParams p = params_with(1.0f);
    p.top_k = k;
    EXPECT_EQ(ids_of(sampler.distribution(logits, p)),
              std::vector<int32_t>(order.begin(), order.begin() + k))
        << "top_k " << k;
  }
}

TEST(InverseCdfTest, WalksInIdOrderAndSkipsZeroMass) {
  // Listed out of order; in id order: 1 [0, .25), 2 [.25, .5), 3 [.5, 1); 7 has no mass.
  const std::vector<Candidate> dist = {{3, 0.5}, {1, 0.25}, {7, 0.0}, {2, 0.25}};
  struct Row {
    double u;
    int32_t token;
  };
  for (const Row& row : std::vector<Row>{{0.0, 1},
                                         {0.25 - 0x1p-53, 1},
                                         {0.25, 2},
                                         {0.5 - 0x1p-53, 2},
                                         {0.5, 3},
                                         {1.0 - 0x1p-53, 3}}) {
    EXPECT_EQ(inverse_cdf(dist, row.u), row.token) << "u " << row.u;
  }
  // Unnormalised weights are scaled by their total.
  const std::vector<Candidate> weights = {{0, 3.0}, {5, 1.0}};
  EXPECT_EQ(inverse_cdf(weights, 0.74), 0);
  EXPECT_EQ(inverse_cdf(weights, 0.75), 5);
  EXPECT_EQ(inverse_cdf(std::vector<Candidate>{{4, 0.0}, {9, 1e-300}}, 0.999), 9);
}

struct FilterCase {
  const char* name;
  SamplingParams params;
};

std::vector<FilterCase> filter_cases() {
  std::vector<FilterCase> cases;
  auto add = [&](const char* name, auto set) {
    SamplingParams p;
    set(p);
    cases.push_back({name, p});
  };
  add("plain", [](SamplingParams&) {});
  add("greedy", [](SamplingParams& p) { p.temperature = 0.0f; });
  add("temperature 0.4", [](SamplingParams& p) { p.temperature = 0.4f; });
  add("temperature 1.9", [](SamplingParams& p) { p.temperature = 1.9f; });
  add("top_k 1", [](SamplingParams& p) { p.top_k = 1; });
  add("top_k 5", [](SamplingParams& p) { p.top_k = 5; });
  add("top_p 0.5", [](SamplingParams& p) { p.top_p = 0.5f; });
  add("top_p 0.93", [](SamplingParams& p) { p.top_p = 0.93f; });
  add("min_p 0.1", [](SamplingParams& p) { p.min_p = 0.1f; });
  add("all filters", [](SamplingParams& p) {
    p.temperature = 0.8f;
    p.top_k = 12;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
  });
  add("penalties + top_k", [](SamplingParams& p) {
    p.repetition_penalty = 1.4f;
    p.presence_penalty = 0.6f;
    p.frequency_penalty = 0.3f;
    p.top_k = 8;
    p.logit_bias = {{3, 2.0f}, {4, -1.0f}};
  });
  return cases;
}

// A row with many exact ties (logits on a 1/2 grid), a -inf entry and entries whose exp
// underflows to 0 (kept by the filters but without probability).
std::vector<float> tied_row(uint32_t seed, size_t vocab) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = std::round(normal(gen) * 2.0f) / 2.0f;
  logits[vocab / 2] = -std::numeric_limits<float>::infinity();
  for (size_t i = 1; i < vocab; i += 7) logits[i] = -200.0f;
  return logits;
}

// What rejection sampling relies on: sample() with the counter-based site draws exactly
// inverse_cdf(distribution(penalised row), u) for the same u, for every filter, at ties, in
// either candidate order; and the two orders list the same set with the same probabilities.
TEST(SamplerTest, SampleIsInverseCdfOfDistributionTokenForToken) {
  Sampler sampler;
  const std::vector<int32_t> prompt = {1, 2, 3, 3};
  const std::vector<int32_t> output = {5, 5, 7};
  const TokenHistory history{prompt, output};
  int checked = 0;
  for (const FilterCase& c : filter_cases()) {
    for (uint32_t row_seed = 0; row_seed < 6; ++row_seed) {
      const std::vector<float> raw = tied_row(row_seed, 40);
      std::vector<float> penalised = raw;
      sampler.apply_penalties(penalised, c.params, history);
      const auto by_prob = sampler.distribution(penalised, c.params);
      const auto by_id = sampler.distribution(penalised, c.params, CandidateOrder::kById);
      ASSERT_EQ(by_prob.size(), by_id.size()) << c.name;
      std::vector<Candidate> resorted = by_prob;
      std::sort(resorted.begin(), resorted.end(),
                [](const Candidate& a, const Candidate& b) { return a.token_id < b.token_id; });
      for (size_t i = 0; i < by_id.size(); ++i) {
        EXPECT_EQ(by_id[i].token_id, resorted[i].token_id) << c.name;
        EXPECT_EQ(by_id[i].prob, resorted[i].prob) << c.name;  // bit-identical
        EXPECT_GT(by_id[i].prob, 0.0);
      }
      for (uint64_t seed = 0; seed < 300; ++seed) {
        const int64_t position = 10 + static_cast<int64_t>(seed % 7);
        Rng rng = Rng::at(seed, position, RngStream::kSample);
        const int32_t sampled = sampler.sample(raw, c.params, history, rng).token_id;
        const double u = Rng::at(seed, position, RngStream::kSample).next_double();
        ASSERT_EQ(sampled, inverse_cdf(by_id, u)) << c.name << " row " << row_seed;
        ASSERT_EQ(sampled, inverse_cdf(by_prob, u)) << c.name << " row " << row_seed;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 11 * 6 * 300);
}

// top_p on a flat 150k row keeps tens of thousands of tokens: sample() then orders them by id
// with a counting pass instead of a sort; the draws must still be inverse_cdf's.
TEST(SamplerTest, SampleIsInverseCdfOfDistributionOnLargeKeptSets) {
  std::mt19937 gen(41);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> logits(150000);
  for (float& x : logits) x = normal(gen);
  SamplingParams p = params_with(0.8f);
  p.top_p = 0.9f;
  Sampler sampler;
  const auto dist = sampler.distribution(logits, p, CandidateOrder::kById);
  ASSERT_GT(dist.size(), 10000u);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng rng = Rng::at(seed, 3, RngStream::kSample);
    EXPECT_EQ(sampler.sample(logits, p, {}, rng).token_id,
              inverse_cdf(dist, Rng::at(seed, 3, RngStream::kSample).next_double()));
  }
}

TEST(SamplerTest, ScoreReportsWhatSampleReports) {
  std::mt19937 gen(29);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(300);
  for (float& x : logits) x = normal(gen);
  SamplingParams p = params_with(0.7f);
  p.top_k = 20;
  p.presence_penalty = 1.0f;  // transforms do not enter the logprobs
  p.logprobs = 4;
  const std::vector<int32_t> output = {1, 2};
  Sampler sampler;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Rng rng(seed);
    const SampleResult sampled = sampler.sample(logits, p, {{}, output}, rng);
    const SampleResult scored = sampler.score(logits, sampled.token_id, p);
    EXPECT_EQ(scored.token_id, sampled.token_id);
    EXPECT_EQ(scored.logprob, sampled.logprob);
    ASSERT_EQ(scored.top_logprobs.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(scored.top_logprobs[i].token_id, sampled.top_logprobs[i].token_id);
      EXPECT_EQ(scored.top_logprobs[i].logprob, sampled.top_logprobs[i].logprob);
    }
  }
  // Any token, kept by the filters or not: its raw log-softmax.
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  const int32_t worst =
      static_cast<int32_t>(std::min_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_NEAR(sampler.score(logits, worst, p).logprob, logits[worst] - m - std::log(sum), 1e-4);
  p.logprobs.reset();
  const SampleResult none = sampler.score(logits, worst, p);
  EXPECT_EQ(none.token_id, worst);
  EXPECT_EQ(none.logprob, 0.0f);
  EXPECT_TRUE(none.top_logprobs.empty());
}

TEST(SamplingParamsTest, ValidationNamesFieldAndLimit) {
  const int64_t vocab = 100;
  EXPECT_TRUE(SamplingParams{}.validate(vocab).ok());
  struct Case {
    std::function<void(SamplingParams&)> set;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature is -0.5, must be in [0, 100]"},
      {[](SamplingParams& p) { p.temperature = NAN; }, "temperature"},
      {[](SamplingParams& p) { p.top_k = -3; }, "top_k is -3"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p is 0, must be in (0, 1]"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p is 1.5"},
      {[](SamplingParams& p) { p.min_p = 2.0f; }, "min_p is 2, must be in [0, 1]"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty is 0, must be in (0, 10]"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty is 2.5, must be in [-2, 2]"},
      {[](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty is -3"},
      {[](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }, "token id 100 is outside the vocabulary [0, 100)"},
      {[](SamplingParams& p) { p.logit_bias = {{5, 1.0f}, {5, 2.0f}}; }, "lists token id 5 twice"},
      {[](SamplingParams& p) { p.logit_bias = {{5, 101.0f}}; }, "logit_bias for token 5 is 101, must be in [-100, 100]"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs is 21, must be in [0, 20]"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    Status s = p.validate(vocab);
    ASSERT_FALSE(s.ok()) << c.expected;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace arbor::sampling
