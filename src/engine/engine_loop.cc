// The engine thread: inbox, the step protocol, and handing step outputs to the OutputProcessor.
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "engine/engine_core.h"

namespace arbor::engine {

EngineCore::Inbox EngineCore::wait_for_work() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!scheduler_->has_unfinished_requests() && !scheduler_->has_unreported_finishes()) {
    cv_.wait(lock, [this] {
      return inbox_.stop || !inbox_.adds.empty() || !inbox_.aborts.empty();
    });
  }
  Inbox in = std::move(inbox_);
  inbox_ = Inbox{};
  return in;
}

void EngineCore::run() {
  while (true) {
    Inbox in = wait_for_work();
    const double busy_from = steady_seconds();
    for (auto& [group, request] : in.adds) handle_add(std::move(group), std::move(request));
    for (const std::string& name : in.aborts) handle_abort(name);
    if (in.stop) break;
    if (scheduler_->has_unfinished_requests()) {
      step();
    } else if (scheduler_->has_unreported_finishes()) {
      forget_finished();
    }
    metrics_.engine_busy_s += steady_seconds() - busy_from;
    publish_metrics();
  }
  fail_all(failed_precondition("the engine shut down"));
  publish_metrics();
}

void EngineCore::handle_add(OutputGroupSpec group, sched::Request request) {
  const Status s = scheduler_->add_request(std::move(request));
  if (!s.ok()) {
    ++metrics_.num_requests_rejected;
    StreamEvent final_ev;
    final_ev.final = true;
    final_ev.error = s;
    final_ev.usage.prompt_tokens = group.num_prompt_tokens;
    group.stream->push(std::move(final_ev));
    release_name(group.name);
    return;
  }
  ++metrics_.num_requests_submitted;
  outputs_->add(group);
}

void EngineCore::handle_abort(const std::string& name) {
  const std::optional<sched::RequestId> id = outputs_->find(name);
  if (!id) return;
  scheduler_->finish_request(*id, sched::StopReason{.kind = sched::StopKind::kAbort});
  ++metrics_.num_requests_aborted;
  outputs_->abort(*id);
}

// Ends every live request with `error` (the scheduler forgets them and frees their blocks).
void EngineCore::fail_all(const Status& error) {
  for (sched::RequestId id : outputs_->ids()) {
    scheduler_->finish_request(id, sched::StopReason{.kind = sched::StopKind::kAbort});
    outputs_->fail(id, error);
  }
}

// Idle: an empty step whose only content is finished_ids, so the executor drops their state.
void EngineCore::forget_finished() {
  const sched::SchedulerOutput out = scheduler_->schedule();
  const Result<sched::StepResult> res = executor_->execute(out);
  if (!res.ok() && executor_->faulted()) {
    handle_executor_fault(res.status());
  } else if (!res.ok()) {
    ARBOR_LOG(kError) << "executor: " << res.status().to_string();
  }
}

namespace {
// Faults in a row, each recovered from, after which the requests that keep losing their step
// end with the fault's error instead of recomputing forever (a shard that dies on every step).
constexpr int32_t kMaxConsecutiveFaults = 3;
}  // namespace

// The executor lost its KV memory and request state (docs/shards.md, "Faults"): every running
// request is preempted to recompute, the prefix cache (whose blocks named the lost K/V) is
// dropped, and the executor brings up a new incarnation. When it cannot, every live request ends
// with the fault's error and the engine reports itself unhealthy until a step runs again.
void EngineCore::handle_executor_fault(const Status& fault) {
  ++metrics_.num_executor_faults;
  ++consecutive_faults_;
  const int32_t preempted = scheduler_->preempt_all();
  const int32_t dropped = kv_->reset_prefix_cache();
  scheduler_->reset_state_checkpoints();
  ARBOR_LOG(kWarn) << fault.message() << "; " << preempted
                   << " running requests preempted to recompute, " << dropped
                   << " prefix-cache blocks forgotten";
  const Status recovered = executor_->recover();
  if (!recovered.ok()) {
    metrics_.executor_healthy = false;
    metrics_.executor_error = str_cat(fault.message(), "; ", recovered.message());
    ARBOR_LOG(kError) << "recovery failed: " << recovered.message()
                      << "; ending every live request";
    fail_all(failed_precondition(metrics_.executor_error));
    return;
  }
  ++metrics_.num_executor_recoveries;
  if (consecutive_faults_ >= kMaxConsecutiveFaults) {
    ARBOR_LOG(kError) << consecutive_faults_ << " executor faults in a row; ending every live "
                      << "request";
    fail_all(failed_precondition(fault.message(), " (", consecutive_faults_, " faults in a row)"));
  }
}

void EngineCore::step() {
  sched::SchedulerOutput out = scheduler_->schedule();
  if (out.empty() && !out.preempted_ids.empty()) return;  // re-admitted next step
  if (out.empty()) {
    // Validated requests always fit an empty pool, so this is a bug; fail the requests rather
    // than spin.
    fail_all(internal_error("the scheduler could not schedule any waiting request"));
    return;
  }
  const double exec_from = steady_seconds();
  Result<sched::StepResult> res = executor_->execute(out);
  const double exec_s = steady_seconds() - exec_from;
  metrics_.executor_s += exec_s;
  if (!res.ok() && executor_->faulted()) {
    handle_executor_fault(res.status());
    return;
  }
  if (res.ok()) {
    consecutive_faults_ = 0;
    metrics_.executor_healthy = true;
    metrics_.executor_error.clear();
  }
  if (res.ok()) scheduler_->observe_step(out, exec_s, res->experts_touched, res->propose_seconds);
  Result<std::vector<sched::RequestOutput>> outs =
      res.ok() ? scheduler_->update_from_output(out, *res)
               : Result<std::vector<sched::RequestOutput>>(res.status());
  if (!outs.ok()) {
    // The step did not happen (or its result is unusable): every request in it fails.
    for (const sched::ScheduledRequest& s : out.requests) {
      const sched::RequestId gid = s.request_id & (sched::kMaxUserRequestId - 1);
      if (!outputs_->contains(gid)) continue;
      scheduler_->finish_request(gid, sched::StopReason{.kind = sched::StopKind::kAbort});
      outputs_->fail(gid, outs.status().with_context("model step failed"));
    }
    return;
  }
  const double now = steady_seconds();
  for (const sched::RequestOutput& o : *outs) {
    if (!o.error.ok()) {  // the model failed for this request alone: end its user request
      const sched::RequestId gid = o.request_id & (sched::kMaxUserRequestId - 1);
      if (!outputs_->contains(gid)) continue;
      ARBOR_LOG(kError) << "request " << gid << " failed: " << o.error.message();
      scheduler_->finish_request(gid, sched::StopReason{.kind = sched::StopKind::kAbort});
      outputs_->fail(gid, o.error);
      continue;
    }
    const std::optional<sched::StopReason> stop = outputs_->process(o, now);
    if (stop) scheduler_->finish_request(o.request_id, *stop);
    observe_speculation(o);
  }
  ++metrics_.num_steps;
  metrics_.last_step_time_s = steady_seconds();
  metrics_.batch_size.observe(static_cast<double>(out.requests.size()));
  metrics_.tokens_per_step.observe(out.total_num_scheduled_tokens);
  record_step(out, *outs, exec_s);
}

// The step's summary and the drafts each request verified in it, for the next publish.
void EngineCore::record_step(const sched::SchedulerOutput& out,
                             std::span<const sched::RequestOutput> outs, double exec_s) {
  last_step_ = summarize_step(metrics_.num_steps, out, outs, exec_s);
  last_step_->end_time_s = steady_seconds();
  step_drafts_.clear();
  for (const sched::RequestOutput& o : outs) {
    if (o.num_draft_tokens > 0) step_drafts_[o.request_id] += o.num_draft_tokens;
  }
}

void EngineCore::publish_activity(const kv::KvCacheStats& kv) {
  if (last_step_) {
    last_step_->kv_used_blocks = kv.num_used_blocks;
    last_step_->kv_shared_blocks = kv.num_shared_blocks;
  }
  const KvSummary kv_summary{.usable_blocks = kv.num_usable_blocks,
                             .used_blocks = kv.num_used_blocks,
                             .shared_blocks = kv.num_shared_blocks,
                             .cached_blocks = kv.num_cached_blocks};
  activity_.publish(last_step_ ? &*last_step_ : nullptr,
                    summarize_requests(*scheduler_, *outputs_, step_drafts_, steady_seconds()),
                    kv_summary);
  last_step_.reset();
  step_drafts_.clear();
}

void EngineCore::observe_speculation(const sched::RequestOutput& o) {
  if (o.num_draft_tokens == 0) return;
  metrics_.num_draft_tokens += o.num_draft_tokens;  // tree nodes, for a tree
  metrics_.num_accepted_draft_tokens += o.num_accepted_tokens;
  ++metrics_.num_verify_steps;
  if (o.draft_tree) {
    ++metrics_.num_tree_verify_steps;
    metrics_.num_tree_nodes += o.num_draft_tokens;
    metrics_.num_tree_accepted_tokens += o.num_accepted_tokens;
  }
  // A chain (or a tree's deepest path) accepted whole ends in a bonus token.
  if (o.num_accepted_tokens == o.num_draft_levels) {
    ++metrics_.num_bonus_tokens;
  } else {
    ++metrics_.num_recovered_tokens;
  }
  // Per draft position (a tree's depth - 1): verified when the drafts reach it.
  const auto levels = std::min<size_t>(static_cast<size_t>(o.num_draft_levels),
                                       metrics_.drafts_at_position.size());
  for (size_t i = 0; i < levels; ++i) {
    ++metrics_.drafts_at_position[i];
    if (static_cast<int32_t>(i) < o.num_accepted_tokens) ++metrics_.accepted_at_position[i];
  }
}

void EngineCore::release_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  live_names_.erase(name);
  --num_live_;
}

void EngineCore::publish_metrics() {
  // Every request the scheduler knows belongs to a live group, and an idle engine holds no block.
  ARBOR_CHECK(!outputs_->empty() || (!scheduler_->has_unfinished_requests() &&
                                     kv_->num_requests() == 0))
      << scheduler_->num_running() << " running, " << scheduler_->num_waiting() << " waiting, "
      << kv_->num_requests() << " KV tables without a live request";
  const sched::SchedulerStats st = scheduler_->stats();
  metrics_.num_running = st.num_running;
  metrics_.num_waiting = st.num_waiting;
  metrics_.num_preemptions = st.num_preemptions;
  metrics_.num_priority_preemptions = st.num_priority_preemptions;
  metrics_.num_spec_candidates = st.num_spec_candidates;
  metrics_.num_spec_declined = st.num_spec_declined;
  metrics_.spec_acceptance_estimate = st.spec_acceptance;
  metrics_.num_spec_probes = st.num_spec_probes;
  metrics_.spec_steepness = st.spec_steepness;
  metrics_.spec_overhead = st.spec_overhead;
  metrics_.kv_usage = st.kv.usage;
  metrics_.kv_usable_blocks = st.kv.num_usable_blocks;
  metrics_.kv_group_used_blocks = st.kv.group_used_blocks;
  metrics_.kv_group_released_blocks = st.kv.group_released_blocks;
  if (metrics_.kv_group_windows.empty()) {
    metrics_.kv_group_windows.assign(kv_->group_windows().begin(), kv_->group_windows().end());
  }
  metrics_.shards = executor_->shard_stats();
  metrics_.prefix_cache_hit_rate = st.kv.prefix_hit_rate;
  metrics_.num_prefix_cache_query_tokens = st.kv.num_query_tokens;
  metrics_.num_prefix_cache_hit_tokens = st.kv.num_hit_tokens;
  metrics_.num_state_checkpoints = st.num_state_checkpoints;
  metrics_.num_state_checkpoint_saves = st.num_state_checkpoint_saves;
  metrics_.num_state_checkpoint_hits = st.num_state_checkpoint_hits;
  num_free_blocks_ = kv_->num_free_blocks();
  if (config_.kv_events != nullptr) config_.kv_events->append(kv_->take_kv_events());
  board_.publish(metrics_);
  publish_activity(st.kv);
  std::lock_guard<std::mutex> lock(mu_);
  if (num_live_ == 0 && !idle_published_) {
    idle_published_ = true;
    idle_cv_.notify_all();
  }
}

}  // namespace arbor::engine
