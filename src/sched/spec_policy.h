// SpecPolicy: how many drafts each request verifies this step (0 = do not speculate), chosen to
// maximise goodput — expected committed tokens per unit of step time — over the whole batch, as
// SmartSpec / TurboSpec do. Speculation thereby switches itself off under load (when a step's
// cost grows with every token) and for requests whose drafts are rarely accepted.
//
// Model (docs/speculation.md, "Policy"):
//   * A request whose first draft is accepted with probability a, and each later one (given the
//     previous ones were) with probability c, emits E(k) = 1 + a (1 + c + ... + c^(k-1)) tokens
//     when it verifies k drafts. The request's estimate is an exponential moving average of
//     observed acceptance (accepted / drafted per step, fitted to the geometric model), starting
//     from the engine-wide average of all requests; a and c are that estimate calibrated by what
//     past estimates were worth (AcceptanceCalibration below) for first drafts and for later
//     drafts (a draft that agrees with its target on most tokens gets past the first draft far
//     more often than it passes the first: the uncertain tokens come first).
//   * Where the proposer gave its confidence in each draft of a chain (a draft model's
//     probability of it), each draft is priced by itself: its calibrated probability given the
//     request's estimate and its confidence, and a chain's j-th draft adds the product of its
//     and its predecessors' (chain_gains), so a chain is verified up to where the draft turns
//     unsure.
//   * A step of T tokens costs cost(T) (SpecCostModel, measured at startup by the executor),
//     and each draft costs draft_cost more (a draft model's forward; 0 for model-free proposers).
//   * A mixture of experts adds the expert term: a step's cost also grows with the distinct
//     experts X its rows are routed to (each expert's weights are read once per step), so the
//     curve is corrected by cost_per_expert x (X - the measured step's X). X is predicted as
//     E (1 - (1 - K/E)^(1 + rho (T - 1))) for E experts, K per token: the first row brings K,
//     each further row rho independent rows' worth (1 when rows route independently, 0 when
//     they all share the first row's experts). rho starts at the measured steps' and
//     follows the distinct experts the executor reports for each decode step (observe_experts),
//     so drafts of a workload whose rows agree on experts are planned as cheap as they are.
//   * The startup curve is one measurement; served steps correct it (StepTimeFit below, fed by
//     Scheduler::observe_step): a step of T tokens costs 1 + steepness (cost(T) - 1), and one
//     with drafts `overhead` more 1-token steps (proposing, draft-model catch-ups, bookkeeping).
//   * Drafts are added one at a time to the request with the largest marginal gain a^(k+1);
//     the policy keeps the prefix of that sequence with the highest sum(E) / (1 + steepness
//     (cost(T + sum k) - 1) + overhead + draft cost) (k = 0 for all when none beats no drafts).
//
// Threading: the engine thread (inside Scheduler::schedule()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace arbor::sched {

// Step time as a function of the number of tokens in the step, relative to a 1-token step.
struct SpecCostModel {
  // (num_tokens, relative cost) points with increasing num_tokens, the first at 1 token with
  // cost 1. Linear between points, extrapolated from the last two beyond. Empty = flat 1 (no
  // measurement: every extra token is free).
  std::vector<std::pair<int32_t, double>> points;
  // A mixture of experts' term (num_experts > 0; see the model above).
  struct Experts {
    int32_t num_experts = 0;  // E per layer; 0: a dense model, no term
    int32_t num_used = 0;     // K per token
    // [points.size()]: the distinct experts per layer the measured steps were routed to.
    std::vector<double> touched;
    // The cost of one more distinct expert per layer, relative to a 1-token step (>= 0).
    double cost_per_expert = 0.0;
    bool active() const { return num_experts > 0 && cost_per_expert > 0; }
    // What the K experts a 1-token step is routed to cost by this fit, relative to the whole
    // step (0 without the term). Above 1 the fit is impossible — a step's routed experts cannot
    // cost more than the step — and comes from steps measured while the machine stalled.
    double one_token_share() const { return active() ? num_used * cost_per_expert : 0.0; }
    // E (1 - (1 - K/E)^(1 + rho (T - 1))), in [K, E] for T >= 1.
    double expected(double num_tokens, double rho) const;
    // The rho whose expected(T) is `touched` (clamped to [kMinRho, kMaxRho]); T >= 2, 0 < X < E.
    double rho_of(double num_tokens, double touched) const;
  } experts;
  double draft_cost = 0.0;  // per proposed draft token, relative to a 1-token target step
  // The measured 1-token step in seconds (0 = unknown): the reference for observed step times
  // until plain decode steps have been seen (Scheduler::observe_step).
  double one_token_seconds = 0.0;
  double cost(int64_t num_tokens) const;
  // The curve corrected for a step whose rows touch `experts_touched` distinct experts per
  // layer (the measured steps' count when the term is inactive).
  double cost(int64_t num_tokens, double experts_touched) const;
  // The measured steps' distinct experts at num_tokens (interpolated as the curve is).
  double measured_experts(int64_t num_tokens) const;
  // The median rho of the measured steps of >= 2 tokens (1 without the term).
  double measured_rho() const;
};

inline constexpr double kMinRho = 0.0;
inline constexpr double kMaxRho = 2.0;

// The served curve's bounds (SpecPolicy::set_served_curve): its steepness relative to the startup
// curve's, and a speculative step's extra cost in 1-token steps.
// (Startup curves on one VM spread r(2) over 1.35-2.65; served steps put steepness at 0.5-1.4.)
inline constexpr double kMinSteepness = 0.5;
inline constexpr double kMaxSteepness = 2.0;
inline constexpr double kMaxSpecOverhead = 8.0;
// The highest acceptance rate the policy plans with (an estimate of 1 would make every chain
// look free of risk).
inline constexpr double kMaxAcceptance = 0.98;

// What an acceptance estimate is worth: the probability that a request's next first draft is
// accepted, as a linear function of the estimate the policy held for it, fitted by exponentially
// weighted least squares to every observed first draft (verified or declined) — the engine's
// own record of how well its estimates predict. An estimate is an exponential mean of few
// outcomes; after a run of luck it stands high, and the policy acts exactly then, so without
// this a weak draft (one whose outcomes do not cluster) would verify chains after its lucky runs
// and lose on a steep cost curve. Drafts whose outcomes are independent get a flat fit at
// their true rate; drafts that agree in runs (a good draft on familiar text) keep the slope that
// lets the estimate follow them. Starts as the identity (two prior points on it, weight
// kPriorWeight each).
//
// With the draft's confidence — the proposer's probability of the draft, step::DraftShape::
// probs — a second fit takes it as a second variable: probability ~ alpha + beta estimate +
// gamma confidence, fitted to the outcomes that came with one (its prior: four points on the
// plane probability = estimate, so it starts as the first fit's identity with gamma 0). A draft
// model's confidence tells which of a chain's drafts are the uncertain ones (where 4-bit weights
// or a smaller model's doubts move the argmax), so the policy can stop a chain before them
// (docs/speculation.md, "Confidence").
class AcceptanceCalibration {
 public:
  static constexpr double kWeight = 0.01;      // the newest outcome's weight (~100 outcomes)
  static constexpr double kPriorWeight = 1.0;  // each of the prior points (0.2, 0.2), (0.9, 0.9)
  // Folds in one draft: the estimate held before the step, whether it was accepted and, when
  // known (>= 0), the proposer's confidence in it (in [0, 1]).
  void observe(double estimate, bool agreed, double confidence = -1.0);
  // The fitted probability for `estimate` (and `confidence`, when >= 0), within
  // [0, kMaxAcceptance].
  double map(double estimate, double confidence = -1.0) const;
  double slope() const;
  // The second fit's coefficient of the confidence (0 before any outcome with one).
  double confidence_slope() const;

 private:
  // Weighted sums of 1, x, y, x^2, xy.
  struct Sums {
    double n, x, y, xx, xy;
    double slope() const;
  };
  // The outcomes' sums plus the prior points' (which do not decay: the fit keeps its anchor
  // where outcomes are few, and outcomes outweigh it ~100:2 once there are many).
  Sums with_prior() const;
  double n_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // the outcomes' decayed sums
  // The second fit: the outcomes' decayed weighted sums of 1, x, c, y, xx, xc, cc, xy, cy over
  // the outcomes that came with a confidence c.
  struct Plane {
    double n = 0, x = 0, c = 0, y = 0, xx = 0, xc = 0, cc = 0, xy = 0, cy = 0;
    void add(double w, double xi, double ci, double yi);
  };
  Plane plane_with_prior() const;
  // (alpha, beta, gamma); false when the fit is degenerate.
  static bool solve(const Plane& p, double& alpha, double& beta, double& gamma);
  Plane plane_;
};

// What served steps say of the step-cost curve (docs/speculation.md, "Served steps"). The
// startup curve is one measurement of a server still cold, perhaps while the machine stalled: on
// a VM its steepness spread r(2) = 1.35-2.65 between servers of one model, and a curve too steep
// by half keeps every draft from paying. Each decode step's seconds are fitted, by exponentially
// weighted least squares, to
//     seconds = u base + v rise + w [speculative]
// where base is 1 plus the draft model's proposals at their measured cost, rise the startup
// curve's cost of the step less 1 (SpecPolicy::step_cost(T) - 1, with the expert term) and
// [speculative] 1 for a step that verified drafts (or proposed costly ones): u is a 1-token step's
// seconds now, v / u the steepness (1: the startup curve's) and w / u what speculating adds, in
// 1-token steps. Only plain 1-token steps tell u from v: while they weigh less than one recent
// step (several streams, whose steps all have rows to spare — fitted freely, their intercept,
// an extrapolation to one row, swung from 20 to 816 ms on the 30B shape with 4 and 16 streams —
// or an engine that speculates in every step), u stays the reference (the startup 1-token time,
// then the last u fitted with such steps), the steepness the last fitted, and w alone fits what
// speculative steps cost beyond them. Priors, never decaying, hold the fit where steps cannot
// tell: v = u (steepness 1), w = 0 and u = the reference (speculative steps all of one size
// cannot tell steepness from overhead: the priors split them, and the prediction at that size is
// the data's either way) — but w is never fitted below 0 (the policy clamps it there), so steps
// cheaper than the curve flatten the steepness instead. Their weights, in steps, were chosen on
// simulated series (plain steps 1 in 9 or 1 in 20, the reference 2x off, +-10 % noise): the
// prediction stays within 3 % where the sizes vary.
class StepTimeFit {
 public:
  static constexpr double kWeight = 0.02;  // the newest step's weight (~50 steps)
  static constexpr double kUnitPrior = 0.1, kSteepnessPrior = 0.1, kOverheadPrior = 0.03;
  // The decayed weight of plain steps below which u is not fitted (one recent step's).
  static constexpr double kMinPlainWeight = kWeight;
  // reference_seconds: a 1-token step's seconds (the startup measurement; 0: the first step's
  // seconds over its base + rise).
  explicit StepTimeFit(double reference_seconds = 0.0)
      : reference_(reference_seconds), u_(reference_seconds), v_(reference_seconds) {}
  // Folds in one decode step (base >= 1, rise >= 0, seconds > 0; anything else is ignored).
  void observe(double base, double rise, bool speculative, double seconds);
  // The fitted seconds of such a step (0 before any step without a reference).
  double predict(double base, double rise, bool speculative) const;
  double unit_seconds() const { return u_; }
  double steepness() const { return u_ > 0 ? v_ / u_ : 1.0; }
  double overhead() const { return u_ > 0 ? w_ / u_ : 0.0; }
  int64_t num_steps() const { return num_steps_; }

 private:
  // The data's decayed weighted sums: x x^T (upper triangle of the 3 x 3) and x y.
  double xx_[3][3] = {};
  double xy_[3] = {};
  double plain_ = 0.0;  // the decayed weight of plain 1-token steps (rise 0)
  double reference_ = 0.0;
  double u_ = 0.0, v_ = 0.0, w_ = 0.0;
  int64_t num_steps_ = 0;
};

struct SpecPolicyOptions {
  double prior_acceptance = 0.7;  // the engine-wide estimate before any observation
  double ema_weight = 0.25;       // weight of the newest step in an estimate
};

class SpecPolicy {
 public:
  SpecPolicy(SpecCostModel cost, SpecPolicyOptions options = {});

  struct Candidate {
    double acceptance = 0.0;  // its first draft's probability (acceptance() of its estimate)
    // A chain's later drafts' probability given the earlier ones were accepted
    // (later_acceptance() of its estimate); < 0: `acceptance`.
    double later = -1.0;
    int32_t max_k = 0;        // drafts available and allowed, >= 0
    bool fixed = false;       // verify max_k whatever the cost (mode "fixed")
    // [>= max_k] the expected tokens each draft adds (the probability that it is accepted): a
    // token tree's nodes in order (tree_node_gains()), or a chain whose drafts came with the
    // proposer's confidence (chain_gains()). Empty: a chain whose j-th draft adds a c^(j-1).
    std::span<const double> gains;
    // The expected tokens the j-th draft (0-based, j < max_k) adds: gains[j], or a c^j.
    double gain(int32_t j) const;
  };
  // k for each candidate (fixed ones get max_k, within the budget), given that the step already
  // runs `base_tokens` tokens (prefill chunks and one token per decoding request), emits
  // `base_emitted` tokens without drafts (one per sampling request, candidates included), and
  // `budget` more tokens may be added. Greedy in marginal gain, best prefix kept.
  // O(sum of max_k * log(n)).
  std::vector<int32_t> choose(int64_t base_tokens, int64_t base_emitted, int64_t budget,
                              std::span<const Candidate> candidates) const;

  // The acceptance rate the policy plans with for a request: its estimate (`estimate` >= 0, else
  // the engine-wide one), calibrated (AcceptanceCalibration).
  double acceptance(double estimate, double confidence = -1.0) const {
    return calibration_.map(raw_acceptance(estimate), confidence);
  }
  // The estimate itself, uncalibrated.
  double raw_acceptance(double estimate) const { return estimate >= 0 ? estimate : global_; }
  // Folds in one verification (k >= 1 drafts, `accepted` of them) into a request's `estimate`
  // (in/out; < 0 = none yet) and the engine-wide estimate.
  void observe(double& estimate, int32_t k, int32_t accepted);
  // The first draft of a request whose estimate was `estimate` (< 0: none yet) when the step was
  // planned was (`agreed`) or was not the token sampled: the calibration learns from it.
  void observe_first_draft(double estimate, bool agreed, double confidence = -1.0);
  // Both calibrations learn from a chain of k drafts (k = 1: a declined step's reported first
  // draft) of which `accepted` were, planned with `estimate`, with the proposer's confidence in
  // each (`confidences`: [>= k], or empty: none): observe_first_draft and observe_later_drafts.
  void calibrate(double estimate, int32_t k, int32_t accepted,
                 std::span<const float> confidences = {});
  const AcceptanceCalibration& calibration() const { return calibration_; }
  // A verified chain of k drafts of which `accepted` were, planned with `estimate`: the later
  // drafts' calibration learns from drafts 2 .. accepted + 1 (those reached), with their
  // confidences when given ([>= k]).
  void observe_later_drafts(double estimate, int32_t k, int32_t accepted,
                            std::span<const float> confidences = {});
  // The expected tokens each draft of a chain adds (SpecPolicy::Candidate::gains) when the
  // proposer gave its confidence in each ([k]): the probability that the chain is accepted up
  // to it, the first draft at acceptance(estimate, confidence) and each later one at
  // later_acceptance(estimate, confidence).
  std::vector<double> chain_gains(double estimate, std::span<const float> confidences) const;
  // c of the model above for a request's estimate (< 0: the engine-wide one), calibrated.
  double later_acceptance(double estimate, double confidence = -1.0) const {
    return later_calibration_.map(raw_acceptance(estimate), confidence);
  }
  const AcceptanceCalibration& later_calibration() const { return later_calibration_; }

  const SpecCostModel& cost_model() const { return cost_; }
  // A draft token's cost as served steps measure it (SpecCostModel::draft_cost, >= 0).
  void set_draft_cost(double draft_cost) { cost_.draft_cost = std::max(0.0, draft_cost); }
  // A step's relative cost as the policy predicts it: the curve, with the expert term at the
  // current rho.
  double step_cost(int64_t num_tokens) const;
  // A decode step of num_tokens rows touched `experts_touched` distinct experts per layer
  // (StepResult::experts_touched): rho learns from it (steps of >= 2 rows; no-op without the
  // term).
  void observe_experts(int64_t num_tokens, double experts_touched);
  double rho() const { return rho_; }

  // What served steps say (StepTimeFit): the curve's steepness relative to the startup one's,
  // clamped to [kMinSteepness, kMaxSteepness], and what a step with drafts costs more, in 1-token
  // steps, clamped to [0, kMaxSpecOverhead]. Start at 1 and 0.
  void set_served_curve(double steepness, double overhead);
  double steepness() const { return steepness_; }
  double overhead() const { return overhead_; }
  // The relative cost the policy plans with for a step of num_tokens: 1 + steepness
  // (step_cost(num_tokens) - 1), plus the overhead when it verifies drafts.
  double served_cost(int64_t num_tokens, bool drafts) const;

 private:
  SpecCostModel cost_;
  double steepness_ = 1.0;
  double overhead_ = 0.0;
  double rho_ = 1.0;
  SpecPolicyOptions options_;
  double global_;
  AcceptanceCalibration calibration_;
  AcceptanceCalibration later_calibration_;
};

// One measured step for the expert term's fit: its tokens, its relative cost and the distinct
// experts per layer its rows touched.
struct ExpertCostPoint {
  int32_t num_tokens = 0;
  double cost = 0.0;
  double touched = 0.0;
};

// The nondecreasing sequence nearest to `costs` in least squares (pool adjacent violators, equal
// weights): a measured step-cost series in order of step size, whose noise (a VM's stalls) can
// make a larger step look cheaper than a smaller one, which a step never is. Pools of violating
// neighbours become their mean; a nondecreasing input comes back unchanged. [costs.size()]
std::vector<double> nondecreasing_fit(std::span<const double> costs);

// The cost of one more distinct expert per layer, from two series of steps of equal sizes whose
// rows touch many experts (`distinct`: distinct tokens) and few (`repeated`: one token
// repeated): the median over the sizes present in both, with at least one more expert in
// `distinct`, of cost difference / expert difference (>= 0); 0 when no size qualifies.
double fit_cost_per_expert(std::span<const ExpertCostPoint> distinct,
                           std::span<const ExpertCostPoint> repeated);

// The expected tokens each node of a token tree adds (the policy's Candidate::gains): the
// probability that it is accepted. A child is tried with odds o = a * p / max p over its
// siblings (a: the acceptance estimate per level; p: the proposer's probabilities, empty = all
// equal), after its earlier siblings failed: gain = gain(parent) * o * prod(1 - o') over the
// earlier siblings. A chain gets a, a^2, ...; a node's children add at most its own gain.
// parents: [n] (step::kDraftRoot or earlier). O(n).
std::vector<double> tree_node_gains(double acceptance, std::span<const int32_t> parents,
                                    std::span<const float> probs);

// The acceptance rate a of the geometric model that best explains `accepted` of `k` drafts
// accepted in one step: the maximum-likelihood a = accepted / (accepted + 1) when the run ended
// in a rejection (accepted < k), and 1 when all were accepted (capped at 0.98 here).
double acceptance_from_step(int32_t k, int32_t accepted);

}  // namespace arbor::sched
