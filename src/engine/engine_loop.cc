// The engine thread: inbox, the step protocol, and the output path (stream events, stop
// strings, best_of selection, metrics).
#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/engine_core.h"
#include "engine/engine_core_internal.h"

namespace arbor::engine {

EngineCore::Inbox EngineCore::wait_for_work() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!scheduler_->has_unfinished_requests()) {
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
    for (auto& [group, request] : in.adds) handle_add(std::move(group), std::move(request));
    for (const std::string& name : in.aborts) handle_abort(name);
    if (in.stop) break;
    if (scheduler_->has_unfinished_requests()) step();
    publish_metrics();
  }
  std::vector<sched::RequestId> ids;
  for (const auto& [id, g] : groups_) ids.push_back(id);
  for (sched::RequestId id : ids) {
    scheduler_->finish_request(id, sched::FinishReason::kAbort);
    finish_group(id, failed_precondition("the engine shut down"));
  }
  publish_metrics();
}

void EngineCore::handle_add(std::unique_ptr<Group> group, sched::Request request) {
  const std::vector<int32_t> prompt = request.prompt_token_ids;
  const int32_t best_of = request.best_of;
  const Status s = scheduler_->add_request(std::move(request));
  if (!s.ok()) {
    ++metrics_.num_requests_rejected;
    const sched::RequestId id = group->id;
    groups_.emplace(id, std::move(group));
    finish_group(id, s);
    return;
  }
  ++metrics_.num_requests_submitted;
  group->streaming = best_of == group->request.n;
  group->samples.resize(best_of);
  if (config_.tokenizer != nullptr) {
    for (Sample& sample : group->samples) {
      sample.text.emplace(*config_.tokenizer, prompt, group->request.stop);
    }
  }
  ids_by_name_[group->name] = group->id;
  groups_.emplace(group->id, std::move(group));
}

void EngineCore::handle_abort(const std::string& name) {
  auto it = ids_by_name_.find(name);
  if (it == ids_by_name_.end()) return;
  const sched::RequestId id = it->second;
  scheduler_->finish_request(id, sched::FinishReason::kAbort);
  ++metrics_.num_requests_aborted;
  Group& g = *groups_.at(id);
  for (size_t i = 0; i < g.samples.size(); ++i) {
    Sample& s = g.samples[i];
    if (s.finish_reason) continue;
    s.finish_reason = sched::FinishReason::kAbort;
    if (g.streaming) {
      StreamEvent ev;
      ev.index = static_cast<int32_t>(i);
      ev.finish_reason = sched::FinishReason::kAbort;
      ev.cumulative_logprob = s.cumulative_logprob;
      g.stream->push(std::move(ev));
    }
  }
  finish_group(id, ok_status());
}

void EngineCore::step() {
  sched::SchedulerOutput out = scheduler_->schedule();
  if (out.empty() && !out.preempted_ids.empty()) return;  // re-admitted next step
  if (out.empty()) {
    // Validated requests always fit an empty pool, so this is a bug; fail the requests rather
    // than spin.
    std::vector<sched::RequestId> ids;
    for (const auto& [id, g] : groups_) ids.push_back(id);
    for (sched::RequestId id : ids) {
      scheduler_->finish_request(id, sched::FinishReason::kAbort);
      finish_group(id, internal_error("the scheduler could not schedule any waiting request"));
    }
    return;
  }
  Result<sched::StepResult> res = executor_->execute(out);
  if (!res.ok()) {
    for (const sched::ScheduledRequest& s : out.requests) {
      const sched::RequestId gid = s.request_id & (sched::kMaxUserRequestId - 1);
      if (!groups_.contains(gid)) continue;
      scheduler_->finish_request(gid, sched::FinishReason::kAbort);
      finish_group(gid, res.status().with_context("model step failed"));
    }
    return;
  }
  const std::vector<sched::RequestOutput> outs = scheduler_->update_from_output(out, *res);
  const double now = engine_now();
  for (const sched::RequestOutput& o : outs) process_output(o, now);
  ++metrics_.num_steps;
  metrics_.batch_size.observe(static_cast<double>(out.requests.size()));
  metrics_.tokens_per_step.observe(out.total_num_scheduled_tokens);
}

void EngineCore::process_output(const sched::RequestOutput& o, double now) {
  const sched::RequestId gid = o.parent_id != 0 ? o.parent_id : o.request_id;
  auto it = groups_.find(gid);
  if (it == groups_.end()) return;
  Group& g = *it->second;
  if (o.first_scheduled && !g.scheduled) {
    g.scheduled = true;
    g.num_cached_tokens = o.num_cached_tokens;
    metrics_.queue_time_s.observe(now - g.arrival_time);
    metrics_.num_prompt_tokens += g.num_prompt_tokens;
  }
  if (o.new_tokens.empty() && !o.finish_reason) return;
  StreamEvent ev;
  ev.index = o.sample_index;
  bool stopped = false;
  for (const sched::SampledToken& t : o.new_tokens) {
    if (!stopped) add_token(g, o.sample_index, t, now, ev, stopped);
  }
  std::optional<sched::FinishReason> reason = o.finish_reason;
  if (stopped) {
    // A stop string: the scheduler has not seen it unless the same token also ended the sample.
    if (!reason) scheduler_->finish_request(o.request_id, sched::FinishReason::kStop);
    reason = sched::FinishReason::kStop;
  }
  if (reason) {
    finish_sample(g, o.sample_index, *reason, std::move(ev), stopped);
  } else if (g.streaming) {
    g.stream->push(std::move(ev));
  }
  if (g.num_finished == static_cast<int32_t>(g.samples.size())) finish_group(gid, ok_status());
}

void EngineCore::add_token(Group& g, int32_t index, const sched::SampledToken& t, double now,
                           StreamEvent& ev, bool& stopped) {
  Sample& s = g.samples[index];
  if (!g.got_token) {
    g.got_token = true;
    metrics_.ttft_s.observe(now - g.arrival_time);
  } else if (s.last_token_time > 0.0) {
    metrics_.inter_token_s.observe(now - s.last_token_time);
  }
  s.last_token_time = now;
  ++metrics_.num_generation_tokens;
  s.token_ids.push_back(t.token_id);
  ev.token_ids.push_back(t.token_id);
  s.cumulative_logprob += t.logprob;
  ev.cumulative_logprob = s.cumulative_logprob;
  if (g.request.sampling.logprobs) {
    TokenLogprobs lp{.token_id = t.token_id, .logprob = t.logprob, .top = t.top_logprobs};
    s.logprobs.push_back(lp);
    ev.logprobs.push_back(std::move(lp));
  }
  const std::vector<int32_t>& stop_ids = g.request.stop_token_ids;
  const bool stop_token =
      std::find(stop_ids.begin(), stop_ids.end(), t.token_id) != stop_ids.end() ||
      (!g.request.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), t.token_id) !=
                                    eos_ids_.end());
  // As vLLM: the text of a token that ends the sample (EOS, a stop id) is not output.
  if (s.text && !stop_token) {
    SampleText::Delta d = s.text->add(t.token_id);
    ev.text += d.text;
    s.full_text += d.text;
    stopped = d.stopped;
  }
}

void EngineCore::finish_sample(Group& g, int32_t index, sched::FinishReason reason,
                               StreamEvent ev, bool stopped_by_string) {
  Sample& s = g.samples[index];
  if (s.text && !stopped_by_string) {
    const std::string rest = s.text->finish();
    ev.text += rest;
    s.full_text += rest;
  }
  s.finish_reason = reason;
  ev.finish_reason = reason;
  ++g.num_finished;
  if (g.streaming) g.stream->push(std::move(ev));
}

// Sends the best_of > n selection (if any) and the final event, then forgets the group.
void EngineCore::finish_group(sched::RequestId id, Status error) {
  auto it = groups_.find(id);
  ARBOR_CHECK(it != groups_.end());
  std::unique_ptr<Group> g = std::move(it->second);
  groups_.erase(it);
  ids_by_name_.erase(g->name);
  StreamEvent final_ev;
  final_ev.final = true;
  final_ev.error = std::move(error);
  final_ev.usage.prompt_tokens = g->num_prompt_tokens;
  final_ev.usage.cached_tokens = g->num_cached_tokens;
  for (const Sample& s : g->samples) {
    final_ev.usage.completion_tokens += static_cast<int64_t>(s.token_ids.size());
  }
  if (!g->streaming && final_ev.error.ok()) {
    // best_of > n: the n samples with the highest cumulative logprob, ties to the lower index.
    std::vector<int32_t> order(g->samples.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return g->samples[a].cumulative_logprob > g->samples[b].cumulative_logprob;
    });
    for (int32_t k = 0; k < g->request.n; ++k) {
      Sample& s = g->samples[order[k]];
      StreamEvent ev;
      ev.index = k;
      ev.token_ids = std::move(s.token_ids);
      ev.text = std::move(s.full_text);
      ev.logprobs = std::move(s.logprobs);
      ev.cumulative_logprob = s.cumulative_logprob;
      ev.finish_reason = s.finish_reason;
      g->stream->push(std::move(ev));
    }
  }
  if (g->scheduled || !g->samples.empty()) {
    metrics_.e2e_s.observe(engine_now() - g->arrival_time);
    ++metrics_.num_requests_finished;
  }
  g->stream->push(std::move(final_ev));
  release_name(g->name);
}

void EngineCore::release_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  live_names_.erase(name);
  --num_live_;
}

void EngineCore::publish_metrics() {
  // Every request the scheduler knows belongs to a live group, and an idle engine holds no block.
  ARBOR_CHECK(!groups_.empty() || (!scheduler_->has_unfinished_requests() &&
                                   kv_->num_requests() == 0))
      << scheduler_->num_running() << " running, " << scheduler_->num_waiting() << " waiting, "
      << kv_->num_requests() << " KV tables without a live request";
  const sched::SchedulerStats st = scheduler_->stats();
  metrics_.num_running = st.num_running;
  metrics_.num_waiting = st.num_waiting;
  metrics_.num_preemptions = st.num_preemptions;
  metrics_.num_priority_preemptions = st.num_priority_preemptions;
  metrics_.kv_usage = st.kv.usage;
  metrics_.prefix_cache_hit_rate = st.kv.prefix_hit_rate;
  metrics_.num_prefix_cache_query_tokens = st.kv.num_query_tokens;
  metrics_.num_prefix_cache_hit_tokens = st.kv.num_hit_tokens;
  num_free_blocks_ = kv_->num_free_blocks();
  board_.publish(metrics_);
  std::lock_guard<std::mutex> lock(mu_);
  if (num_live_ == 0 && !idle_published_) {
    idle_published_ = true;
    idle_cv_.notify_all();
  }
}

}  // namespace arbor::engine
