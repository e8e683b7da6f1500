#include "sched/draft_planner.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "base/log.h"

namespace arbor::sched {

namespace {

// The longest prefix of `req`'s drafts no deeper than max_depth (parents come first, so a prefix
// is a tree; the executor proposes within the depth it was asked for, which only the tokens
// accepted since can lower).
int32_t prefix_within_depth(const Request& req, int32_t max_depth) {
  const std::vector<int32_t> depth = step::draft_depths(req.spec.drafts.parent_ids);
  int32_t k = 0;
  while (k < static_cast<int32_t>(depth.size()) && depth[static_cast<size_t>(k)] <= max_depth) ++k;
  return k;
}

int32_t levels_of(const Request& req, int32_t k) {
  return step::draft_levels(std::span<const int32_t>(req.spec.drafts.parent_ids).first(
      static_cast<size_t>(k)));
}

bool is_fixed(const Request& req) { return req.spec.params.mode == SpecMode::kFixed; }

}  // namespace

bool DraftPlanner::negligible_draft_cost() const {
  return options_.cost.draft_cost > 0 &&
         draft_cost() * options_.max_spec_tokens <= kNegligibleDraftCost;
}

DraftPlanner::DraftPlanner(DraftPlannerOptions options)
    : options_(std::move(options)),
      policy_(options_.cost, options_.policy),
      served_(options_.cost.one_token_seconds) {}

int32_t DraftPlanner::max_drafts(const Request& req, int64_t extra_tokens) const {
  if (options_.max_spec_tokens == 0 || req.spec.params.mode == SpecMode::kOff ||
      req.is_fork_parent()) {
    return 0;
  }
  int64_t k = options_.max_spec_tokens;
  if (req.spec.params.k > 0) k = std::min<int64_t>(k, req.spec.params.k);
  k = std::min(k, req.stop.max_tokens - req.num_output_tokens() - extra_tokens - 1);
  if (options_.max_model_len > 0) {
    k = std::min(k, options_.max_model_len - req.num_tokens() - extra_tokens - 1);
  }
  return static_cast<int32_t>(std::max<int64_t>(k, 0));
}

void DraftPlanner::choose_drafts(std::span<RequestPlan> plans, int64_t& budget,
                                 const FitsFn& fits) {
  std::vector<RequestPlan*> index;
  std::vector<SpecPolicy::Candidate> candidates;
  std::vector<std::vector<double>> gains;  // [candidates] a tree's node gains; empty: a chain
  int64_t base_emitted = 0, base_tokens = 0;
  for (RequestPlan& p : plans) {
    base_tokens += p.num_new;
    if (!p.sample) continue;
    ++base_emitted;
    const Request& req = *p.req;
    if (req.spec.drafts.empty() || p.num_new != 1) continue;
    const int32_t max_k = prefix_within_depth(req, max_drafts(req, 0));
    if (max_k <= 0) continue;
    index.push_back(&p);
    const double a = policy_.acceptance(req.spec.acceptance);
    const auto parents = std::span<const int32_t>(req.spec.drafts.parent_ids).first(max_k);
    const auto probs = std::span<const float>(req.spec.drafts.probs)
                           .first(req.spec.drafts.probs.empty() ? 0 : static_cast<size_t>(max_k));
    // A chain whose proposer gave its confidence in each draft is priced draft by draft.
    gains.push_back(!step::is_chain(parents) ? tree_node_gains(a, parents, probs)
                    : probs.empty()          ? std::vector<double>{}
                                             : policy_.chain_gains(req.spec.acceptance, probs));
    const double later = policy_.later_acceptance(req.spec.acceptance);
    candidates.push_back(SpecPolicy::Candidate{
        .acceptance = a, .later = later, .max_k = max_k, .fixed = is_fixed(req)});
  }
  if (candidates.empty()) {
    if (base_emitted > 0) ++declined_steps_;
    return;
  }
  for (size_t c = 0; c < candidates.size(); ++c) candidates[c].gains = gains[c];
  std::vector<int32_t> k = policy_.choose(base_tokens, base_emitted, budget, candidates);
  explore(candidates, budget, k);
  for (size_t c = 0; c < candidates.size(); ++c) {
    RequestPlan& p = *index[c];
    ++num_candidates_;
    int32_t kc = k[c];
    if (kc > 0 && !fits(p, kc)) kc = 0;
    if (kc == 0) decline(*p.req, candidates[c].fixed);
    p.num_drafts = kc;
    budget -= kc;
  }
}

// The served curve learns only from the steps the policy runs: on a startup curve too steep for
// any draft to pay, a negligible or model-free drafter's drafts would be declined for good and
// the curve never corrected. So after kProbeInterval sampling steps in a row that verify no
// draft (a model-free proposer proposes again for the last of them, plan_next), the
// candidate whose first draft is likeliest verifies the drafts it reaches with probability >=
// kProbeReach (none when its first is below that: a draft that weak pays on no curve worth
// probing): the step's time teaches the fit what such a step costs.
void DraftPlanner::explore(std::span<const SpecPolicy::Candidate> candidates, int64_t budget,
                           std::vector<int32_t>& k) {
  const bool costly = options_.cost.draft_cost > 0 && !negligible_draft_cost();
  if (costly || std::any_of(k.begin(), k.end(), [](int32_t v) { return v > 0; })) {
    declined_steps_ = 0;
    return;
  }
  if (++declined_steps_ < kProbeInterval) return;
  size_t best = 0;
  for (size_t c = 1; c < candidates.size(); ++c) {
    if (candidates[c].gain(0) > candidates[best].gain(0)) best = c;
  }
  int32_t depth = 0;
  while (depth < candidates[best].max_k && depth < budget &&
         candidates[best].gain(depth) >= kProbeReach) {
    ++depth;
  }
  declined_steps_ = 0;
  if (depth == 0) return;
  k[best] = depth;
  ++num_probes_;
}

void DraftPlanner::decline(Request& req, bool fixed) {
  ++num_declined_;
  if (fixed) return;
  SpecState& s = req.spec;
  s.backoff_next = s.backoff_next == 0 ? kSpecBackoffSteps
                                       : std::min(2 * s.backoff_next, kSpecMaxBackoffSteps);
  s.backoff_steps = s.backoff_next;
}

// How many levels to ask the executor to propose after a step in which `req` verifies `levels`
// of them: all that may be used when proposing is free (model-free proposers); with a draft
// model, one more than this step's, none for a while after the policy declined them (then it
// probes again).
int32_t DraftPlanner::next_depth(const Request& req, int32_t levels) const {
  const int32_t cap = max_drafts(req, 1);  // after this step at least one more token is committed
  if (options_.cost.draft_cost <= 0 || is_fixed(req) || negligible_draft_cost()) return cap;
  if (req.spec.backoff_steps > 0) return 0;
  return std::min(cap, levels + 1);
}

// The most tree nodes to ask for after a step in which `req` verifies `verified` drafts: the
// request's cap within the engine's budget (0: chains); with a draft model, whose tree costs
// forwards, at most twice what the policy took this step (at least 4), so trees shrink under
// load and grow back when they pay.
int32_t DraftPlanner::next_nodes(const Request& req, int32_t verified) const {
  int32_t cap = options_.max_tree_nodes;
  if (req.spec.params.tree_nodes >= 0) cap = std::min(cap, req.spec.params.tree_nodes);
  if (cap > 0 && options_.cost.draft_cost > 0 && !is_fixed(req)) {
    cap = std::min(cap, std::max(4, 2 * verified));
  }
  return cap;
}

int32_t DraftPlanner::admission_lookahead(const Request& req, bool sample) const {
  if (!options_.reserve_draft_slots || !sample) return 0;
  const int32_t depth = next_depth(req, 0);
  if (depth == 0) return 0;
  const int32_t nodes = next_nodes(req, 0);
  return std::max(depth, nodes > 0 ? nodes + 1 : 0);
}

// Whether a draft could pay in this step at all: the policy would give drafts (up to
// max_spec_tokens of a chain: on a steep cost curve, a mixture's, one draft may not pay where
// several do) to a request with the engine-wide acceptance estimate. When not (a loaded step,
// or a costly draft model whose drafts are rarely accepted), nobody proposes for the next step,
// so the draft model costs nothing: no proposals and no catch-up over the tokens it skipped.
bool DraftPlanner::drafts_may_pay(std::span<const RequestPlan> plans, int64_t budget) const {
  int64_t tokens = 0, emitted = 0;
  for (const RequestPlan& p : plans) {
    tokens += p.num_new + p.num_drafts;
    emitted += p.sample ? 1 : 0;
  }
  const SpecPolicy::Candidate best{.acceptance = policy_.acceptance(-1.0),
                                   .later = policy_.later_acceptance(-1.0),
                                   .max_k = std::max(options_.max_spec_tokens, 1)};
  return policy_.choose(tokens, emitted, std::max<int64_t>(budget, 1), {&best, 1})[0] > 0;
}

// A draft model's proposals cost forwards, and a request whose draft model is behind (it asked
// for no drafts last step) first costs a catch-up over the tokens it skipped — its whole prompt
// at first. So: nobody proposes in a step where no draft could pay, and in a step with more than
// two sampling requests a request whose draft model is behind starts only when its catch-up is
// cheap (kMaxDraftCatchUpCost; early in a request's life with a small draft model).
void DraftPlanner::limit_draft_model_asks(std::span<RequestPlan> plans, int64_t budget) {
  const bool may_pay = drafts_may_pay(plans, budget);
  const bool negligible = negligible_draft_cost();
  int64_t num_sampling = 0;
  for (const RequestPlan& p : plans) num_sampling += p.sample ? 1 : 0;
  bool probe = false;
  if (may_pay || negligible) {
    steps_since_probe_ = 0;
  } else if (num_sampling > 0 && ++steps_since_probe_ >= kProbeInterval) {
    probe = true;
  }
  for (RequestPlan& p : plans) {
    Request& req = *p.req;
    // An MTP head keeps up by itself: nobody is behind it.
    const double catch_up =
        options_.draft_keeps_up
            ? 0.0
            : static_cast<double>(req.num_tokens() - req.spec.draft_synced_tokens) *
                  draft_cost();
    const bool costly_catch_up = !options_.draft_keeps_up && !req.spec.draft_in_sync &&
                                 num_sampling > 2 && catch_up > kMaxDraftCatchUpCost;
    // A draft model of negligible cost keeps proposing where no draft pays (its first draft
    // still teaches the acceptance estimates: observe_unverified); a costly one probes.
    if (!is_fixed(req) && ((!may_pay && !negligible) || costly_catch_up)) {
      if (probe && p.sample && p.ask_depth > 0 && catch_up <= kMaxDraftCatchUpCost) {
        probe = false;
        steps_since_probe_ = 0;
        ++num_probes_;
        p.ask_depth = 1;
      } else {
        p.ask_depth = 0;
      }
    }
    if (!p.sample) continue;
    req.spec.draft_in_sync = p.ask_depth > 0;
    // The draft model will have seen everything up to this step's sampled token.
    if (req.spec.draft_in_sync) req.spec.draft_synced_tokens = req.num_tokens() + 1;
  }
}

// A drafter whose tokens cost (not negligible): each request asks for no more levels than the
// policy would verify for it in a step like this one with its own estimate — a draft token
// proposed and never verified is paid for nothing (the MTP head's: a third of a step), and a
// rising estimate raises the ask by itself.
void DraftPlanner::limit_to_policy(std::span<RequestPlan> plans, int64_t budget) const {
  int64_t tokens = 0, emitted = 0;
  for (const RequestPlan& p : plans) {
    tokens += p.num_new + p.num_drafts;
    emitted += p.sample ? 1 : 0;
  }
  for (RequestPlan& p : plans) {
    if (p.ask_depth <= 0 || is_fixed(*p.req)) continue;
    const SpecPolicy::Candidate c{.acceptance = policy_.acceptance(p.req->spec.acceptance),
                                  .later = policy_.later_acceptance(p.req->spec.acceptance),
                                  .max_k = p.ask_depth};
    const int32_t k = policy_.choose(tokens, emitted, std::max<int64_t>(budget, 1), {&c, 1})[0];
    p.ask_depth = std::max(1, k);  // 0 where none pays: limit_draft_model_asks decides those
  }
}

void DraftPlanner::plan_next(std::span<RequestPlan> plans, int64_t budget_left,
                             const FitsFn& fits) {
  for (RequestPlan& p : plans) {
    p.ask_depth = p.sample ? next_depth(*p.req, levels_of(*p.req, p.num_drafts)) : 0;
  }
  if (options_.cost.draft_cost > 0 && !negligible_draft_cost() && options_.max_tree_nodes == 0) {
    limit_to_policy(plans, budget_left);
  }
  if (options_.cost.draft_cost > 0) {
    limit_draft_model_asks(plans, budget_left);
  } else if (options_.max_spec_tokens > 0 && declined_steps_ + 1 < kProbeInterval &&
             !drafts_may_pay(plans, budget_left)) {
    // Model-free proposers cost no forward, but proposing still costs the engine thread time
    // (suffix tries); in a step where no draft could pay, nobody proposes (but before a probe,
    // explore()).
    for (RequestPlan& p : plans) {
      if (!is_fixed(*p.req)) p.ask_depth = 0;
    }
  }
  for (RequestPlan& p : plans) {
    p.ask_nodes = p.ask_depth > 0 ? next_nodes(*p.req, p.num_drafts) : 0;
    if (!options_.reserve_draft_slots || p.ask_depth == 0) continue;
    // A draft model's tree forwards write up to ask_nodes tokens after the tokens committed by
    // this step (up to k + 1 of them).
    const int32_t lookahead = std::max(p.ask_depth, p.ask_nodes > 0 ? p.ask_nodes + 1 : 0);
    if (!fits(p, p.num_drafts + lookahead)) p.ask_depth = p.ask_nodes = 0;
  }
}

void DraftPlanner::observe_verification(Request& req, std::span<const int32_t> parents,
                                        int32_t accepted, int32_t next_agreed,
                                        std::span<const float> probs) {
  SpecState& s = req.spec;
  if (s.backoff_steps > 0) --s.backoff_steps;
  if (parents.empty()) return;
  if (accepted > 0) s.backoff_next = 0;
  const int32_t levels = step::draft_levels(parents);
  const bool chain = levels == static_cast<int32_t>(parents.size());
  // A chain accepted whole with the kept draft after it reported: learn from one level more.
  const int32_t extra = chain && accepted == levels && next_agreed >= 0 ? 1 : 0;
  const int32_t learned = accepted + (extra == 1 ? next_agreed : 0);
  // Chains only: a tree's first level has several chances. The confidences of the drafts
  // learned from, when the proposer gave them.
  const bool confident = probs.size() >= static_cast<size_t>(levels + extra);
  if (chain) {
    policy_.calibrate(s.acceptance, levels + extra, learned,
                      confident ? probs.first(static_cast<size_t>(levels + extra))
                                : std::span<const float>());
  }
  policy_.observe(s.acceptance, levels + extra, learned);
  ++s.stats.num_verify_steps;
  s.stats.num_draft_tokens += static_cast<int64_t>(parents.size());
  s.stats.num_accepted_tokens += accepted;
}

void DraftPlanner::observe_unverified(Request& req, bool agreed, float confidence) {
  const std::span<const float> c = confidence >= 0 ? std::span<const float>(&confidence, 1)
                                                   : std::span<const float>();
  policy_.calibrate(req.spec.acceptance, 1, agreed ? 1 : 0, c);
  policy_.observe(req.spec.acceptance, 1, agreed ? 1 : 0);
}

void DraftPlanner::observe_step(const step::SchedulerOutput& out, double seconds,
                                double experts_touched, double propose_seconds) {
  int64_t drafts = 0, proposals = 0;
  for (const step::ScheduledRequest& s : out.requests) {
    drafts += s.num_draft_tokens();
    proposals += s.max_next_draft_tokens;
  }
  observe_proposals(proposals, propose_seconds);
  for (const step::ScheduledRequest& s : out.requests) {
    if (s.num_scheduled_tokens != 1 + s.num_draft_tokens()) return;  // a prefill chunk
  }
  if (out.requests.empty() || !(seconds > 0)) return;
  policy_.observe_experts(out.total_num_scheduled_tokens, experts_touched);
  const double base = 1.0 + draft_cost() * static_cast<double>(proposals);
  const double rise = policy_.step_cost(out.total_num_scheduled_tokens) - 1.0;
  // A draft model of negligible cost proposes in every step: its steps that verify nothing are
  // plain ones (their proposals are in `base`).
  const bool speculative = drafts > 0 || (proposals > 0 && !negligible_draft_cost());
  // A server's first steps of each kind touch pages and scratch for the first time (the first
  // speculative ones were 1.5x the rest on the Qwen3.5-2B + MTP head): they are not the curve,
  // and with a costly drafter one of them would keep speculation off until probes corrected
  // it. So the first kWarmupSteps of each kind are skipped, and a step more than kMaxJump times
  // the fit's prediction counts as kMaxJump times it (a noisy neighbour's stall).
  int64_t& seen = speculative ? spec_steps_seen_ : plain_steps_seen_;
  if (++seen <= kWarmupSteps) return;
  const double predicted = served_.predict(base, rise, speculative);
  const double sample =
      served_.num_steps() > 0 && predicted > 0 ? std::min(seconds, kMaxJump * predicted) : seconds;
  served_.observe(base, rise, speculative, sample);
  policy_.set_served_curve(served_.steepness(), served_.overhead());
  log_served_curve();
}

// A draft token's cost at startup is one bare forward of the draft model on an empty context;
// serving, a proposal also reads its request's context, picks each draft from the whole row
// (penalties, its probability) and runs the catch-ups of requests that were behind. So the draft
// cost the policy plans with (and which makes a drafter negligible or costly) follows the
// measured proposing time per draft token asked for, relative to the served 1-token step: an
// exponential mean (newest 5 %) after the first kWarmupSteps, a sample above kMaxJump times the
// mean counting as that (a request's first proposal runs its prompt's catch-up). stories260K
// beside the 30B shape: 0.0016 of a step served against 0.0014 at startup.
void DraftPlanner::observe_proposals(int64_t proposals, double propose_seconds) {
  const double unit = served_.unit_seconds();
  if (proposals <= 0 || !(propose_seconds > 0) || !(unit > 0)) return;
  if (++propose_steps_seen_ <= kWarmupSteps) return;
  constexpr double kDraftWeight = 0.05;
  const double sample = propose_seconds / static_cast<double>(proposals) / unit;
  const double now = draft_cost();
  const double clamped = now > 0 ? std::min(sample, kMaxJump * now) : sample;
  policy_.set_draft_cost(now > 0 ? (1 - kDraftWeight) * now + kDraftWeight * clamped : clamped);
}

// Logged after the first kLogFirstSteps fitted steps and then at most every kLogEverySteps, when
// the steepness moved by a quarter or the overhead by a quarter of a step since last logged: a
// fit of ~50 noisy steps moves that much within seconds (logging every such move wrote 33-46
// lines in 3 minutes on the 30B shape).
void DraftPlanner::log_served_curve() {
  const double steep = policy_.steepness(), extra = policy_.overhead();
  const int64_t n = served_.num_steps();
  if (n < kLogFirstSteps || (logged_at_ > 0 && n < logged_at_ + kLogEverySteps)) return;
  if (logged_at_ > 0 && steep < 1.25 * logged_steepness_ && steep > logged_steepness_ / 1.25 &&
      std::abs(extra - logged_overhead_) < 0.25 && draft_cost() < 1.25 * logged_draft_cost_ &&
      draft_cost() > logged_draft_cost_ / 1.25) {
    return;
  }
  logged_at_ = n;
  logged_steepness_ = steep;
  logged_overhead_ = extra;
  logged_draft_cost_ = draft_cost();
  const SpecCostModel& c = policy_.cost_model();
  ARBOR_LOG(kInfo) << "speculation: served steps put a 2-token step at "
                   << policy_.served_cost(2, false) << " (startup curve " << policy_.step_cost(2)
                   << "; steepness " << steep << "x) and a speculative step's extra cost at "
                   << extra << " of a 1-token step, "
                   << served_.unit_seconds() * 1e3 << " ms (startup "
                   << c.one_token_seconds * 1e3 << " ms); a draft token "
                   << draft_cost() << " of a step (startup " << options_.cost.draft_cost << ")";
}

}  // namespace arbor::sched
