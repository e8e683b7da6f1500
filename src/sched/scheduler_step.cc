// The per-step policy: schedule() and update_from_output(). See scheduler.h and
// docs/scheduler.md for the rules and an example iteration table.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "sched/scheduler.h"

#include "base/log.h"

namespace arbor::sched {

int64_t Scheduler::chunk_size(const Request& req, int64_t num_new, int64_t budget) const {
  int64_t cap = options_.long_prefill_token_threshold > 0 ? options_.long_prefill_token_threshold
                                                          : std::numeric_limits<int64_t>::max();
  return std::min({num_new, cap, budget});
}

// Whether a step that runs num_new committed tokens of `req` samples: it reaches the last
// committed token (max_tokens 0 — echo, prompt scoring — runs the prompt and samples nothing).
bool Scheduler::samples(const Request& req, int64_t num_new) {
  return !req.is_fork_parent() && req.stop.max_tokens > 0 &&
         req.num_computed_tokens + num_new == req.num_tokens();
}

// ---- The step's block ledger: plans reserve blocks before anything is allocated. ----

int64_t Scheduler::free_blocks() const { return kv_.num_free_blocks() - reserved_blocks_; }

bool Scheduler::reserve(RequestPlan& p, int32_t lookahead) {
  if (p.allocated) return lookahead <= p.lookahead;
  // Exact for a running request: cache_full_blocks() after its last step released what
  // allocate_slots() would release first, and it revives no cached block.
  const int64_t need =
      kv_.num_blocks_to_allocate(p.req->kv_view(), p.num_new, {}, lookahead);
  if (need - p.reserved_blocks > free_blocks()) return false;
  reserved_blocks_ += need - p.reserved_blocks;
  p.reserved_blocks = need;
  p.lookahead = lookahead;
  return true;
}

bool Scheduler::fits_new(const Request& req, int64_t num_new, const kv::ComputedBlocks& hit,
                         int32_t lookahead) const {
  return kv_.num_blocks_to_allocate(req.kv_view(), num_new, hit, lookahead) <= free_blocks();
}

// ---- schedule() ----

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.step = num_steps_++;
  out.block_copies = std::move(pending_copies_);
  pending_copies_.clear();
  out.finished_ids = std::move(finished_since_schedule_);
  finished_since_schedule_.clear();
  int64_t budget = options_.max_num_batched_tokens;
  std::vector<RequestPlan> plans;
  reserved_blocks_ = 0;
  const FitsFn fits = [this](RequestPlan& p, int32_t lookahead) { return reserve(p, lookahead); };
  plan_running(plans, budget, out.preempted_ids);
  drafts_.choose_drafts(plans, budget, fits);
  if (out.preempted_ids.empty()) admit_waiting(plans, budget, out.preempted_ids);
  drafts_.plan_next(plans, budget, fits);
  for (RequestPlan& p : plans) {
    allocate(p);
    emit(p, out);
  }
  ARBOR_CHECK_EQ(reserved_blocks_, 0);
  return out;
}

// Running requests first, in list order: each plans min(missing, chunk cap, budget) committed
// tokens; when their blocks do not fit, the back of the running list is preempted until they do
// or the request itself was the victim.
void Scheduler::plan_running(std::vector<RequestPlan>& plans, int64_t& budget,
                             std::vector<RequestId>& preempted) {
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request& req = *running_[i];
    const int64_t num_new =
        chunk_size(req, req.target_tokens() - req.num_computed_tokens, budget);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    RequestPlan p{.req = &req, .num_new = num_new, .sample = samples(req, num_new)};
    if (!make_room(p, preempted)) break;
    plans.push_back(p);
    budget -= num_new;
    ++i;
  }
}

// Reserves p's committed slots, preempting from the back of the running list (never a request
// planned before p: they precede it in the list) until they fit. False when p itself was the
// victim. Victims are appended to `preempted` in the order they were taken.
bool Scheduler::make_room(RequestPlan& p, std::vector<RequestId>& preempted) {
  while (!reserve(p, 0)) {
    // running_ is sorted, so the back is the lowest-priority, most recently admitted request.
    Request* victim = running_.back();
    running_.pop_back();
    preempt(*victim);
    preempted.push_back(victim->request_id);
    if (victim == p.req) return false;
  }
  return true;
}

// Waiting requests, FCFS (or by priority), while the budget lasts; head-of-line: nobody behind
// a request that does not fit is admitted before it (priority preemption may make room).
void Scheduler::admit_waiting(std::vector<RequestPlan>& plans, int64_t& budget,
                              std::vector<RequestId>& preempted) {
  while (!waiting_.empty() && budget > 0) {
    Request& req = *waiting_.front();
    // A request preempted in this step waits for the next one (no thrashing within a step).
    if (std::find(preempted.begin(), preempted.end(), req.request_id) != preempted.end()) break;
    const int32_t seqs = req.is_fork_parent() ? req.best_of : 1;
    const kv::ComputedBlocks hit = computed_blocks(req);
    const int64_t num_new =
        chunk_size(req, req.target_tokens() - hit.num_computed_tokens, budget);
    if (num_running_seqs() + seqs > options_.max_num_seqs || !fits_new(req, num_new, hit, 0)) {
      if (!preempt_for_waiting(req, hit, num_new, plans, budget, preempted)) break;
      // Preemption frees blocks but caches none, so `hit` is still valid.
      ARBOR_CHECK(fits_new(req, num_new, hit, 0))
          << "request " << req.request_id << " does not fit after preempting for it";
    }
    plans.push_back(admit(req, hit, num_new));
    budget -= num_new;
  }
}

// Moves `req` to the running list and allocates its slots (its one allocation of the step: a
// prefix-cache hit is valid only until the next allocation), with the lookahead a draft model's
// first proposals need when it fits.
RequestPlan Scheduler::admit(Request& req, const kv::ComputedBlocks& hit, int64_t num_new) {
  const bool sample =
      !req.is_fork_parent() && req.stop.max_tokens > 0 &&
      hit.num_computed_tokens + num_new == req.num_tokens();
  int32_t lookahead = drafts_.admission_lookahead(req, sample);
  if (lookahead > 0 && !fits_new(req, num_new, hit, lookahead)) lookahead = 0;
  const bool allocated = kv_.allocate_slots(req.kv_view(), num_new, hit, lookahead).has_value();
  ARBOR_CHECK(allocated) << "request " << req.request_id << " was admitted without room";
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &req));
  kv_.record_prefix_query(req.kv_view(), hit);  // once per admission, not per blocked step
  if (req.status == RequestStatus::kWaiting) req.num_cached_tokens = hit.num_computed_tokens;
  if (options_.state_checkpoints > 0 && hit.num_blocks() > 0) {
    // checkpointed() kept the hit only where its last block's state is saved.
    const std::optional<int32_t> slot = checkpoints_.find(hit.block_hashes.back());
    ARBOR_CHECK(slot.has_value()) << "request " << req.request_id << ": a hit without its state";
    req.load_checkpoint = *slot;
    ++num_checkpoint_hits_;
  }
  req.num_computed_tokens = hit.num_computed_tokens;
  req.status = RequestStatus::kRunning;
  req.admit_seq = next_admit_seq_++;
  insert_running(&req);
  return RequestPlan{.req = &req,
                     .num_new = num_new,
                     .sample = sample,
                     .is_new = true,
                     .lookahead = lookahead,
                     .allocated = true};
}

// How many requests from the back of the running list must be preempted so that `req` (waiting,
// no blocks) fits: max_num_seqs and the KV blocks allocate_slots(req, num_new, hit) takes from
// the free queue, counting what the step's plans reserved. Only requests with a larger priority
// value count; nullopt when they do not suffice. Exact: a victim's block is freed when the
// victims hold all its references; blocks of `hit` are left out (freeing then reviving them nets
// zero); a victim's plan gives back what it reserved. O(victims' table entries).
std::optional<size_t> Scheduler::num_victims_needed(const Request& req,
                                                    const kv::ComputedBlocks& hit,
                                                    int64_t num_new,
                                                    std::span<const RequestPlan> plans) const {
  const kv::BlockPool& pool = kv_.block_pool();
  const int32_t seqs = req.is_fork_parent() ? req.best_of : 1;
  const int64_t need = kv_.num_blocks_to_allocate(req.kv_view(), num_new, hit);
  std::vector<kv::BlockId> hit_blocks;
  for (const std::vector<kv::BlockId>& ids : hit.group_block_ids) {
    hit_blocks.insert(hit_blocks.end(), ids.begin(), ids.end());
  }
  int64_t available = free_blocks();
  std::unordered_map<kv::BlockId, int32_t> victim_refs;
  int64_t running_seqs = num_running_seqs();
  for (size_t k = 0;; ++k) {
    if (available >= need && running_seqs + seqs <= options_.max_num_seqs) return k;
    if (k == running_.size()) return std::nullopt;
    const Request& victim = *running_[running_.size() - 1 - k];
    running_seqs -= victim.is_fork_parent() ? victim.best_of : 1;
    if (victim.priority <= req.priority) return std::nullopt;
    for (const RequestPlan& p : plans) {
      if (p.req == &victim) available += p.reserved_blocks;
    }
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
// `req` (see num_victims_needed), dropping their plans and giving their tokens back to the
// budget. Returns false, changing nothing, when there is no such set.
bool Scheduler::preempt_for_waiting(const Request& req, const kv::ComputedBlocks& hit,
                                    int64_t num_new, std::vector<RequestPlan>& plans,
                                    int64_t& budget, std::vector<RequestId>& preempted) {
  if (options_.policy != SchedulingPolicy::kPriority) return false;
  const std::optional<size_t> num_victims = num_victims_needed(req, hit, num_new, plans);
  if (!num_victims || *num_victims == 0) return false;
  for (size_t i = 0; i < *num_victims; ++i) {
    Request* victim = running_.back();
    running_.pop_back();
    auto it = std::find_if(plans.begin(), plans.end(),
                           [&](const RequestPlan& p) { return p.req == victim; });
    if (it != plans.end()) {
      budget += it->num_new + it->num_drafts;
      reserved_blocks_ -= it->reserved_blocks;
      plans.erase(it);
    }
    preempt(*victim);
    ++num_priority_preemptions_;
    preempted.push_back(victim->request_id);
  }
  return true;
}

// The plan's one allocation (admitted requests allocated at admission).
void Scheduler::allocate(RequestPlan& p) {
  if (p.allocated) return;
  const bool ok =
      kv_.allocate_slots(p.req->kv_view(), p.num_new, {}, p.lookahead).has_value();
  ARBOR_CHECK(ok) << "request " << p.req->request_id << ": " << p.reserved_blocks
                  << " blocks were reserved and do not fit";
  reserved_blocks_ -= p.reserved_blocks;
  p.reserved_blocks = 0;
  p.allocated = true;
}

// The plan's ScheduledRequest; sends the executor what it does not know of the request.
void Scheduler::emit(const RequestPlan& p, SchedulerOutput& out) {
  Request& req = *p.req;
  if (!req.known_to_executor()) {
    const int32_t checkpoint = req.load_checkpoint;
    req.load_checkpoint = -1;
    out.new_requests.push_back(NewRequestData{
        .request_id = req.request_id,
        .token_ids = req.token_ids,
        .num_prompt_tokens = static_cast<int32_t>(req.num_prompt),
        .sampling = req.sampling,
        .seed = req.seed,
        .pooling = req.pooling,
        .fork_of = req.fork_pending ? req.parent_id : 0,
        .state_checkpoint = checkpoint,
    });
    req.fork_pending = false;
    req.num_tokens_sent = req.num_tokens();
  }
  ScheduledRequest s;
  s.request_id = req.request_id;
  s.num_computed_tokens = req.num_computed_tokens;
  s.num_scheduled_tokens = static_cast<int32_t>(p.num_new) + p.num_drafts;
  s.new_token_ids.assign(req.token_ids.begin() + req.num_tokens_sent, req.token_ids.end());
  req.num_tokens_sent = req.num_tokens();
  s.num_drafts = p.num_drafts;
  set_block_tables(req, s);
  plan_state_save(req, s);
  s.sample = p.sample;
  s.pool = req.pooling.has_value() && req.num_computed_tokens + p.num_new == req.num_prompt_tokens();
  if (req.sampling.prompt_logprobs) {
    // Row q scores position q + 1: this step's rows score [c + 1, c + num_new + 1), capped at the
    // prompt's end and started where the last step left off (a recompute scores nothing twice).
    s.prompt_logprobs_begin = std::max(req.num_computed_tokens + 1, req.next_prompt_logprob);
    s.prompt_logprobs_end =
        std::min(req.num_computed_tokens + p.num_new + 1, req.num_prompt_tokens());
    if (s.prompt_logprobs_end <= s.prompt_logprobs_begin) {
      s.prompt_logprobs_begin = s.prompt_logprobs_end = 0;
    }
  }
  s.max_next_draft_tokens = p.ask_depth;
  s.max_next_draft_nodes = p.ask_nodes;
  s.is_prompt_chunk = req.num_computed_tokens < req.num_prompt_tokens();
  s.is_new = p.is_new;
  out.total_num_scheduled_tokens += s.num_scheduled_tokens;
  out.requests.push_back(std::move(s));
}

void Scheduler::set_block_tables(const Request& req, ScheduledRequest& s) const {
  s.block_tables.resize(static_cast<size_t>(kv_.num_groups()));
  for (int32_t g = 0; g < kv_.num_groups(); ++g) {
    const std::span<const kv::BlockId> table = kv_.block_ids(req.request_id, g);
    s.block_tables[static_cast<size_t>(g)].assign(table.begin(), table.end());
  }
}

// The prefix-cache hit `req` may use: a request still owed prompt logprobs uses none past the
// row that scores its next position (cached tokens run no rows), as vLLM skips the cache for it.
kv::ComputedBlocks Scheduler::computed_blocks(const Request& req) const {
  // Mean and cls pooling read the hidden state of every prompt row from the first.
  if (req.pooling && step::pools_early_rows(*req.pooling)) {
    return kv_.get_computed_blocks(req.kv_view(), 0);
  }
  if (!req.sampling.prompt_logprobs || req.next_prompt_logprob >= req.num_prompt_tokens()) {
    return checkpointed(kv_.get_computed_blocks(req.kv_view()));
  }
  // The KV manager cuts the hit (a sliding group's hit needs the window before its end).
  return checkpointed(kv_.get_computed_blocks(req.kv_view(), req.next_prompt_logprob - 1));
}

kv::ComputedBlocks Scheduler::checkpointed(kv::ComputedBlocks hit) const {
  if (options_.state_checkpoints == 0) return hit;
  int64_t n = hit.num_blocks();
  while (n > 0 && !checkpoints_.contains(hit.block_hashes[static_cast<size_t>(n - 1)])) --n;
  if (n == hit.num_blocks()) return hit;
  if (n == 0) return kv::ComputedBlocks{};
  hit.block_hashes.resize(static_cast<size_t>(n));
  for (std::vector<kv::BlockId>& ids : hit.group_block_ids) ids.resize(static_cast<size_t>(n));
  hit.num_computed_tokens = n * kv_.block_size();
  return hit;
}

// The prompt's last full block boundary B (the state a request with the same prompt, or one
// extending it, can continue from), saved by the step that computes token B.
void Scheduler::plan_state_save(const Request& req, ScheduledRequest& s) {
  if (options_.state_checkpoints == 0 || s.num_drafts > 0) return;
  const int64_t bs = kv_.block_size();
  const int64_t boundary = (req.num_prompt_tokens() - 1) / bs * bs;
  const int64_t c = s.num_computed_tokens;
  if (boundary <= 0 || boundary <= c || boundary > c + s.num_scheduled_tokens) return;
  const std::optional<int32_t> slot = checkpoints_.acquire();
  if (!slot) return;
  s.save_state_at = boundary;
  s.save_state_slot = *slot;
  pending_saves_.push_back({req.request_id, *slot, boundary});
}

void Scheduler::resolve_state_saves(RequestId id) {
  std::erase_if(pending_saves_, [&](const PendingSave& p) {
    if (id != 0 && p.request_id != id) return false;
    const std::span<const kv::BlockHash> hashes = kv_.block_hashes(p.request_id);
    const auto block = static_cast<size_t>(p.boundary / kv_.block_size());
    if (id != 0 && hashes.size() >= block) {
      checkpoints_.register_slot(hashes[block - 1], p.slot);
      ++num_checkpoint_saves_;
    } else {
      checkpoints_.release(p.slot);  // not hashed (prefix caching off): nothing finds it
    }
    return true;
  });
}

void Scheduler::observe_step(const SchedulerOutput& out, double seconds,
                             double experts_touched, double propose_seconds) {
  drafts_.observe_step(out, seconds, experts_touched, propose_seconds);
}

// ---- update_from_output() ----

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

// A pooling request whose last prompt token ran: its vector (or its error) ends it.
void Scheduler::commit_pooled(Request& req, const step::PoolingResult* r, RequestOutput& o) {
  if (!r->error.ok()) {
    o.error = r->error;
    o.stop_reason = StopReason{.kind = StopKind::kAbort};
    return;
  }
  o.pooled = r->values;
  o.stop_reason = StopReason{.kind = StopKind::kMaxTokens};
  ARBOR_CHECK_EQ(req.num_computed_tokens, req.num_tokens());
}

// Applies one request's step: its computed tokens, then (when it sampled) the accepted drafts and
// the sampled token, stopping at the first token that ends it.
void Scheduler::commit(Request& req, const ScheduledRequest& s, const RequestResult* r,
                       RequestOutput& o) {
  const int32_t k = s.num_draft_tokens();
  req.num_computed_tokens += s.num_scheduled_tokens - k;
  const step::DraftShape verified = std::move(req.spec.drafts);
  req.spec.drafts = {};
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
  const auto parents =
      std::span<const int32_t>(verified.parent_ids).first(static_cast<size_t>(k));
  drafts_.observe_verification(req, parents, r->num_accepted, r->unverified_first_draft_agreed,
                               verified.probs);
  if (k == 0 && r->unverified_first_draft_agreed >= 0) {
    drafts_.observe_unverified(req, r->unverified_first_draft_agreed == 1,
                               verified.probs.empty() ? -1.0f : verified.probs[0]);
  }
  // The accepted drafts' K/V was computed in the context of committed tokens: it stays valid.
  req.num_computed_tokens += r->num_accepted;
  o.num_draft_tokens = k;
  o.num_accepted_tokens = r->num_accepted;
  o.num_draft_levels = step::draft_levels(parents);
  o.draft_tree = !step::is_chain(parents);
  for (const SampledToken& t : r->tokens) {
    req.append_output(t.token_id);
    o.new_tokens.push_back(t);
    o.stop_reason = check_stop(req, t.token_id);
    if (o.stop_reason) return;
  }
  req.spec.drafts = r->next_drafts;
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
    const std::span<const int32_t> parents(it->second->spec.drafts.parent_ids);
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
  std::unordered_map<RequestId, const step::PoolingResult*> pooled;
  for (const step::PoolingResult& p : result.pooled) pooled.emplace(p.request_id, &p);
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
    if (s.pool) commit_pooled(req, pooled.at(s.request_id), o);
    kv_.cache_full_blocks(req.kv_view());
    if (!pending_saves_.empty()) resolve_state_saves(req.request_id);
    if (o.stop_reason) {
      finish(req, *o.stop_reason);
      done.push_back(req.request_id);
    } else if (req.is_fork_parent() && req.num_computed_tokens == req.target_tokens()) {
      fork_parent(req);
      done.push_back(req.request_id);
    }
    outs.push_back(std::move(o));
  }
  resolve_state_saves(0);  // saves of requests the step did not run to the end: given back
  for (RequestId id : done) requests_.erase(id);
  return outs;
}

}  // namespace arbor::sched
