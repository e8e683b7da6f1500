// SpecPolicy: the goodput choice of k against a brute-force optimum, and its behaviour under
// load and with poor drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "sched/spec_policy.h"

namespace arbor::sched {
namespace {

double expected_tokens(double a, int32_t k) {
  double e = 0;
  for (int32_t j = 1; j <= k; ++j) e += std::pow(a, j);
  return e;
}

double goodput(const SpecCostModel& cost, int64_t base_tokens, int64_t base_emitted,
               const std::vector<SpecPolicy::Candidate>& c, const std::vector<int32_t>& k) {
  double emitted = static_cast<double>(base_emitted);
  int64_t tokens = base_tokens;
  for (size_t i = 0; i < c.size(); ++i) {
    emitted += expected_tokens(c[i].acceptance, k[i]);
    tokens += k[i];
  }
  int64_t drafts = tokens - base_tokens;
  return emitted / (cost.cost(tokens) + cost.draft_cost * static_cast<double>(drafts));
}

TEST(SpecPolicy, CostModelInterpolatesAndExtrapolates) {
  SpecCostModel m{.points = {{1, 1.0}, {4, 1.3}, {8, 2.1}}};
  EXPECT_DOUBLE_EQ(m.cost(1), 1.0);
  EXPECT_DOUBLE_EQ(m.cost(2), 1.1);
  EXPECT_DOUBLE_EQ(m.cost(6), 1.7);
  EXPECT_DOUBLE_EQ(m.cost(12), 2.9);
  EXPECT_DOUBLE_EQ(SpecCostModel{}.cost(100), 1.0);
}

TEST(SpecPolicy, FreeTokensTakeEveryDraftAndComputeBoundTakesNone) {
  SpecPolicy flat(SpecCostModel{});
  std::vector<SpecPolicy::Candidate> c{{.acceptance = 0.3, .max_k = 5}, {.acceptance = 0.9, .max_k = 3}};
  EXPECT_EQ(flat.choose(2, 2, 100, c), (std::vector<int32_t>{5, 3}));
  EXPECT_EQ(flat.choose(2, 2, 4, c), (std::vector<int32_t>{1, 3})) << "the budget goes to the best";
  // cost proportional to tokens: a draft never pays (a < 1).
  SpecPolicy linear(SpecCostModel{.points = {{1, 1.0}, {2, 2.0}}});
  EXPECT_EQ(linear.choose(2, 2, 100, c), (std::vector<int32_t>{0, 0}));
  // Fixed candidates get their k whatever the cost (the others then compete with that step).
  c[0].fixed = true;
  EXPECT_EQ(linear.choose(2, 2, 100, c)[0], 5);
  EXPECT_EQ(linear.choose(2, 2, 3, c)[0], 3) << "within the budget";
}

TEST(SpecPolicy, MeasuredOverheadMakesDraftsPayLessAndKeepsTheBestPrefix) {
  // Flat curve (extra tokens free): at overhead 1 every draft pays.
  SpecPolicy p(SpecCostModel{});
  const std::vector<SpecPolicy::Candidate> weak{{.acceptance = 0.3, .max_k = 4}};
  EXPECT_EQ(p.choose(1, 1, 100, weak)[0], 4);
  // A step with drafts costing 1.5x: at most 1 + 0.3 + ... + 0.3^4 = 1.43 tokens for 1.5, so no.
  p.set_overhead(1.5);
  EXPECT_DOUBLE_EQ(p.overhead(), 1.5);
  EXPECT_EQ(p.choose(1, 1, 100, weak)[0], 0);
  // At 2x a good draft's first token does not pay (1.9 / 2 < 1) but four do (4.10 / 2): the
  // best prefix, not the first non-improving draft, decides.
  p.set_overhead(2.0);
  const std::vector<SpecPolicy::Candidate> good{{.acceptance = 0.9, .max_k = 4}};
  EXPECT_EQ(p.choose(1, 1, 100, good)[0], 4);
  EXPECT_EQ(p.choose(1, 1, 1, good)[0], 0) << "one draft of budget does not pay";
  // Clamped to [1, kMaxSpecOverhead].
  p.set_overhead(0.5);
  EXPECT_DOUBLE_EQ(p.overhead(), 1.0);
  p.set_overhead(100.0);
  EXPECT_DOUBLE_EQ(p.overhead(), kMaxSpecOverhead);
}

TEST(SpecPolicy, SwitchesItselfOffUnderLoad) {
  // Memory-bound up to 16 tokens, compute-bound beyond (the shape measured on a CPU).
  SpecCostModel m{.points = {{1, 1.0}, {16, 1.6}, {32, 3.2}}};
  SpecPolicy p(m);
  const std::vector<SpecPolicy::Candidate> one{{.acceptance = 0.8, .max_k = 8}};
  EXPECT_GT(p.choose(1, 1, 2048, one)[0], 3) << "alone, a good draft pays";
  EXPECT_EQ(p.choose(64, 64, 2048, one)[0], 0) << "with 64 decodes in the step it does not";
  const std::vector<SpecPolicy::Candidate> poor{{.acceptance = 0.02, .max_k = 8}};
  EXPECT_EQ(p.choose(1, 1, 2048, poor)[0], 0) << "a draft that is never accepted does not pay";
  // A draft model's own cost: 0.7 of a target step per draft token (stories260K's 3-layer cut):
  // with 60 % acceptance 1.6 tokens for 1.74 steps' time does not pay; with 80 % it just does.
  SpecCostModel costly = m;
  costly.draft_cost = 0.7;
  const std::vector<SpecPolicy::Candidate> fair{{.acceptance = 0.6, .max_k = 8}};
  EXPECT_EQ(SpecPolicy(costly).choose(1, 1, 2048, fair)[0], 0);
  EXPECT_EQ(SpecPolicy(costly).choose(1, 1, 2048, one)[0], 1);
}

// Greedy equals the brute-force optimum over every k vector, for increasing-increment costs.
TEST(SpecPolicy, GreedyIsOptimalForConvexCosts) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    // Convex piecewise-linear cost: increments grow.
    SpecCostModel m;
    double y = 1.0, slope = 0.02 + 0.1 * u(rng);
    for (int32_t x = 1; x <= 40; x += 3) {
      m.points.emplace_back(x, y);
      y += 3 * slope;
      slope *= 1.0 + u(rng);
    }
    m.draft_cost = u(rng) < 0.5 ? 0.0 : 0.1 * u(rng);
    std::vector<SpecPolicy::Candidate> c(3);
    for (auto& ci : c) ci = {.acceptance = u(rng), .max_k = static_cast<int32_t>(u(rng) * 5)};
    const int64_t base_tokens = 1 + static_cast<int64_t>(u(rng) * 10);
    const int64_t base_emitted = 3;
    SpecPolicy p(m);
    const std::vector<int32_t> k = p.choose(base_tokens, base_emitted, 1000, c);
    double best = 0;
    std::vector<int32_t> kk(3);
    for (kk[0] = 0; kk[0] <= c[0].max_k; ++kk[0]) {
      for (kk[1] = 0; kk[1] <= c[1].max_k; ++kk[1]) {
        for (kk[2] = 0; kk[2] <= c[2].max_k; ++kk[2]) {
          best = std::max(best, goodput(m, base_tokens, base_emitted, c, kk));
        }
      }
    }
    EXPECT_NEAR(goodput(m, base_tokens, base_emitted, c, k), best, 1e-12);
  }
}

TEST(SpecPolicy, EstimatesFollowObservations) {
  SpecPolicy p(SpecCostModel{}, {.prior_acceptance = 0.7, .ema_weight = 0.25});
  double e = -1;
  EXPECT_DOUBLE_EQ(p.acceptance(e), 0.7);
  for (int i = 0; i < 40; ++i) p.observe(e, 4, 0);
  EXPECT_LT(e, 0.01) << "every draft rejected";
  for (int i = 0; i < 40; ++i) p.observe(e, 4, 4);
  EXPECT_GT(e, 0.95) << "every draft accepted";
  double f = -1;
  for (int i = 0; i < 40; ++i) p.observe(f, 3, 1);
  EXPECT_NEAR(f, 0.5, 0.01) << "one of three accepted each step: a = 1/2 maximises the likelihood";
  EXPECT_DOUBLE_EQ(acceptance_from_step(5, 2), 2.0 / 3.0);
}

// The calibration starts as the identity; fed outcomes that ignore the estimate (independent at
// 45 %) it flattens to their rate; fed outcomes that follow the estimate it stays the identity.
// 3000 outcomes, seeded: the fitted values' standard error over the ~200 outcomes in its memory
// is ~0.04 at these estimates, so 0.1 is a wide bound.
TEST(SpecPolicy, TheCalibrationLearnsWhatEstimatesAreWorth) {
  AcceptanceCalibration fresh;
  for (const double x : {0.0, 0.3, 0.7, 0.9}) EXPECT_NEAR(fresh.map(x), x, 1e-12);
  EXPECT_DOUBLE_EQ(fresh.map(1.0), kMaxAcceptance);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  AcceptanceCalibration flat, faithful;
  for (int i = 0; i < 3000; ++i) {
    const double x = 0.2 + 0.7 * u(rng);
    flat.observe(x, u(rng) < 0.45);
    faithful.observe(x, u(rng) < x);
  }
  for (const double x : {0.3, 0.6, 0.85}) {
    EXPECT_NEAR(flat.map(x), 0.45, 0.1) << x;
    EXPECT_NEAR(faithful.map(x), x, 0.1) << x;
  }
  EXPECT_LT(std::abs(flat.slope()), 0.35);
  EXPECT_GT(faithful.slope(), 0.65);
  // A policy plans with calibrated estimates.
  SpecPolicy p(SpecCostModel{}, {.prior_acceptance = 0.7, .ema_weight = 0.25});
  for (int i = 0; i < 3000; ++i) p.observe_first_draft(0.2 + 0.7 * u(rng), u(rng) < 0.45);
  EXPECT_NEAR(p.acceptance(0.9), 0.45, 0.1);
  EXPECT_DOUBLE_EQ(p.raw_acceptance(0.9), 0.9);
  // Later drafts have their own line: chains whose second draft always fails (one accepted of
  // four: only draft 2 was reached) teach it 0; the first drafts' line is unchanged.
  EXPECT_NEAR(p.later_acceptance(0.6), 0.6, 1e-12) << "the identity before any chain";
  for (int i = 0; i < 3000; ++i) p.observe_later_drafts(0.2 + 0.7 * u(rng), 4, 1);
  EXPECT_LT(p.later_acceptance(0.6), 0.05);
  EXPECT_NEAR(p.acceptance(0.6), 0.45, 0.1);
  // Chains accepted whole: each of drafts 2..4 counts as reached and accepted.
  for (int i = 0; i < 3000; ++i) p.observe_later_drafts(0.2 + 0.7 * u(rng), 4, 4);
  EXPECT_GT(p.later_acceptance(0.6), 0.95);
}

// With the proposer's confidence in each draft the calibration fits a plane: it starts as the
// identity in the estimate (no confidence term); a confidence that predicts the outcome gets the
// slope it has (here outcomes agree with probability equal to the confidence, whatever the
// estimate: gamma ~1, beta ~0), one that does not gets none (gamma ~0), and the estimate's own
// line, used where a draft comes without a confidence, is the same as before. 3000 outcomes, the
// fits' standard errors ~0.03.
TEST(SpecPolicy, TheCalibrationLearnsWhatTheDraftsConfidenceIsWorth) {
  AcceptanceCalibration fresh;
  for (const double c : {0.1, 0.5, 1.0}) {
    for (const double x : {0.0, 0.3, 0.7, 0.9}) {
      EXPECT_NEAR(fresh.map(x, c), x, 1e-9) << x << " " << c;
    }
  }
  EXPECT_DOUBLE_EQ(fresh.confidence_slope(), 0.0);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  AcceptanceCalibration telling, blind;
  for (int i = 0; i < 3000; ++i) {
    const double x = 0.2 + 0.7 * u(rng), c = u(rng);
    telling.observe(x, u(rng) < c, c);
    blind.observe(x, u(rng) < 0.6, c);
  }
  EXPECT_NEAR(telling.confidence_slope(), 1.0, 0.15);
  EXPECT_LT(std::abs(blind.confidence_slope()), 0.15);
  for (const double x : {0.3, 0.6, 0.85}) {
    for (const double c : {0.2, 0.5, 0.95}) {
      EXPECT_NEAR(telling.map(x, c), std::min(c, kMaxAcceptance), 0.1) << x << " " << c;
      EXPECT_NEAR(blind.map(x, c), 0.6, 0.1) << x << " " << c;
    }
    EXPECT_NEAR(telling.map(x), 0.5, 0.1) << "without a confidence: the mean rate";
  }
  // A chain is priced draft by draft: the probability of reaching and accepting each.
  SpecPolicy p(SpecCostModel{}, {.prior_acceptance = 0.7, .ema_weight = 0.25});
  for (int i = 0; i < 3000; ++i) {
    const float c[3] = {static_cast<float>(u(rng)), static_cast<float>(u(rng)),
                        static_cast<float>(u(rng))};
    const int32_t accepted = u(rng) >= c[0] ? 0 : u(rng) >= c[1] ? 1 : u(rng) >= c[2] ? 2 : 3;
    p.calibrate(0.2 + 0.7 * u(rng), 3, accepted, c);
  }
  const std::vector<float> chain{0.95f, 0.9f, 0.3f};
  const std::vector<double> gains = p.chain_gains(0.6, chain);
  ASSERT_EQ(gains.size(), 3u);
  EXPECT_NEAR(gains[0], 0.95, 0.1);
  EXPECT_NEAR(gains[1], 0.95 * 0.9, 0.1);
  EXPECT_NEAR(gains[2], 0.95 * 0.9 * 0.3, 0.1);
  EXPECT_DOUBLE_EQ(gains[0], p.acceptance(0.6, chain[0]));
  EXPECT_DOUBLE_EQ(gains[1], gains[0] * p.later_acceptance(0.6, chain[1]));
}

// ---- the expert term (a mixture of experts) -------------------------------------------------

SpecCostModel::Experts experts_128_8() {
  SpecCostModel::Experts e;
  e.num_experts = 128;
  e.num_used = 8;
  return e;
}

// The experts a 1-token step reads are part of the step, so a fit that prices them above the
// whole step is impossible (EngineCore measures such a curve again): the 30B-A3B shape's
// measured terms, 0.055-0.104 per expert per layer with 8 routed, give 0.44-0.84; one measured
// in a stall, 0.126, gives 1.005.
TEST(SpecExpertTerm, TheRoutedExpertsShareOfAStepIsAtMostOneWhenMeasuredWell) {
  SpecCostModel::Experts e = experts_128_8();
  EXPECT_EQ(e.one_token_share(), 0.0) << "no term, no share";
  e.cost_per_expert = 0.055;
  EXPECT_NEAR(e.one_token_share(), 0.44, 1e-12);
  e.cost_per_expert = 0.104;
  EXPECT_LT(e.one_token_share(), 1.0);
  e.cost_per_expert = 0.1256;
  EXPECT_GT(e.one_token_share(), 1.0);
  e.num_experts = 0;  // a dense model
  EXPECT_EQ(e.one_token_share(), 0.0);
}

TEST(SpecExpertTerm, ExpectedExpertsAndRhoAreInverses) {
  const SpecCostModel::Experts e = experts_128_8();
  EXPECT_DOUBLE_EQ(e.expected(1, 1.0), 8.0);  // one row: its K experts
  EXPECT_NEAR(e.expected(1000, 1.0), 128.0, 1e-9);
  for (double rho : {0.1, 0.3, 0.7, 1.0, 1.5}) {
    for (int t : {2, 3, 5, 9, 17, 33}) {
      const double x = e.expected(t, rho);
      if (x > 127.5) continue;  // rho_of clamps X below E
      EXPECT_NEAR(e.rho_of(t, x), rho, 1e-9) << "rho " << rho << ", T " << t;
    }
  }
  EXPECT_EQ(e.rho_of(1, 8), 1.0);   // one row tells nothing
  EXPECT_EQ(e.rho_of(5, 0), 1.0);   // no count (a device that did not tell)
  EXPECT_EQ(e.rho_of(2, 8), 0.0);  // two rows on the same K experts: one row's worth
}

// The measured curve's nondecreasing fit: exact pools of the violators, the identity on a
// nondecreasing series, and the least-squares property checked against every alternative
// pooling of a small series (exhaustive over the 2^(n-1) ways to cut n points into runs).
TEST(SpecCostCurve, NondecreasingFitPoolsViolatorsIntoTheirMean) {
  using V = std::vector<double>;
  EXPECT_EQ(nondecreasing_fit(V{}), V{});
  EXPECT_EQ(nondecreasing_fit(V{1, 1.6, 2.1, 2.2, 2.9, 3.4}), (V{1, 1.6, 2.1, 2.2, 2.9, 3.4}));
  // The startup curve of a Zen 4 VM (r(5) above r(6)): the two pooled at their mean.
  EXPECT_EQ(nondecreasing_fit(V{1, 1.5, 2.5, 2.0, 3.0}), (V{1, 1.5, 2.25, 2.25, 3.0}));
  // A dip that reaches back two points: all three pooled.
  EXPECT_EQ(nondecreasing_fit(V{1, 3, 4, 1, 5}), (V{1, 8.0 / 3, 8.0 / 3, 8.0 / 3, 5}));
  EXPECT_EQ(nondecreasing_fit(V{4, 3, 2, 1}), (V{2.5, 2.5, 2.5, 2.5}));
  EXPECT_EQ(nondecreasing_fit(V{2, 2, 1}), (V{5.0 / 3, 5.0 / 3, 5.0 / 3}));
  std::mt19937 rng(41);
  std::uniform_real_distribution<double> u(0.0, 4.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 7;
    V c(n);
    for (double& x : c) x = u(rng);
    const V fit = nondecreasing_fit(c);
    ASSERT_EQ(fit.size(), c.size());
    double fit_err = 0;
    for (int i = 0; i < n; ++i) fit_err += (fit[i] - c[i]) * (fit[i] - c[i]);
    for (int i = 1; i < n; ++i) ASSERT_LE(fit[i - 1], fit[i] + 1e-12) << "trial " << trial;
    // Every cut of [0, n) into runs whose means do not decrease: none fits better.
    for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
      V alt(n);
      int begin = 0;
      for (int i = 0; i < n; ++i) {
        if (i == n - 1 || ((cuts >> i) & 1)) {
          double sum = 0;
          for (int j = begin; j <= i; ++j) sum += c[j];
          for (int j = begin; j <= i; ++j) alt[j] = sum / (i - begin + 1);
          begin = i + 1;
        }
      }
      bool monotone = true;
      for (int i = 1; i < n; ++i) monotone = monotone && alt[i - 1] <= alt[i];
      if (!monotone) continue;
      double err = 0;
      for (int i = 0; i < n; ++i) err += (alt[i] - c[i]) * (alt[i] - c[i]);
      ASSERT_GE(err, fit_err - 1e-9) << "trial " << trial << " cuts " << cuts;
    }
  }
}

// Steps whose cost is 1 + 0.05 (T - 1) + 0.02 (X - 8): the fit recovers 0.02 from a distinct and a
// repeated series, whatever X each happened to touch.
TEST(SpecExpertTerm, FitRecoversTheCostPerExpert) {
  const SpecCostModel::Experts e = experts_128_8();
  auto cost = [](int t, double x) { return 1 + 0.05 * (t - 1) + 0.02 * (x - 8); };
  std::vector<ExpertCostPoint> distinct, repeated;
  for (int t : {1, 2, 4, 8, 16, 32}) {
    const double xd = e.expected(t, 1.0), xr = 8 + 0.1 * t;
    distinct.push_back({t, cost(t, xd), xd});
    if (t >= 2) repeated.push_back({t, cost(t, xr), xr});
  }
  EXPECT_NEAR(fit_cost_per_expert(distinct, repeated), 0.02, 1e-12);
  // No size in both series with a difference of at least one expert: no term.
  repeated = {{2, 1.0, distinct[1].touched - 0.5}};
  EXPECT_EQ(fit_cost_per_expert(distinct, repeated), 0.0);
  EXPECT_EQ(fit_cost_per_expert(distinct, {}), 0.0);
  // Repeated rows that cost more than distinct ones (noise): never a negative price.
  repeated = {{4, 5.0, 8.0}};
  EXPECT_EQ(fit_cost_per_expert(distinct, repeated), 0.0);
}

// A curve measured on rows that routed independently (rho 1), with an expert costing 0.02 of a
// 1-token step per layer-expert and a row 0.01.
SpecCostModel moe_curve() {
  SpecCostModel m;
  m.experts = experts_128_8();
  m.experts.cost_per_expert = 0.02;
  for (int t : {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32}) {
    const double x = m.experts.expected(t, 1.0);
    m.points.emplace_back(t, 1 + 0.01 * (t - 1) + 0.02 * (x - 8));
    m.experts.touched.push_back(x);
  }
  return m;
}

TEST(SpecExpertTerm, TheCurveStandsWhileRowsRouteAsMeasured) {
  SpecPolicy p(moe_curve());
  EXPECT_NEAR(p.rho(), 1.0, 1e-9);
  for (int t : {1, 2, 5, 8, 16, 32}) EXPECT_NEAR(p.step_cost(t), p.cost_model().cost(t), 1e-9);
  // Decode steps whose rows touch what the measurement's did keep it so.
  for (int i = 0; i < 50; ++i) p.observe_experts(5, p.cost_model().experts.expected(5, 1.0));
  EXPECT_NEAR(p.rho(), 1.0, 1e-9);
  EXPECT_NEAR(p.step_cost(5), p.cost_model().cost(5), 1e-9);
}

TEST(SpecExpertTerm, RowsThatShareExpertsMakeDraftsCheaperAndThePolicyVerifiesMore) {
  SpecPolicy independent(moe_curve());
  SpecPolicy sharing(moe_curve());
  // A workload whose rows agree on experts: 5-row steps touch what 1.5 independent rows would.
  const SpecCostModel::Experts& e = sharing.cost_model().experts;
  for (int i = 0; i < 200; ++i) sharing.observe_experts(5, e.expected(5, 0.3));
  EXPECT_NEAR(sharing.rho(), 0.3, 1e-3);
  EXPECT_LT(sharing.step_cost(5), 0.8 * independent.step_cost(5));
  // The step cost follows the experts the rows add: exactly the curve's token part plus
  // 0.02 per expert touched at the learned rho.
  EXPECT_NEAR(sharing.step_cost(5), 1 + 0.04 + 0.02 * (e.expected(5, sharing.rho()) - 8), 1e-9);
  // One request, acceptance 0.6, up to 8 drafts: more verified where drafts add few experts.
  const SpecPolicy::Candidate c{.acceptance = 0.6, .max_k = 8};
  const int32_t k_independent = independent.choose(1, 1, 64, {&c, 1})[0];
  const int32_t k_sharing = sharing.choose(1, 1, 64, {&c, 1})[0];
  EXPECT_GT(k_sharing, k_independent);
  EXPECT_GE(k_sharing, 3);
  // Rows that touch more experts than the measurement's (rho 1.5): drafts dearer, fewer taken.
  SpecPolicy spreading(moe_curve());
  for (int i = 0; i < 200; ++i) spreading.observe_experts(5, e.expected(5, 1.5));
  EXPECT_GT(spreading.step_cost(5), independent.step_cost(5));
  EXPECT_LE(spreading.choose(1, 1, 64, {&c, 1})[0], k_independent);
}

TEST(SpecExpertTerm, DenseModelsAndUnknownCountsLeaveTheCurveAlone) {
  SpecCostModel dense{.points = {{1, 1.0}, {4, 1.3}, {8, 2.1}}};
  SpecPolicy p(dense);
  p.observe_experts(4, 3.0);
  EXPECT_EQ(p.rho(), 1.0);
  EXPECT_DOUBLE_EQ(p.step_cost(4), 1.3);
  SpecPolicy moe(moe_curve());
  moe.observe_experts(5, -1.0);  // the executor could not tell
  moe.observe_experts(1, 8.0);   // one row tells nothing about sharing
  EXPECT_NEAR(moe.rho(), 1.0, 1e-9);
}

}  // namespace
}  // namespace arbor::sched
