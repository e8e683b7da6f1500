// Scheduler bookkeeping: admission, finishing, preemption, forks. The per-step policy is in
// scheduler_step.cc.
#include <algorithm>
#include <utility>

#include "sched/scheduler.h"

namespace arbor::sched {

namespace {

// The priority policy's order (vLLM): lower priority value first, then earlier arrival.
bool priority_before(const Request& a, const Request& b) {
  return std::tie(a.priority, a.arrival_time, a.request_id) <
         std::tie(b.priority, b.arrival_time, b.request_id);
}

// Running-list order: earlier = scheduled first, later = preempted first.
bool runs_before(const Request& a, const Request& b, SchedulingPolicy policy) {
  switch (policy) {
    case SchedulingPolicy::kFcfs:
      return std::tie(a.admit_seq, a.request_id) < std::tie(b.admit_seq, b.request_id);
    case SchedulingPolicy::kPriority:
      return priority_before(a, b);
  }
  return false;
}

std::unique_ptr<Request> make_child(const Request& parent, int32_t index) {
  auto c = std::make_unique<Request>();
  c->request_id = child_request_id(parent.request_id, index);
  c->parent_id = parent.request_id;
  c->sample_index = index;
  c->token_ids = parent.token_ids;
  c->num_prompt = parent.num_prompt;
  c->next_prompt_logprob = parent.next_prompt_logprob;
  c->sampling = parent.sampling;
  // best_of > n ranks samples by cumulative logprob, so every sample needs its logprob.
  if (parent.best_of > parent.n && !c->sampling.logprobs) c->sampling.logprobs = 0;
  c->seed = derive_sample_seed(parent.seed, index);
  c->stop = parent.stop;
  c->spec.params = parent.spec.params;
  c->priority = parent.priority;
  c->arrival_time = parent.arrival_time;
  c->cache_salt = parent.cache_salt;
  c->admit_seq = parent.admit_seq;
  return c;
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, kv::KvCacheManager& kv)
    : options_(options),
      kv_(kv),
      checkpoints_(options.state_checkpoints),
      drafts_(DraftPlannerOptions{.max_spec_tokens = options.max_spec_tokens,
                                  .max_tree_nodes = options.max_tree_nodes,
                                  .max_model_len = options.max_model_len,
                                  .reserve_draft_slots = options.reserve_draft_slots,
                                  .draft_keeps_up = options.draft_keeps_up,
                                  .cost = options.spec_cost,
                                  .policy = options.spec_policy}) {
  ARBOR_CHECK_GE(options_.max_num_seqs, 1);
  ARBOR_CHECK_GE(options_.max_num_batched_tokens, 1);
  ARBOR_CHECK_GE(options_.long_prefill_token_threshold, 0);
  ARBOR_CHECK_GE(options_.max_waiting_requests, 1);
  ARBOR_CHECK(options_.max_spec_tokens >= 0 && options_.max_spec_tokens <= kMaxSpecTokens)
      << "max_spec_tokens is " << options_.max_spec_tokens;
  ARBOR_CHECK_GE(options_.max_model_len, 0);
}

int64_t Scheduler::max_step_tokens() const {
  const int64_t budget = options_.max_num_batched_tokens;
  return options_.long_prefill_token_threshold > 0
             ? std::min<int64_t>(budget, options_.long_prefill_token_threshold)
             : budget;
}

int64_t Scheduler::max_sequence_len(const Request& req) const {
  const int64_t len = req.num_prompt_tokens() + req.stop.max_tokens;
  return options_.max_model_len > 0 ? std::min(len, options_.max_model_len) : len;
}

// The admission checks of add_request(), in its documented order.
Status Scheduler::check_admission(const Request& request) const {
  const RequestId id = request.request_id;
  if (id == 0 || id >= kMaxUserRequestId) {
    return invalid_argument("request id ", id, " is outside [1, 2^48)");
  }
  if (requests_.contains(id)) return invalid_argument("request id ", id, " is already queued");
  ARBOR_RETURN_IF_ERROR(
      request.pooling ? check_input_length(request.num_prompt_tokens(), options_.max_model_len)
                      : check_prompt_length(request.num_prompt_tokens(), options_.max_model_len));
  const int64_t len = max_sequence_len(request);
  // Drafts never need slots past `len` (DraftPlanner::max_drafts() keeps k within what can be
  // emitted), and
  // neither they nor a draft model's lookahead ever preempt. A sliding-window group holds at
  // most the blocks of its window and one step's chunk at once.
  const int64_t blocks = kv_.max_blocks_per_request(len, max_step_tokens());
  if (blocks > kv_.block_pool().num_usable_blocks()) {
    const std::string groups =
        kv_.num_groups() > 1 ? str_cat(" over ", kv_.num_groups(), " KV cache groups") : "";
    return invalid_argument("prompt (", request.num_prompt_tokens(), " tokens) + max_tokens (",
                            request.stop.max_tokens, ") needs up to ", len, " tokens (", blocks,
                            " KV blocks", groups, "), the KV pool has ",
                            kv_.block_pool().num_usable_blocks(), " blocks of ",
                            kv_.block_size(), " tokens");
  }
  if (request.best_of > options_.max_num_seqs) {
    return invalid_argument("best_of is ", request.best_of, ", max_num_seqs is ",
                            options_.max_num_seqs);
  }
  if (num_waiting() >= options_.max_waiting_requests) {
    return resource_exhausted("waiting queue is full: ", num_waiting(),
                              " requests waiting, max_waiting_requests is ",
                              options_.max_waiting_requests);
  }
  return ok_status();
}

Status Scheduler::add_request(Request request) {
  const Status admissible = check_admission(request);
  if (!admissible.ok()) return admissible;
  const RequestId id = request.request_id;
  request.status = RequestStatus::kWaiting;
  if (request.is_fork_parent() && request.num_prompt_tokens() == 1) {
    // Nothing to share before the last prompt token: the samples start as plain requests.
    for (int32_t i = 0; i < request.best_of; ++i) {
      std::unique_ptr<Request> child = make_child(request, i);
      Request* c = child.get();
      requests_.emplace(c->request_id, std::move(child));
      enqueue_waiting(c, /*front=*/false);
    }
    return ok_status();
  }
  auto owned = std::make_unique<Request>(std::move(request));
  Request* r = owned.get();
  requests_.emplace(id, std::move(owned));
  enqueue_waiting(r, /*front=*/false);
  return ok_status();
}

void Scheduler::enqueue_waiting(Request* req, bool front) {
  switch (options_.policy) {
    case SchedulingPolicy::kFcfs:
      if (front) {
        waiting_.push_front(req);
      } else {
        waiting_.push_back(req);
      }
      return;
    case SchedulingPolicy::kPriority: {
      auto it = std::upper_bound(waiting_.begin(), waiting_.end(), req,
                                 [](const Request* a, const Request* b) {
                                   return priority_before(*a, *b);
                                 });
      waiting_.insert(it, req);
      return;
    }
  }
}

void Scheduler::insert_running(Request* req) {
  auto it = std::upper_bound(running_.begin(), running_.end(), req,
                             [this](const Request* a, const Request* b) {
                               return runs_before(*a, *b, options_.policy);
                             });
  running_.insert(it, req);
}

void Scheduler::preempt(Request& req) {
  kv_.free(req.request_id);
  req.num_computed_tokens = 0;
  req.spec.drafts = {};
  req.num_tokens_sent = 0;
  req.spec.draft_in_sync = false;
  req.spec.draft_synced_tokens = 0;
  req.status = RequestStatus::kPreempted;
  ++req.num_preemptions;
  ++num_preemptions_;
  enqueue_waiting(&req, /*front=*/true);
}

int32_t Scheduler::preempt_all() {
  int32_t n = 0;
  while (!running_.empty()) {
    Request* victim = running_.back();
    running_.pop_back();
    preempt(*victim);
    ++n;
  }
  return n;
}

void Scheduler::finish(Request& req, const StopReason& reason) {
  switch (reason.finish_reason()) {
    case FinishReason::kStop: req.status = RequestStatus::kFinishedStopped; break;
    case FinishReason::kLength: req.status = RequestStatus::kFinishedLength; break;
    case FinishReason::kAbort: req.status = RequestStatus::kFinishedAborted; break;
  }
  req.stop_reason = reason;
  kv_.free(req.request_id);
  std::erase(running_, &req);
  std::erase(waiting_, &req);
  if (req.known_to_executor()) finished_since_schedule_.push_back(req.request_id);
}

std::vector<RequestId> Scheduler::finish_request(RequestId request_id, const StopReason& reason) {
  std::vector<RequestId> ids;
  for (auto& [id, req] : requests_) {
    if ((id == request_id || req->parent_id == request_id) && !is_finished(req->status)) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) {
    finish(*requests_.at(id), reason);
    requests_.erase(id);
  }
  return ids;
}

void Scheduler::fork_parent(Request& parent) {
  const int64_t shared = parent.num_computed_tokens;
  for (int32_t i = 0; i < parent.best_of; ++i) {
    std::unique_ptr<Request> child = make_child(parent, i);
    Request* c = child.get();
    requests_.emplace(c->request_id, std::move(child));
    std::optional<kv::ForkResult> fr = kv_.fork(parent.request_id, c->request_id, shared);
    if (!fr) {
      // No block for the copy-on-write tail: recompute later, mostly from the prefix cache.
      c->status = RequestStatus::kWaiting;
      enqueue_waiting(c, /*front=*/false);
      continue;
    }
    c->num_computed_tokens = shared;
    c->fork_pending = true;
    c->status = RequestStatus::kRunning;
    insert_running(c);
    for (const kv::BlockCopy& cow : fr->copies_on_write) {
      pending_copies_.push_back(step::BlockCopy{cow.src_block, cow.dst_block, cow.num_tokens});
    }
  }
  kv_.free(parent.request_id);
  if (parent.known_to_executor()) finished_since_schedule_.push_back(parent.request_id);
  std::erase(running_, &parent);
  parent.status = RequestStatus::kForked;
}

void Scheduler::reset_state_checkpoints() {
  checkpoints_.clear();
  pending_saves_.clear();
}

int32_t Scheduler::num_running_seqs() const {
  int32_t n = 0;
  for (const Request* r : running_) n += r->is_fork_parent() ? r->best_of : 1;
  return n;
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  return SchedulerStats{
      .num_running = num_running(),
      .num_waiting = num_waiting(),
      .num_preemptions = num_preemptions_,
      .num_priority_preemptions = num_priority_preemptions_,
      .num_spec_candidates = drafts_.num_candidates(),
      .num_spec_declined = drafts_.num_declined(),
      .num_spec_probes = drafts_.num_probes(),
      .spec_acceptance = drafts_.acceptance(),
      .spec_steepness = drafts_.steepness(),
      .spec_overhead = drafts_.overhead(),
      .num_steps = num_steps_,
      .num_state_checkpoints = checkpoints_.size(),
      .num_state_checkpoint_saves = num_checkpoint_saves_,
      .num_state_checkpoint_hits = num_checkpoint_hits_,
      .kv = kv_.stats(),
  };
}

}  // namespace arbor::sched
