// The per-step policy: schedule() and update_from_output(). See scheduler.h and
// docs/scheduler.md for the rules and an example iteration table.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "sched/scheduler.h"

namespace arbor::sched {

struct Scheduler::Budget {
  int64_t tokens = 0;
};

int64_t Scheduler::chunk_size(const Request& req, int64_t num_new, int64_t budget) const {
  int64_t cap = options_.long_prefill_token_threshold > 0 ? options_.long_prefill_token_threshold
                                                          : std::numeric_limits<int64_t>::max();
  return std::min({num_new, cap, budget});
}

ScheduledRequest Scheduler::make_scheduled(Request& req, int64_t num_new, bool is_new) const {
  ScheduledRequest s;
  s.request_id = req.request_id;
  s.num_scheduled_tokens = static_cast<int32_t>(num_new);
  s.num_computed_tokens = req.num_computed_tokens;
  s.is_prompt_chunk = req.num_computed_tokens < req.num_prompt_tokens();
  s.is_new = is_new;
  s.sample = !req.is_fork_parent() && req.num_computed_tokens + num_new == req.num_tokens();
  s.token_ids = req.all_token_ids;
  s.prompt_token_ids = req.prompt_token_ids;
  s.output_token_ids = req.output_token_ids;
  s.block_ids = kv_.block_ids(req.request_id);
  s.sampling = &req.sampling;
  s.rng = &req.rng;
  return s;
}

// Returns false (after preempting `req` itself) when even preempting every later request
// leaves no room for it. Victims are appended to `preempted` in the order they were taken.
bool Scheduler::try_allocate_running(Request& req, int64_t num_new,
                                     std::vector<RequestId>& preempted) {
  while (true) {
    if (kv_.allocate_slots(req.kv_view(), num_new, {}, options_.num_lookahead_tokens)) {
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
    if (!try_allocate_running(req, num_new, out.preempted_ids)) break;
    out.requests.push_back(make_scheduled(req, num_new, /*is_new=*/false));
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
  out.requests.push_back(make_scheduled(req, num_new, /*is_new=*/true));
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
  int64_t need = blocks_needed(hit.num_computed_tokens + num_new + options_.num_lookahead_tokens) -
                 static_cast<int64_t>(hit.block_ids.size());
  for (kv::BlockId b : hit.block_ids) need += pool.block(b).ref_cnt == 0;
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
    for (kv::BlockId b : kv_.block_ids(victim.request_id)) {
      const bool in_hit =
          std::find(hit.block_ids.begin(), hit.block_ids.end(), b) != hit.block_ids.end();
      if (++victim_refs[b] == pool.block(b).ref_cnt && !in_hit) ++available;
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
    preempt(*victim);
    ++num_priority_preemptions_;
    out.preempted_ids.push_back(victim->request_id);
  }
  return true;
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
    const kv::ComputedBlocks hit = kv_.get_computed_blocks(req.kv_view());
    const int64_t num_new =
        chunk_size(req, req.target_tokens() - hit.num_computed_tokens, budget.tokens);
    const bool fits =
        num_running() + seqs <= options_.max_num_seqs &&
        kv_.allocate_slots(req.kv_view(), num_new, hit, options_.num_lookahead_tokens).has_value();
    if (!fits) {
      // Head-of-line: nobody behind `req` is admitted before it.
      if (!preempt_for_waiting(req, hit, num_new, out, budget)) break;
      // Preemption frees blocks but caches none, so `hit` is still valid.
      const bool allocated =
          kv_.allocate_slots(req.kv_view(), num_new, hit, options_.num_lookahead_tokens)
              .has_value();
      ARBOR_CHECK(allocated) << "request " << req.request_id
                             << " does not fit after preempting for it";
    }
    admit(req, hit, num_new, out);
    budget.tokens -= num_new;
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
  if (out.preempted_ids.empty()) schedule_waiting(out, budget);
  for (const ScheduledRequest& s : out.requests) {
    out.total_num_scheduled_tokens += s.num_scheduled_tokens;
  }
  return out;
}

std::optional<FinishReason> Scheduler::check_stop(const Request& req, int32_t token_id) const {
  const StopConditions& stop = req.stop;
  if (std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token_id) !=
      stop.stop_token_ids.end()) {
    return FinishReason::kStop;
  }
  if (!stop.ignore_eos && std::find(stop.eos_token_ids.begin(), stop.eos_token_ids.end(),
                                    token_id) != stop.eos_token_ids.end()) {
    return FinishReason::kStop;
  }
  if (req.num_output_tokens() >= stop.max_tokens) return FinishReason::kLength;
  if (options_.max_model_len > 0 && req.num_tokens() >= options_.max_model_len) {
    return FinishReason::kLength;
  }
  return std::nullopt;
}

std::vector<RequestOutput> Scheduler::update_from_output(const SchedulerOutput& output,
                                                         const StepResult& result) {
  std::unordered_map<RequestId, const SampledToken*> sampled;
  for (const SampledToken& t : result.sampled) sampled.emplace(t.request_id, &t);
  std::vector<RequestOutput> outs;
  std::vector<RequestId> done;
  for (const ScheduledRequest& s : output.requests) {
    auto it = requests_.find(s.request_id);
    if (it == requests_.end() || it->second->status != RequestStatus::kRunning) continue;
    Request& req = *it->second;
    req.num_computed_tokens += s.num_scheduled_tokens;
    RequestOutput o;
    o.request_id = req.request_id;
    o.parent_id = req.parent_id;
    o.sample_index = req.sample_index;
    o.num_prompt_tokens = req.num_prompt_tokens();
    o.num_cached_tokens = req.num_cached_tokens;
    o.first_scheduled = s.is_new && req.num_preemptions == 0;
    std::optional<FinishReason> reason;
    if (s.sample) {
      auto t = sampled.find(req.request_id);
      ARBOR_CHECK(t != sampled.end()) << "executor returned no token for request "
                                      << req.request_id;
      req.append_output(t->second->token_id);
      o.new_tokens.push_back(*t->second);
      reason = check_stop(req, t->second->token_id);
    }
    kv_.cache_full_blocks(req.kv_view());
    if (reason) {
      finish(req, *reason);
      o.finish_reason = reason;
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
