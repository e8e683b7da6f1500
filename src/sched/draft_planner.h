// DraftPlanner: every speculation decision of the scheduler, in one place (docs/speculation.md,
// "Policy"). For the step being scheduled it chooses how many of each decoding request's drafts
// to verify (the SpecPolicy over the whole step), what each sampling request asks the executor
// to propose next (levels and tree nodes, with a draft model's backoff, catch-up and may-pay
// gates), and the lookahead slots a draft model writes into; after the step it learns from the
// verifications (acceptance) and from the measured step times (the served curve, StepTimeFit,
// and the draft cost).
//
// It works on the scheduler's RequestPlans (request_plan.h) before anything is allocated; KV
// slots for drafts and lookahead are asked of the scheduler through a Fits callback, which
// reserves them when they fit (drafts and lookahead never preempt).
//
// Threading: the engine thread (inside Scheduler::schedule() and update_from_output()).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sched/request.h"
#include "sched/request_plan.h"
#include "sched/spec_policy.h"
#include "step/step.h"

namespace arbor::sched {

// Steps a request asks for no drafts after the SpecPolicy declined its drafts (draft model only:
// proposing costs forwards, and probing again costs a catch-up over the tokens missed); doubled
// on every further decline up to kSpecMaxBackoffSteps, reset when a verification accepts a draft.
inline constexpr int32_t kSpecBackoffSteps = 16;
inline constexpr int32_t kSpecMaxBackoffSteps = 1024;
// Under load (more than two sampling requests) a request whose draft model is behind starts
// proposing only if its catch-up — the tokens the draft model has not seen, at the draft cost
// per token (an upper bound: the catch-up runs them as one prefill) — costs at most this much
// of a 1-token target step.
inline constexpr double kMaxDraftCatchUpCost = 0.25;
// A draft model whose whole proposal (max_spec_tokens draft tokens) costs at most this much of a
// 1-token target step proposes every step like a model-free proposer, with no backoff: while the
// policy declines its drafts, its first draft still tells the acceptance estimate whether it
// agreed with the target (observe_unverified), so the estimate can climb back.
inline constexpr double kNegligibleDraftCost = 0.02;
// In steps where no draft could pay (a costly drafter), one request still proposes one draft
// every this many steps — a probe: its first draft and its step's cost keep the acceptance and
// overhead estimates current, so one unlucky estimate cannot stop speculation for good.
inline constexpr int64_t kProbeInterval = 16;
// A negligible or model-free drafter's probe (DraftPlanner::explore) verifies the drafts it
// reaches with at least this probability.
inline constexpr double kProbeReach = 0.5;

struct DraftPlannerOptions {
  int32_t max_spec_tokens = 0;  // levels verified per request per step; 0 = no speculation
  int32_t max_tree_nodes = 0;   // the executor's tree budget; 0 = chains
  int64_t max_model_len = 0;    // 0 = unbounded
  // The proposer writes K/V for its drafts (a draft model): reserve lookahead slots for them.
  bool reserve_draft_slots = false;
  // The proposer keeps up with every request every step by itself (an MTP head): no request is
  // ever behind it, so none waits for a cheap catch-up.
  bool draft_keeps_up = false;
  SpecCostModel cost{};
  SpecPolicyOptions policy{};
};

// Reserves `lookahead` slots past plan's committed tokens (drafts verified now plus a draft
// model's next proposals) when they fit; false (nothing reserved) otherwise.
using FitsFn = std::function<bool(RequestPlan& plan, int32_t lookahead)>;

class DraftPlanner {
 public:
  explicit DraftPlanner(DraftPlannerOptions options);

  // The most drafts (levels) `req` may verify, or be asked to propose, when `extra_tokens` more
  // committed tokens precede them: within max_spec_tokens and the request's own cap, and
  // leaving room for the token sampled after them under max_tokens and max_model_len.
  int32_t max_drafts(const Request& req, int64_t extra_tokens) const;

  // Sets num_drafts of every decoding plan (one committed token, sampling, with drafts kept):
  // the policy's k over the whole step (`plans`: the step so far), a prefix of its drafts within
  // max_drafts(). Drafts take `budget` tokens (reduced) and fits() slots; a request whose slots
  // do not fit verifies none. A decline starts a draft model's backoff.
  void choose_drafts(std::span<RequestPlan> plans, int64_t& budget, const FitsFn& fits);

  // Sets every sampling plan's ask (ask_depth, ask_nodes) once the step is known: one level
  // more than it verifies (draft model; all allowed when proposing is free), none while backing
  // off or where no draft could pay (drafts_may_pay), none for a draft model that is behind
  // when catching up is costly; then a draft model's lookahead through fits() (the ask is
  // dropped when it does not fit). Plans allocated already (admitted this step) keep the asks
  // their admission reserved for (admission_lookahead()).
  void plan_next(std::span<RequestPlan> plans, int64_t budget_left, const FitsFn& fits);

  // The lookahead a request admitted this step reserves with its one allocation: the most its
  // ask can be (plan_next() only lowers it), 0 without a draft model.
  int32_t admission_lookahead(const Request& req, bool sample) const;

  // A sampling step of `req` verified drafts with these parents (the verified prefix; empty:
  // none) and accepted `accepted`: one backoff step passes; with drafts, the acceptance
  // estimates and the request's counters learn from it. `next_agreed` (-1: not reported) is
  // step::RequestResult::unverified_first_draft_agreed: with every draft of a verified chain
  // accepted, whether the kept draft after them was the token sampled next. The estimates then
  // learn from the chain one level longer, as if that draft had been verified too (the request's
  // counters count only what was verified), so a policy that verifies short chains still learns
  // what a longer one would be worth. `probs`: the kept drafts' step::DraftShape::probs (the
  // proposer's confidence in each; empty: none), which the calibrations learn with.
  void observe_verification(Request& req, std::span<const int32_t> parents, int32_t accepted,
                            int32_t next_agreed = -1, std::span<const float> probs = {});
  // A step of `req` verified none of its drafts, and its first draft was (agreed) or was not the
  // token sampled: the acceptance estimates learn from it as from a verification of one draft,
  // so a request whose estimate fell below what pays can climb back without paying to verify.
  // `confidence`: the proposer's in that draft (< 0: none).
  void observe_unverified(Request& req, bool agreed, float confidence = -1.0f);
  // The measured wall time of executing `out` and the distinct experts per layer its rows were
  // routed to (StepResult::experts_touched; 0 for a dense model) (Scheduler::observe_step).
  // propose_seconds: StepResult::propose_seconds (observe_proposals).
  void observe_step(const step::SchedulerOutput& out, double seconds,
                    double experts_touched = 0.0, double propose_seconds = 0.0);
  // A draft token's cost relative to a 1-token step that the policy plans with: the startup
  // measurement, then the measured proposing time (observe_proposals).
  double draft_cost() const { return policy_.cost_model().draft_cost; }

  // The served curve (SpecPolicy::set_served_curve): what a speculative step costs more, in
  // 1-token steps, and the curve's steepness relative to the startup measurement's.
  double overhead() const { return policy_.overhead(); }
  double steepness() const { return policy_.steepness(); }
  double rho() const { return policy_.rho(); }
  double acceptance() const { return policy_.acceptance(-1.0); }
  int64_t num_candidates() const { return num_candidates_; }
  int64_t num_declined() const { return num_declined_; }
  // Probes made (kProbeInterval): a costly drafter's asks and the others' verifications.
  int64_t num_probes() const { return num_probes_; }

 private:
  int32_t next_depth(const Request& req, int32_t levels) const;
  int32_t next_nodes(const Request& req, int32_t verified) const;
  bool drafts_may_pay(std::span<const RequestPlan> plans, int64_t budget) const;
  // A draft model (not a model-free proposer) whose whole proposal costs at most
  // kNegligibleDraftCost.
  bool negligible_draft_cost() const;
  void limit_draft_model_asks(std::span<RequestPlan> plans, int64_t budget);
  void limit_to_policy(std::span<RequestPlan> plans, int64_t budget) const;
  void decline(Request& req, bool fixed);
  // Sets k (the policy's choice, [candidates]) to an exploration probe when one is due.
  void explore(std::span<const SpecPolicy::Candidate> candidates, int64_t budget,
               std::vector<int32_t>& k);

  DraftPlannerOptions options_;
  SpecPolicy policy_;
  int64_t num_candidates_ = 0;
  int64_t num_declined_ = 0;
  int64_t num_probes_ = 0;
  int64_t steps_since_probe_ = 0;  // steps where no draft could pay, since the last probe
  // What served decode steps say of the curve (observe_step); the policy plans with it.
  StepTimeFit served_;
  int64_t plain_steps_seen_ = 0, spec_steps_seen_ = 0;
  static constexpr int64_t kWarmupSteps = 2;
  static constexpr double kMaxJump = 1.5;
  void log_served_curve();
  void observe_proposals(int64_t proposals, double propose_seconds);
  int64_t propose_steps_seen_ = 0;
  static constexpr int64_t kLogFirstSteps = 64, kLogEverySteps = 1024;
  int64_t logged_at_ = 0;  // served_.num_steps() when last logged; 0: never
  double logged_steepness_ = 1.0, logged_overhead_ = 0.0, logged_draft_cost_ = 0.0;
  // Sampling steps in a row that verified no draft of a negligible or model-free drafter
  // (explore()'s probe).
  int64_t declined_steps_ = 0;
};

}  // namespace arbor::sched
