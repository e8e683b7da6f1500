#include "sched/spec_policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <queue>
#include <utility>

#include "base/status.h"

namespace arbor::sched {

namespace {

// y(i) at the curve's token counts, linear between them and extrapolated from the last two
// beyond; num_tokens > points[0] and at least two points (the callers handle the rest).
template <class Y>
double interpolate(const std::vector<std::pair<int32_t, double>>& points, size_t num_points,
                   const Y& y, int64_t num_tokens) {
  const auto n = static_cast<double>(num_tokens);
  for (size_t i = 1; i < num_points; ++i) {
    if (num_tokens <= points[i].first || i + 1 == num_points) {
      const double x0 = points[i - 1].first, x1 = points[i].first;
      return y(i - 1) + (y(i) - y(i - 1)) * (n - x0) / (x1 - x0);
    }
  }
  return y(num_points - 1);
}

}  // namespace

double SpecCostModel::cost(int64_t num_tokens) const {
  if (points.empty()) return 1.0;
  if (points.size() == 1 || num_tokens <= points.front().first) {
    const auto n = static_cast<double>(num_tokens);
    return points.front().second * std::max(n, 1.0) / std::max(points.front().first, 1);
  }
  return interpolate(points, points.size(), [&](size_t i) { return points[i].second; },
                     num_tokens);
}

double SpecCostModel::Experts::expected(double num_tokens, double rho) const {
  if (num_experts <= 0 || num_tokens <= 0) return 0.0;
  const double e = num_experts;
  return e * (1.0 - std::pow(1.0 - num_used / e, 1.0 + rho * (num_tokens - 1.0)));
}

double SpecCostModel::Experts::rho_of(double num_tokens, double touched) const {
  if (num_used >= num_experts || num_tokens < 2 || touched <= 0) return 1.0;
  const double e = num_experts;
  const double miss = std::log(1.0 - num_used / e);  // < 0 (K < E)
  const double x = std::clamp(touched, static_cast<double>(num_used), e - 0.5);
  return std::clamp((std::log(1.0 - x / e) / miss - 1.0) / (num_tokens - 1.0), kMinRho, kMaxRho);
}

double SpecCostModel::measured_experts(int64_t num_tokens) const {
  const std::vector<double>& x = experts.touched;
  const size_t m = std::min(x.size(), points.size());
  if (m == 0) return 0.0;
  if (m == 1 || num_tokens <= points.front().first) return x.front();
  return interpolate(points, m, [&](size_t i) { return x[i]; }, num_tokens);
}

double SpecCostModel::cost(int64_t num_tokens, double experts_touched) const {
  const double c = cost(num_tokens);
  if (!experts.active() || experts.touched.size() != points.size()) return c;
  const double corrected =
      c + experts.cost_per_expert * (experts_touched - measured_experts(num_tokens));
  return std::max(corrected, 0.05 * c);
}

double SpecCostModel::measured_rho() const {
  std::vector<double> rhos;
  for (size_t i = 0; i < experts.touched.size() && i < points.size(); ++i) {
    if (points[i].first >= 2) rhos.push_back(experts.rho_of(points[i].first, experts.touched[i]));
  }
  if (rhos.empty()) return 1.0;
  std::nth_element(rhos.begin(), rhos.begin() + rhos.size() / 2, rhos.end());
  return rhos[rhos.size() / 2];
}

std::vector<double> nondecreasing_fit(std::span<const double> costs) {
  // Blocks of pooled values: their sum and count, merged while a block's mean is below the one
  // before it.
  std::vector<double> sum;
  std::vector<int64_t> count;
  for (double c : costs) {
    sum.push_back(c);
    count.push_back(1);
    while (sum.size() >= 2) {
      const size_t b = sum.size() - 1;
      if (sum[b - 1] * static_cast<double>(count[b]) <= sum[b] * static_cast<double>(count[b - 1])) {
        break;  // mean[b - 1] <= mean[b]
      }
      sum[b - 1] += sum[b];
      count[b - 1] += count[b];
      sum.pop_back();
      count.pop_back();
    }
  }
  std::vector<double> out;
  out.reserve(costs.size());
  for (size_t b = 0; b < sum.size(); ++b) {
    out.insert(out.end(), static_cast<size_t>(count[b]), sum[b] / static_cast<double>(count[b]));
  }
  return out;
}

double fit_cost_per_expert(std::span<const ExpertCostPoint> distinct,
                           std::span<const ExpertCostPoint> repeated) {
  std::vector<double> slopes;
  for (const ExpertCostPoint& r : repeated) {
    for (const ExpertCostPoint& d : distinct) {
      if (d.num_tokens != r.num_tokens || d.touched - r.touched < 1.0) continue;
      slopes.push_back(std::max(0.0, (d.cost - r.cost) / (d.touched - r.touched)));
    }
  }
  if (slopes.empty()) return 0.0;
  std::sort(slopes.begin(), slopes.end());
  const size_t n = slopes.size();
  return n % 2 == 1 ? slopes[n / 2] : 0.5 * (slopes[n / 2 - 1] + slopes[n / 2]);
}

double SpecPolicy::step_cost(int64_t num_tokens) const {
  if (!cost_.experts.active()) return cost_.cost(num_tokens);
  return cost_.cost(num_tokens, cost_.experts.expected(static_cast<double>(num_tokens), rho_));
}

void SpecPolicy::observe_experts(int64_t num_tokens, double experts_touched) {
  if (!cost_.experts.active() || num_tokens < 2 || experts_touched <= 0) return;
  constexpr double kWeight = 0.05;  // about the last 20 decode steps
  const double rho = cost_.experts.rho_of(static_cast<double>(num_tokens), experts_touched);
  rho_ = (1 - kWeight) * rho_ + kWeight * rho;
}

// A chain's first draft is accepted with `acceptance`, each later one (given the earlier were)
// with `later` (`acceptance` if < 0).
double SpecPolicy::Candidate::gain(int32_t j) const {
  if (!gains.empty()) return gains[static_cast<size_t>(j)];
  return acceptance * std::pow(later < 0 ? acceptance : later, j);
}

void SpecPolicy::set_served_curve(double steepness, double overhead) {
  steepness_ = std::clamp(steepness, kMinSteepness, kMaxSteepness);
  overhead_ = std::clamp(overhead, 0.0, kMaxSpecOverhead);
}

double SpecPolicy::served_cost(int64_t num_tokens, bool drafts) const {
  return 1.0 + steepness_ * (step_cost(num_tokens) - 1.0) + (drafts ? overhead_ : 0.0);
}

namespace {

// Solves the symmetric 3 x 3 system a x = b (upper triangle of `a` given) by Gaussian elimination
// with partial pivoting; false when it is singular.
bool solve3(const double (&upper)[3][3], const double (&b)[3], double (&x)[3]) {
  double m[3][4];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m[i][j] = i <= j ? upper[i][j] : upper[j][i];
    m[i][3] = b[i];
  }
  for (int c = 0; c < 3; ++c) {
    int pivot = c;
    for (int r = c + 1; r < 3; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    }
    if (std::abs(m[pivot][c]) < 1e-300) return false;
    if (pivot != c) std::swap(m[pivot], m[c]);
    for (int r = c + 1; r < 3; ++r) {
      const double f = m[r][c] / m[c][c];
      for (int j = c; j < 4; ++j) m[r][j] -= f * m[c][j];
    }
  }
  for (int i = 2; i >= 0; --i) {
    double v = m[i][3];
    for (int j = i + 1; j < 3; ++j) v -= m[i][j] * x[j];
    x[i] = v / m[i][i];
  }
  return true;
}

// The least squares (upper, b) with x[2] = 0: the normal equations of x[0] and x[1] alone.
// False when they are singular or x[0] comes out <= 0.
bool solve_without_overhead(const double (&upper)[3][3], const double (&b)[3], double (&x)[3]) {
  const double det = upper[0][0] * upper[1][1] - upper[0][1] * upper[0][1];
  if (!(std::abs(det) > 1e-300)) return false;
  x[0] = (b[0] * upper[1][1] - upper[0][1] * b[1]) / det;
  x[1] = (upper[0][0] * b[1] - upper[0][1] * b[0]) / det;
  x[2] = 0.0;
  return x[0] > 0;
}

}  // namespace

double StepTimeFit::predict(double base, double rise, bool speculative) const {
  return u_ * base + v_ * rise + (speculative ? w_ : 0.0);
}

void StepTimeFit::observe(double base, double rise, bool speculative, double seconds) {
  if (!(seconds > 0) || !(base >= 1) || !(rise >= 0)) return;
  if (reference_ <= 0) reference_ = seconds / (base + rise);  // the first step: on the curve
  const double x[3] = {base, rise, speculative ? 1.0 : 0.0};
  for (int i = 0; i < 3; ++i) {
    for (int j = i; j < 3; ++j) xx_[i][j] = (1 - kWeight) * xx_[i][j] + kWeight * x[i] * x[j];
    xy_[i] = (1 - kWeight) * xy_[i] + kWeight * x[i] * seconds;
  }
  plain_ = (1 - kWeight) * plain_ + (speculative || rise > 0 ? 0.0 : kWeight);
  ++num_steps_;
  double a[3][3], b[3];
  for (int i = 0; i < 3; ++i) {
    for (int j = i; j < 3; ++j) a[i][j] = xx_[i][j];
    b[i] = xy_[i];
  }
  // Prior points p . (u, v, w) = y, each weighted as `steps` steps of the data (whose weights
  // sum to 1 / kWeight steps' worth).
  const auto prior = [&](double steps, std::array<double, 3> p, double y) {
    for (int i = 0; i < 3; ++i) {
      for (int j = i; j < 3; ++j) a[i][j] += steps * kWeight * p[i] * p[j];
      b[i] += steps * kWeight * p[i] * y;
    }
  };
  prior(kSteepnessPrior, {-1, 1, 0}, 0.0);
  prior(kOverheadPrior, {0, 0, 1}, 0.0);
  if (plain_ >= kMinPlainWeight) {
    prior(kUnitPrior, {1, 0, 0}, reference_);
    double fit[3];
    if (!solve3(a, b, fit) || !(fit[0] > 0)) return;
    // The policy never plans with a negative overhead (set_served_curve clamps it at 0), so
    // speculative steps cheaper than the curve say so through a flatter steepness instead: with
    // speculative steps all of one size the two trade off, and the priors put most of such a
    // difference into w (served on the 30B shape: w -0.84..-1.05 steps with the steepness held
    // at 1.0, which the policy then planned with as 1.0 and 0).
    if (fit[2] < 0 && !solve_without_overhead(a, b, fit)) return;
    u_ = fit[0];
    v_ = fit[1];
    w_ = fit[2];
    reference_ = u_;
    return;
  }
  // Too few plain 1-token steps to tell the unit from the slope: u stays the reference and the
  // steepness the last fitted, and w alone fits what speculative steps cost beyond them (least
  // squares of their residuals, with its prior).
  const double u = reference_;
  const double v = u * (u_ > 0 ? v_ / u_ : 1.0);
  const double residual = xy_[2] - u * xx_[0][2] - v * xx_[1][2];
  u_ = u;
  v_ = v;
  w_ = residual / (xx_[2][2] + kOverheadPrior * kWeight);
}

std::vector<double> tree_node_gains(double acceptance, std::span<const int32_t> parents,
                                    std::span<const float> probs) {
  const size_t n = parents.size();
  const auto p = [&](size_t i) { return probs.empty() ? 1.0 : static_cast<double>(probs[i]); };
  std::vector<double> best_child(n + 1, 0.0);  // [parent + 1]: max p among its children
  for (size_t i = 0; i < n; ++i) {
    double& b = best_child[static_cast<size_t>(parents[i] + 1)];
    b = std::max(b, p(i));
  }
  std::vector<double> missed(n + 1, 1.0);  // [parent + 1]: P(no earlier child accepted)
  std::vector<double> gain(n);
  for (size_t i = 0; i < n; ++i) {
    const auto at = static_cast<size_t>(parents[i] + 1);
    const double up = parents[i] < 0 ? 1.0 : gain[static_cast<size_t>(parents[i])];
    const double odds = acceptance * (best_child[at] > 0 ? p(i) / best_child[at] : 1.0);
    gain[i] = up * missed[at] * odds;
    missed[at] *= 1.0 - odds;
  }
  return gain;
}

void AcceptanceCalibration::observe(double estimate, bool agreed, double confidence) {
  const double x = std::clamp(estimate, 0.0, 1.0), y = agreed ? 1.0 : 0.0;
  const double keep = 1.0 - kWeight;
  n_ = keep * n_ + 1;
  sx_ = keep * sx_ + x;
  sy_ = keep * sy_ + y;
  sxx_ = keep * sxx_ + x * x;
  sxy_ = keep * sxy_ + x * y;
  if (confidence < 0) return;
  Plane& p = plane_;
  for (double* v : {&p.n, &p.x, &p.c, &p.y, &p.xx, &p.xc, &p.cc, &p.xy, &p.cy}) *v *= keep;
  p.add(1.0, x, std::clamp(confidence, 0.0, 1.0), y);
}

void AcceptanceCalibration::Plane::add(double w, double xi, double ci, double yi) {
  n += w;
  x += w * xi;
  c += w * ci;
  y += w * yi;
  xx += w * xi * xi;
  xc += w * xi * ci;
  cc += w * ci * ci;
  xy += w * xi * yi;
  cy += w * ci * yi;
}

AcceptanceCalibration::Sums AcceptanceCalibration::with_prior() const {
  constexpr double kLow = 0.2, kHigh = 0.9, w = kPriorWeight;
  const double sq = kLow * kLow + kHigh * kHigh;
  return {n_ + 2 * w, sx_ + w * (kLow + kHigh), sy_ + w * (kLow + kHigh), sxx_ + w * sq,
          sxy_ + w * sq};
}

AcceptanceCalibration::Plane AcceptanceCalibration::plane_with_prior() const {
  // Four points on probability = estimate, two confidences each: the fit starts as the
  // identity in the estimate with no confidence term.
  Plane p = plane_;
  for (double x : {0.2, 0.9}) {
    for (double c : {0.2, 0.9}) p.add(kPriorWeight, x, c, x);
  }
  return p;
}

bool AcceptanceCalibration::solve(const Plane& p, double& alpha, double& beta, double& gamma) {
  // Centred normal equations of y ~ alpha + beta x + gamma c.
  const double mx = p.x / p.n, mc = p.c / p.n, my = p.y / p.n;
  const double vxx = p.xx - p.n * mx * mx, vcc = p.cc - p.n * mc * mc, vxc = p.xc - p.n * mx * mc;
  const double vxy = p.xy - p.n * mx * my, vcy = p.cy - p.n * mc * my;
  const double det = vxx * vcc - vxc * vxc;
  if (!(det > 1e-12 * std::max(vxx * vcc, 1e-300))) return false;
  beta = (vcc * vxy - vxc * vcy) / det;
  gamma = (vxx * vcy - vxc * vxy) / det;
  alpha = my - beta * mx - gamma * mc;
  return true;
}

double AcceptanceCalibration::confidence_slope() const {
  if (plane_.n <= 0) return 0.0;
  double alpha = 0, beta = 0, gamma = 0;
  return solve(plane_with_prior(), alpha, beta, gamma) ? gamma : 0.0;
}

double AcceptanceCalibration::Sums::slope() const {
  const double var = xx - x * x / n;
  const double cov = xy - x * y / n;
  return var > 0 ? cov / var : 1.0;
}

double AcceptanceCalibration::slope() const { return with_prior().slope(); }

double AcceptanceCalibration::map(double estimate, double confidence) const {
  double alpha = 0, beta = 0, gamma = 0;
  if (confidence >= 0 && solve(plane_with_prior(), alpha, beta, gamma)) {
    const double x = std::clamp(estimate, 0.0, 1.0), c = std::clamp(confidence, 0.0, 1.0);
    return std::clamp(alpha + beta * x + gamma * c, 0.0, kMaxAcceptance);
  }
  const Sums s = with_prior();
  return std::clamp(s.y / s.n + s.slope() * (estimate - s.x / s.n), 0.0, kMaxAcceptance);
}

double acceptance_from_step(int32_t k, int32_t accepted) {
  if (accepted >= k) return kMaxAcceptance;
  return static_cast<double>(accepted) / (accepted + 1);
}

SpecPolicy::SpecPolicy(SpecCostModel cost, SpecPolicyOptions options)
    : cost_(std::move(cost)),
      rho_(cost_.measured_rho()),
      options_(options),
      global_(options.prior_acceptance) {}

void SpecPolicy::observe(double& estimate, int32_t k, int32_t accepted) {
  ARBOR_CHECK(k >= 1 && accepted >= 0 && accepted <= k) << k << " drafts, " << accepted;
  const double a = acceptance_from_step(k, accepted);
  const double w = options_.ema_weight;
  estimate = estimate < 0 ? (1 - w) * global_ + w * a : (1 - w) * estimate + w * a;
  global_ = (1 - w / 2) * global_ + (w / 2) * a;
}

void SpecPolicy::observe_first_draft(double estimate, bool agreed, double confidence) {
  calibration_.observe(raw_acceptance(estimate), agreed, confidence);
}

void SpecPolicy::observe_later_drafts(double estimate, int32_t k, int32_t accepted,
                                      std::span<const float> confidences) {
  ARBOR_CHECK(k >= 1 && accepted >= 0 && accepted <= k) << k << " drafts, " << accepted;
  ARBOR_CHECK(confidences.empty() || confidences.size() >= static_cast<size_t>(k))
      << confidences.size() << " confidences for " << k << " drafts";
  // Drafts 2 .. min(accepted + 1, k) were reached (their predecessors accepted).
  for (int32_t j = 2; j <= std::min(accepted + 1, k); ++j) {
    const double c = confidences.empty() ? -1.0 : confidences[static_cast<size_t>(j - 1)];
    later_calibration_.observe(raw_acceptance(estimate), accepted >= j, c);
  }
}

void SpecPolicy::calibrate(double estimate, int32_t k, int32_t accepted,
                           std::span<const float> confidences) {
  ARBOR_CHECK(confidences.empty() || confidences.size() >= static_cast<size_t>(k))
      << confidences.size() << " confidences for " << k << " drafts";
  observe_first_draft(estimate, accepted > 0, confidences.empty() ? -1.0 : confidences[0]);
  observe_later_drafts(estimate, k, accepted, confidences);
}

std::vector<double> SpecPolicy::chain_gains(double estimate,
                                            std::span<const float> confidences) const {
  std::vector<double> gains(confidences.size());
  double reach = 1.0;
  for (size_t j = 0; j < confidences.size(); ++j) {
    const double c = confidences[j];
    reach *= j == 0 ? acceptance(estimate, c) : later_acceptance(estimate, c);
    gains[j] = reach;
  }
  return gains;
}

std::vector<int32_t> SpecPolicy::choose(int64_t base_tokens, int64_t base_emitted,
                                        int64_t budget,
                                        std::span<const Candidate> candidates) const {
  std::vector<int32_t> k(candidates.size(), 0);
  double emitted = 0.0;  // expected tokens from the candidates beyond their first
  int64_t tokens = base_tokens;
  double drafts_cost = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i].fixed) continue;
    k[i] = static_cast<int32_t>(std::min<int64_t>(candidates[i].max_k, budget));
    budget -= k[i];
    tokens += k[i];
    drafts_cost += cost_.draft_cost * k[i];
    for (int32_t j = 1; j <= k[i]; ++j) emitted += candidates[i].gain(j - 1);
  }
  // Max-heap of the next draft's marginal gain a^(k+1) per adaptive candidate; drafts are taken
  // in that order and the best prefix is kept (the overhead makes the first draft of a step
  // dearer than the next ones, so the goodput need not rise at every draft).
  using Entry = std::pair<double, size_t>;
  std::priority_queue<Entry> heap;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i].fixed && candidates[i].max_k > 0) {
      heap.emplace(candidates[i].gain(0), i);
    }
  }
  const auto goodput = [&](double em, int64_t toks, double dcost) {
    const bool drafts = toks > base_tokens;
    return (base_emitted + em) / (served_cost(toks, drafts) + dcost);
  };
  double best = goodput(emitted, tokens, drafts_cost);
  std::vector<size_t> order;  // the adaptive drafts in the order taken
  size_t best_len = 0;
  while (!heap.empty() && budget > 0) {
    const auto [gain, i] = heap.top();
    heap.pop();
    ++k[i];
    --budget;
    ++tokens;
    emitted += gain;
    drafts_cost += cost_.draft_cost;
    order.push_back(i);
    const double g = goodput(emitted, tokens, drafts_cost);
    if (g > best) {
      best = g;
      best_len = order.size();
    }
    if (k[i] < candidates[i].max_k) heap.emplace(candidates[i].gain(k[i]), i);
  }
  for (size_t j = best_len; j < order.size(); ++j) --k[order[j]];
  return k;
}

}  // namespace arbor::sched
