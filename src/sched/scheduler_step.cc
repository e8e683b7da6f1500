// The per-step policy: schedule() and update_from_output(). See scheduler.h and
// docs/scheduler.md for the rules and an example iteration table.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "sched/scheduler.h"

#include "base/log.h"

namespace arbor::sched {

struct Scheduler::Budget {
  int64_t tokens = 0;
};

int64_t Scheduler::chunk_size(const Request& req, int64_t num_new, int64_t budget) const {
  int64_t cap = options_.long_prefill_token_threshold > 0 ? options_.long_prefill_token_threshold
                                                          : std::numeric_limits<int64_t>::max();
  return std::min({num_new, cap, budget});
}

// The most drafts `req` may verify (or be asked to propose) when `extra_tokens` more committed
// tokens precede them: within max_spec_tokens and the request's own cap, and leaving room for
// the token sampled after them under max_tokens and max_model_len.
int32_t Scheduler::max_drafts(const Request& req, int64_t extra_tokens) const {
  if (options_.max_spec_tokens == 0 || req.speculation.mode == SpecMode::kOff ||
      req.is_fork_parent()) {
    return 0;
  }
  int64_t k = options_.max_spec_tokens;
  if (req.speculation.k > 0) k = std::min<int64_t>(k, req.speculation.k);
  k = std::min(k, req.stop.max_tokens - req.num_output_tokens() - extra_tokens - 1);
  if (options_.max_model_len > 0) {
    k = std::min(k, options_.max_model_len - req.num_tokens() - extra_tokens - 1);
  }
  return static_cast<int32_t>(std::max<int64_t>(k, 0));
}

// Adds `req` to the step: num_new committed tokens and the first num_drafts of its drafts (the
// KV slots are allocated already). Sends the executor what it does not know of the request.
void Scheduler::schedule(Request& req, int64_t num_new, int32_t num_drafts, bool is_new,
                         SchedulerOutput& out) {
  if (!req.known_to_executor) {
    out.new_requests.push_back(NewRequestData{
        .request_id = req.request_id,
        .token_ids = req.token_ids,
        .num_prompt_tokens = static_cast<int32_t>(req.num_prompt),
        .sampling = req.sampling,
        .seed = req.seed,
    });
    req.known_to_executor = true;
    req.num_tokens_sent = req.num_tokens();
  }
  ScheduledRequest s;
  s.request_id = req.request_id;
  s.num_computed_tokens = req.num_computed_tokens;
  s.num_scheduled_tokens = static_cast<int32_t>(num_new) + num_drafts;
  s.new_token_ids.assign(req.token_ids.begin() + req.num_tokens_sent, req.token_ids.end());
  req.num_tokens_sent = req.num_tokens();
  s.num_drafts = num_drafts;
  set_block_tables(req, s);
  // max_tokens 0 (echo, prompt scoring): the prompt runs, nothing is sampled.
  s.sample = !req.is_fork_parent() && req.stop.max_tokens > 0 &&
             req.num_computed_tokens + num_new == req.num_tokens();
  if (req.sampling.prompt_logprobs) {
    // Row q scores position q + 1: this step's rows score [c + 1, c + num_new + 1), capped at the
    // prompt's end and started where the last step left off (a recompute scores nothing twice).
    s.prompt_logprobs_begin = std::max(req.num_computed_tokens + 1, req.next_prompt_logprob);
    s.prompt_logprobs_end = std::min(req.num_computed_tokens + num_new + 1, req.num_prompt_tokens());
    if (s.prompt_logprobs_end <= s.prompt_logprobs_begin) {
      s.prompt_logprobs_begin = s.prompt_logprobs_end = 0;
    }
  }
  s.max_next_draft_tokens = s.sample ? next_draft_request(req, num_drafts) : 0;
  s.is_prompt_chunk = req.num_computed_tokens < req.num_prompt_tokens();
  s.is_new = is_new;
  out.requests.push_back(std::move(s));
}

void Scheduler::set_block_tables(const Request& req, ScheduledRequest& s) const {
  s.block_tables.resize(static_cast<size_t>(kv_.num_groups()));
  for (int32_t g = 0; g < kv_.num_groups(); ++g) {
    const std::span<const kv::BlockId> table = kv_.block_ids(req.request_id, g);
    s.block_tables[static_cast<size_t>(g)].assign(table.begin(), table.end());
  }
}

// Returns false (after preempting `req` itself) when even preempting every later request
// leaves no room for it. Victims are appended to `preempted` in the order they were taken.
bool Scheduler::try_allocate_running(Request& req, int64_t num_new, int32_t num_drafts,
                                     std::vector<RequestId>& preempted) {
  while (true) {
    if (kv_.allocate_slots(req.kv_view(), num_new, {}, num_drafts)) {
      return true;
    }
    // running_ is sorted, so the back is the lowest-priority, most recently admitted request.
    Request* victim = running_.back();
    running_.pop_back();
    preempt(*victim);
    preempted.push_back(victim->request_id);
    if (victim == &req) return false;
  }
}

void Scheduler::schedule_running(SchedulerOutput& out, Budget& budget) {
  size_t i = 0;
  while (i < running_.size() && budget.tokens > 0) {
    Request& req = *running_[i];
    const int64_t num_new =
        chunk_size(req, req.target_tokens() - req.num_computed_tokens, budget.tokens);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    if (!try_allocate_running(req, num_new, 0, out.preempted_ids)) break;
    schedule(req, num_new, 0, /*is_new=*/false, out);
    budget.tokens -= num_new;
    ++i;
  }
}

void Scheduler::admit(Request& req, const kv::ComputedBlocks& hit, int64_t num_new,
                      SchedulerOutput& out) {
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &req));
  kv_.record_prefix_query(req.kv_view(), hit);  // once per admission, not per blocked step
  if (req.status == RequestStatus::kWaiting) req.num_cached_tokens = hit.num_computed_tokens;
  req.num_computed_tokens = hit.num_computed_tokens;
  req.status = RequestStatus::kRunning;
  req.admit_seq = next_admit_seq_++;
  insert_running(&req);
  schedule(req, num_new, /*num_drafts=*/0, /*is_new=*/true, out);
}

// How many requests from the back of the running list must be preempted so that `req` (waiting,
// no blocks) fits: max_num_seqs and the KV blocks allocate_slots(req, num_new, hit) takes from
// the free queue. Only requests with a larger priority value count; nullopt when they do not
// suffice. Exact: a victim's block is freed when the victims hold all its references; blocks of
// `hit` are left out (freeing then reviving them nets zero). O(victims' table entries).
std::optional<size_t> Scheduler::num_victims_needed(const Request& req,
                                                    const kv::ComputedBlocks& hit,
                                                    int64_t num_new) const {
  const kv::BlockPool& pool = kv_.block_pool();
  const int32_t seqs = req.is_fork_parent() ? req.best_of : 1;
  const int64_t need = kv_.num_blocks_to_allocate(req.kv_view(), num_new, hit);
  std::vector<kv::BlockId> hit_blocks;
  for (const std::vector<kv::BlockId>& ids : hit.group_block_ids) {
    hit_blocks.insert(hit_blocks.end(), ids.begin(), ids.end());
  }
  int64_t available = kv_.num_free_blocks();
  std::unordered_map<kv::BlockId, int32_t> victim_refs;
  for (size_t k = 0;; ++k) {
    if (available >= need &&
        static_cast<int64_t>(running_.size() - k) + seqs <= options_.max_num_seqs) {
      return k;
    }
    if (k == running_.size()) return std::nullopt;
    const Request& victim = *running_[running_.size() - 1 - k];
    if (victim.priority <= req.priority) return std::nullopt;
    for (int32_t g = 0; g < kv_.num_groups(); ++g) {
      for (kv::BlockId b : kv_.block_ids(victim.request_id, g)) {
        if (b == kv::kNullBlockId) continue;  // released from a sliding window
        const bool in_hit =
            std::find(hit_blocks.begin(), hit_blocks.end(), b) != hit_blocks.end();
        if (++victim_refs[b] == pool.block(b).ref_cnt && !in_hit) ++available;
      }
    }
  }
}

// Priority policy: preempts the fewest lowest-priority running requests that make room for
// `req` (see num_victims_needed), taking them out of this step's output and giving their tokens
// back to the budget. Returns false, changing nothing, when there is no such set.
bool Scheduler::preempt_for_waiting(const Request& req, const kv::ComputedBlocks& hit,
                                    int64_t num_new, SchedulerOutput& out, Budget& budget) {
  if (options_.policy != SchedulingPolicy::kPriority) return false;
  const std::optional<size_t> num_victims = num_victims_needed(req, hit, num_new);
  if (!num_victims || *num_victims == 0) return false;
  for (size_t i = 0; i < *num_victims; ++i) {
    Request* victim = running_.back();
    running_.pop_back();
    auto it = std::find_if(out.requests.begin(), out.requests.end(),
                           [&](const ScheduledRequest& s) {
                             return s.request_id == victim->request_id;
                           });
    if (it != out.requests.end()) {
      budget.tokens += it->num_scheduled_tokens;
      out.requests.erase(it);
    }
    // A fork child first sent this step: the executor never needs to hear of it.
    std::erase_if(out.new_requests, [&](const NewRequestData& d) {
      return d.request_id == victim->request_id;
    });
    preempt(*victim);
    ++num_priority_preemptions_;
    out.preempted_ids.push_back(victim->request_id);
  }
  return true;
}

// How many drafts (tree levels) to ask the executor to propose after a step in which `req`
// verifies `levels` of them: all that may be used when proposing is free (model-free
// proposers); with a draft model, one more than this step's, none for a while after the policy
// declined them (then it probes again).
int32_t Scheduler::next_draft_request(const Request& req, int32_t levels) const {
  const int32_t cap = max_drafts(req, 1);  // after this step at least one more token is committed
  if (spec_policy_.cost_model().draft_cost <= 0 || req.speculation.mode == SpecMode::kFixed) {
    return cap;
  }
  if (req.spec_backoff_steps > 0) return 0;
  return std::min(cap, levels + 1);
}

// The most tree nodes to ask the executor to propose after a step in which `req` verifies
// `verified` drafts: the request's cap within the engine's budget (0: chains); with a draft
// model, whose tree costs forwards, at most twice what the policy took this step (at least 4),
// so trees shrink under load and grow back when they pay.
int32_t Scheduler::next_tree_nodes(const Request& req, int32_t verified) const {
  int32_t cap = options_.max_tree_nodes;
  if (req.speculation.tree_nodes >= 0) cap = std::min(cap, req.speculation.tree_nodes);
  if (cap > 0 && spec_policy_.cost_model().draft_cost > 0 &&
      req.speculation.mode != SpecMode::kFixed) {
    cap = std::min(cap, std::max(4, 2 * verified));
  }
  return cap;
}

namespace {

// The levels of the first k of `req`'s drafts: k for a chain, the deepest node's depth for a
// tree.
int32_t draft_levels(const Request& req, int32_t k) {
  return step::draft_levels(std::span<const int32_t>(req.drafts.parent_ids).first(k));
}

// The longest prefix of `req`'s drafts no deeper than max_depth (parents come first, so a prefix
// is a tree; the executor proposes within the depth it was asked for, which only the tokens
// accepted since can lower).
int32_t prefix_within_depth(const Request& req, int32_t max_depth) {
  const std::vector<int32_t> depth = step::draft_depths(req.drafts.parent_ids);
  int32_t k = 0;
  while (k < static_cast<int32_t>(depth.size()) && depth[static_cast<size_t>(k)] <= max_depth) ++k;
  return k;
}

}  // namespace

// Gives decoding requests their drafts: the SpecPolicy chooses k for each over the whole step;
// the drafts take budget tokens and KV slots beyond the committed ones (never preempting: a
// request whose slots do not fit verifies none).
void Scheduler::schedule_drafts(SchedulerOutput& out, Budget& budget) {
  std::vector<size_t> index;
  std::vector<SpecPolicy::Candidate> candidates;
  std::vector<std::vector<double>> gains;  // [candidates] a tree's node gains; empty: a chain
  int64_t base_emitted = 0;
  for (size_t i = 0; i < out.requests.size(); ++i) {
    const ScheduledRequest& s = out.requests[i];
    if (!s.sample) continue;
    ++base_emitted;
    Request& req = *requests_.at(s.request_id);
    if (req.drafts.empty() || s.num_scheduled_tokens != 1) continue;
    const int32_t max_k = prefix_within_depth(req, max_drafts(req, 0));
    if (max_k <= 0) continue;
    index.push_back(i);
    const double a = spec_policy_.acceptance(req.acceptance_estimate);
    const auto parents = std::span<const int32_t>(req.drafts.parent_ids).first(max_k);
    const auto probs = std::span<const float>(req.drafts.probs).first(
        req.drafts.probs.empty() ? 0 : static_cast<size_t>(max_k));
    gains.push_back(step::is_chain(parents) ? std::vector<double>{}
                                            : tree_node_gains(a, parents, probs));
    candidates.push_back(SpecPolicy::Candidate{
        .acceptance = a, .max_k = max_k, .fixed = req.speculation.mode == SpecMode::kFixed});
  }
  if (candidates.empty()) return;
  for (size_t c = 0; c < candidates.size(); ++c) candidates[c].gains = gains[c];
  int64_t base_tokens = 0;
  for (const ScheduledRequest& s : out.requests) base_tokens += s.num_scheduled_tokens;
  const std::vector<int32_t> k =
      spec_policy_.choose(base_tokens, base_emitted, budget.tokens, candidates);
  for (size_t c = 0; c < candidates.size(); ++c) {
    ScheduledRequest& s = out.requests[index[c]];
    Request& req = *requests_.at(s.request_id);
    ++num_spec_candidates_;
    int32_t kc = k[c];
    if (kc > 0 && !kv_.allocate_slots(req.kv_view(), 1, {}, kc)) kc = 0;
    if (kc == 0) {
      ++num_spec_declined_;
      if (!candidates[c].fixed) {
        req.spec_backoff_next = req.spec_backoff_next == 0
                                    ? kSpecBackoffSteps
                                    : std::min(2 * req.spec_backoff_next, kSpecMaxBackoffSteps);
        req.spec_backoff_steps = req.spec_backoff_next;
      }
    }
    s.num_drafts = kc;
    s.num_scheduled_tokens += kc;
    s.max_next_draft_tokens = next_draft_request(req, draft_levels(req, kc));
    budget.tokens -= kc;
    set_block_tables(req, s);
  }
}

// Whether a draft could pay in this step at all: the policy would give one draft to a request
// with the engine-wide acceptance estimate. When not (a loaded step, or a costly draft model
// whose drafts are rarely accepted), nobody proposes for the next step, so the draft model costs
// nothing: no proposals and no catch-up over the tokens it skipped.
bool Scheduler::drafts_may_pay(const SchedulerOutput& out, int64_t budget) const {
  int64_t tokens = 0, emitted = 0;
  for (const ScheduledRequest& s : out.requests) {
    tokens += s.num_scheduled_tokens;
    emitted += s.sample ? 1 : 0;
  }
  const SpecPolicy::Candidate best{.acceptance = spec_policy_.acceptance(-1.0), .max_k = 1};
  return spec_policy_.choose(tokens, emitted, std::max<int64_t>(budget, 1), {&best, 1})[0] > 0;
}

// A draft model's proposals cost forwards, and a request whose draft model is behind (it asked
// for no drafts last step) first costs a catch-up over the tokens it skipped — its whole prompt
// at first. So: nobody proposes in a step where no draft could pay, and in a step with more than
// two sampling requests a request whose draft model is behind starts only when its catch-up is
// cheap (kMaxDraftCatchUpCost; early in a request's life with a small draft model).
void Scheduler::limit_draft_model_proposals(SchedulerOutput& out, int64_t budget) {
  const bool may_pay = drafts_may_pay(out, budget);
  const double draft_cost = spec_policy_.cost_model().draft_cost;
  int64_t num_sampling = 0;
  for (const ScheduledRequest& s : out.requests) num_sampling += s.sample ? 1 : 0;
  for (ScheduledRequest& s : out.requests) {
    Request& req = *requests_.at(s.request_id);
    const double catch_up =
        static_cast<double>(req.num_tokens() - req.draft_synced_tokens) * draft_cost;
    const bool costly_catch_up =
        !req.draft_in_sync && num_sampling > 2 && catch_up > kMaxDraftCatchUpCost;
    if (req.speculation.mode != SpecMode::kFixed && (!may_pay || costly_catch_up)) {
      s.max_next_draft_tokens = 0;
    }
    if (!s.sample) continue;
    req.draft_in_sync = s.max_next_draft_tokens > 0;
    // The draft model will have seen everything up to this step's sampled token.
    if (req.draft_in_sync) req.draft_synced_tokens = req.num_tokens() + 1;
  }
}

// Slots for the K/V a draft model writes while proposing max_next_draft_tokens after this step.
void Scheduler::reserve_draft_slots(SchedulerOutput& out) {
  for (ScheduledRequest& s : out.requests) {
    if (!s.sample || s.max_next_draft_tokens == 0) continue;
    const Request& req = *requests_.at(s.request_id);
    const int64_t committed_run = s.num_scheduled_tokens - s.num_draft_tokens();
    // A draft model's tree forwards write up to max_next_draft_nodes tokens after the tokens
    // committed by this step (up to k + 1 of them).
    const int32_t lookahead =
        std::max(s.max_next_draft_tokens, s.max_next_draft_nodes > 0 ? s.max_next_draft_nodes + 1 : 0);
    if (!kv_.allocate_slots(req.kv_view(), committed_run, {}, s.num_draft_tokens() + lookahead)) {
      s.max_next_draft_tokens = 0;
      continue;
    }
    set_block_tables(req, s);
  }
}

// The prefix-cache hit `req` may use: a request still owed prompt logprobs uses none past the
// row that scores its next position (cached tokens run no rows), as vLLM skips the cache for it.
kv::ComputedBlocks Scheduler::computed_blocks(const Request& req) const {
  if (!req.sampling.prompt_logprobs || req.next_prompt_logprob >= req.num_prompt_tokens()) {
    return kv_.get_computed_blocks(req.kv_view());
  }
  // The KV manager cuts the hit (a sliding group's hit needs the window before its end).
  return kv_.get_computed_blocks(req.kv_view(), req.next_prompt_logprob - 1);
}

void Scheduler::schedule_waiting(SchedulerOutput& out, Budget& budget) {
  while (!waiting_.empty() && budget.tokens > 0) {
    Request& req = *waiting_.front();
    // A request preempted in this step waits for the next one (no thrashing within a step).
    if (std::find(out.preempted_ids.begin(), out.preempted_ids.end(), req.request_id) !=
        out.preempted_ids.end()) {
      break;
    }
    const int32_t seqs = req.is_fork_parent() ? req.best_of : 1;
    const kv::ComputedBlocks hit = computed_blocks(req);
    const int64_t num_new =
        chunk_size(req, req.target_tokens() - hit.num_computed_tokens, budget.tokens);
    const bool fits =
        num_running() + seqs <= options_.max_num_seqs &&
        kv_.allocate_slots(req.kv_view(), num_new, hit).has_value();
    if (!fits) {
      // Head-of-line: nobody behind `req` is admitted before it.
      if (!preempt_for_waiting(req, hit, num_new, out, budget)) break;
      // Preemption frees blocks but caches none, so `hit` is still valid.
      const bool allocated = kv_.allocate_slots(req.kv_view(), num_new, hit).has_value();
      ARBOR_CHECK(allocated) << "request " << req.request_id
                             << " does not fit after preempting for it";
    }
    admit(req, hit, num_new, out);
    budget.tokens -= num_new;
  }
}

void Scheduler::observe_step(const SchedulerOutput& out, double seconds) {
  constexpr double kWeight = 0.05;  // about the last 20 steps of each kind
  int64_t drafts = 0, proposals = 0;
  for (const ScheduledRequest& s : out.requests) {
    if (s.num_scheduled_tokens != 1 + s.num_draft_tokens()) return;  // a prefill chunk
    drafts += s.num_draft_tokens();
    proposals += s.max_next_draft_tokens;
  }
  if (out.requests.empty() || seconds <= 0) return;
  const SpecCostModel& cost = spec_policy_.cost_model();
  const double predicted =
      cost.cost(out.total_num_scheduled_tokens) + cost.draft_cost * static_cast<double>(proposals);
  const double scale = seconds / predicted;
  double& mean = drafts + proposals > 0 ? spec_step_scale_ : plain_step_scale_;
  mean = mean < 0 ? scale : (1 - kWeight) * mean + kWeight * scale;
  // The plain reference: plain decode steps once seen, else the startup measurement (a loaded
  // engine may speculate in every step).
  const double reference = plain_step_scale_ > 0 ? plain_step_scale_ : cost.one_token_seconds;
  if (reference > 0 && spec_step_scale_ > 0) {
    const double before = spec_policy_.overhead();
    spec_policy_.set_overhead(spec_step_scale_ / reference);
    const double after = spec_policy_.overhead();
    if ((before < 1.2) != (after < 1.2)) {
      ARBOR_LOG(kInfo) << "speculation: a speculative step costs " << after
                       << "x the measured curve" << (after >= 1.2 ? " (drafts pay less)" : "");
    }
  }
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step = num_steps_++;
  out.block_copies = std::move(pending_copies_);
  pending_copies_.clear();
  out.finished_ids = std::move(finished_since_schedule_);
  finished_since_schedule_.clear();
  Budget budget{options_.max_num_batched_tokens};
  schedule_running(out, budget);
  schedule_drafts(out, budget);
  if (out.preempted_ids.empty()) schedule_waiting(out, budget);
  if (spec_policy_.cost_model().draft_cost > 0) {
    limit_draft_model_proposals(out, budget.tokens);
  } else if (options_.max_spec_tokens > 0 && !drafts_may_pay(out, budget.tokens)) {
    // Model-free proposers cost no forward, but proposing still costs the engine thread time
    // (suffix tries); in a step where no draft could pay, nobody proposes.
    for (ScheduledRequest& s : out.requests) {
      if (requests_.at(s.request_id)->speculation.mode != SpecMode::kFixed) {
        s.max_next_draft_tokens = 0;
      }
    }
  }
  for (ScheduledRequest& s : out.requests) {
    if (s.max_next_draft_tokens > 0) {
      s.max_next_draft_nodes = next_tree_nodes(*requests_.at(s.request_id), s.num_draft_tokens());
    }
  }
  if (options_.reserve_draft_slots) reserve_draft_slots(out);
  for (const ScheduledRequest& s : out.requests) {
    out.total_num_scheduled_tokens += s.num_scheduled_tokens;
  }
  return out;
}

std::optional<StopReason> Scheduler::check_stop(const Request& req, int32_t token_id) const {
  const StopConditions& stop = req.stop;
  if (std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token_id) !=
      stop.stop_token_ids.end()) {
    return StopReason{.kind = StopKind::kStopToken, .token_id = token_id};
  }
  if (!stop.ignore_eos && std::find(stop.eos_token_ids.begin(), stop.eos_token_ids.end(),
                                    token_id) != stop.eos_token_ids.end()) {
    return StopReason{.kind = StopKind::kEos, .token_id = token_id};
  }
  if (req.num_output_tokens() >= stop.max_tokens) return StopReason{.kind = StopKind::kMaxTokens};
  if (options_.max_model_len > 0 && req.num_tokens() >= options_.max_model_len) {
    return StopReason{.kind = StopKind::kMaxModelLen};
  }
  return std::nullopt;
}

// Applies one request's step: its computed tokens, then (when it sampled) the accepted drafts and
// the sampled token, stopping at the first token that ends it.
void Scheduler::commit(Request& req, const ScheduledRequest& s, const RequestResult* r,
                       RequestOutput& o) {
  const int32_t k = s.num_draft_tokens();
  req.num_computed_tokens += s.num_scheduled_tokens - k;
  const step::DraftShape verified = std::move(req.drafts);
  req.drafts = {};
  if (r == nullptr) {
    if (req.stop.max_tokens == 0 && req.num_computed_tokens == req.num_tokens()) {
      o.stop_reason = StopReason{.kind = StopKind::kMaxTokens};
    }
    return;
  }
  if (!r->error.ok()) {
    o.error = r->error;
    o.stop_reason = StopReason{.kind = StopKind::kAbort};
    return;
  }
  if (req.spec_backoff_steps > 0) --req.spec_backoff_steps;
  if (k > 0 && r->num_accepted > 0) req.spec_backoff_next = 0;
  // The accepted drafts' K/V was computed in the context of committed tokens: it stays valid.
  req.num_computed_tokens += r->num_accepted;
  o.num_draft_tokens = k;
  o.num_accepted_tokens = r->num_accepted;
  const auto parents = std::span<const int32_t>(verified.parent_ids).first(static_cast<size_t>(k));
  o.num_draft_levels = step::draft_levels(parents);
  o.draft_tree = !step::is_chain(parents);
  if (k > 0) {
    spec_policy_.observe(req.acceptance_estimate, o.num_draft_levels, r->num_accepted);
    ++req.spec_stats.num_verify_steps;
    req.spec_stats.num_draft_tokens += k;
    req.spec_stats.num_accepted_tokens += r->num_accepted;
  }
  for (const SampledToken& t : r->tokens) {
    req.append_output(t.token_id);
    o.new_tokens.push_back(t);
    o.stop_reason = check_stop(req, t.token_id);
    if (o.stop_reason) return;
  }
  req.drafts = r->next_drafts;
}

Result<std::vector<RequestOutput>> Scheduler::update_from_output(const SchedulerOutput& output,
                                                                 const StepResult& result) {
  const Status valid = step::validate_step_result(output, result, options_.vocab_size);
  if (!valid.ok()) return valid;
  std::unordered_map<RequestId, const RequestResult*> results;
  for (const RequestResult& r : result.requests) results.emplace(r.request_id, &r);
  for (const ScheduledRequest& s : output.requests) {
    const auto r = results.find(s.request_id);
    const auto it = requests_.find(s.request_id);
    if (r == results.end() || it == requests_.end() || !r->second->error.ok()) continue;
    const std::span<const int32_t> parents(it->second->drafts.parent_ids);
    if (parents.size() < static_cast<size_t>(s.num_drafts)) {
      return internal_error("request ", s.request_id, " verified ", s.num_drafts,
                            " drafts, the scheduler knows of ", parents.size());
    }
    ARBOR_RETURN_IF_ERROR(
        step::check_accepted_path(parents.first(static_cast<size_t>(s.num_drafts)), *r->second));
  }
  std::unordered_map<RequestId, const step::PromptLogprobsResult*> prompt_logprobs;
  for (const step::PromptLogprobsResult& p : result.prompt_logprobs) {
    prompt_logprobs.emplace(p.request_id, &p);
  }
  std::vector<RequestOutput> outs;
  std::vector<RequestId> done;
  for (const ScheduledRequest& s : output.requests) {
    auto it = requests_.find(s.request_id);
    if (it == requests_.end() || it->second->status != RequestStatus::kRunning) continue;
    Request& req = *it->second;
    RequestOutput o;
    o.request_id = req.request_id;
    o.parent_id = req.parent_id;
    o.sample_index = req.sample_index;
    o.num_prompt_tokens = req.num_prompt_tokens();
    o.num_cached_tokens = req.num_cached_tokens;
    o.first_scheduled = s.is_new && req.num_preemptions == 0;
    if (auto p = prompt_logprobs.find(s.request_id); p != prompt_logprobs.end()) {
      o.first_prompt_logprob = p->second->first_position;
      o.prompt_logprobs = p->second->entries;
      req.next_prompt_logprob = s.prompt_logprobs_end;
    }
    commit(req, s, s.sample ? results.at(s.request_id) : nullptr, o);
    kv_.cache_full_blocks(req.kv_view());
    if (o.stop_reason) {
      finish(req, *o.stop_reason);
      done.push_back(req.request_id);
    } else if (req.is_fork_parent() && req.num_computed_tokens == req.target_tokens()) {
      fork_parent(req);
      done.push_back(req.request_id);
    }
    outs.push_back(std::move(o));
  }
  for (RequestId id : done) requests_.erase(id);
  return outs;
}

}  // namespace arbor::sched
