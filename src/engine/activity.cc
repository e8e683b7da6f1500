#include "engine/activity.h"

#include <algorithm>
#include <utility>

#include "engine/output_processor.h"

namespace arbor::engine {

StepSummary summarize_step(int64_t step, const sched::SchedulerOutput& out,
                           std::span<const sched::RequestOutput> outputs, double duration_s) {
  StepSummary s;
  s.step = step;
  s.duration_s = duration_s;
  s.num_requests = static_cast<int32_t>(out.requests.size());
  s.num_preempted = static_cast<int32_t>(out.preempted_ids.size());
  for (const sched::ScheduledRequest& r : out.requests) {
    const int32_t committed = r.num_scheduled_tokens - r.num_drafts;
    if (committed > 1 || r.is_prompt_chunk) {
      ++s.num_prefill_requests;
      s.num_prefill_tokens += committed;
    } else {
      ++s.num_decode_requests;
    }
    s.num_new_requests += r.is_new ? 1 : 0;
  }
  for (const sched::RequestOutput& o : outputs) {
    s.num_draft_tokens += o.num_draft_tokens;
    if (o.draft_tree) s.num_tree_nodes += o.num_draft_tokens;
    s.num_accepted_tokens += o.num_accepted_tokens;
    s.num_generated_tokens += static_cast<int32_t>(o.new_tokens.size());
  }
  return s;
}

RequestSummary summarize_request(std::string id, std::span<const sched::Request* const> samples,
                                 const std::unordered_map<sched::RequestId, int32_t>& step_drafts,
                                 double now) {
  RequestSummary r;
  r.id = std::move(id);
  const sched::Request& first = *samples.front();
  r.engine_id = first.parent_id != 0 ? first.parent_id : first.request_id;
  r.num_samples = static_cast<int32_t>(samples.size());
  r.priority = first.priority;
  r.age_s = now - first.arrival_time;
  r.num_prompt_tokens = first.num_prompt_tokens();
  r.num_cached_tokens = first.num_cached_tokens;
  bool running = false, preempted = false;
  for (const sched::Request* q : samples) {
    running = running || q->status == sched::RequestStatus::kRunning;
    preempted = preempted || q->status == sched::RequestStatus::kPreempted;
    r.num_computed_tokens = std::max(r.num_computed_tokens, q->num_computed_tokens);
    r.num_output_tokens += q->num_output_tokens();
    r.num_draft_tokens += q->spec.stats.num_draft_tokens;
    r.num_accepted_tokens += q->spec.stats.num_accepted_tokens;
    if (auto it = step_drafts.find(q->request_id); it != step_drafts.end()) {
      r.num_step_drafts += it->second;
    }
    r.num_pending_drafts += q->spec.drafts.size();
    r.draft_tree = r.draft_tree || !step::is_chain(q->spec.drafts.parent_ids);
    r.num_preemptions += q->num_preemptions;
  }
  r.status = running     ? sched::RequestStatus::kRunning
             : preempted ? sched::RequestStatus::kPreempted
                         : sched::RequestStatus::kWaiting;
  return r;
}

std::vector<RequestSummary> summarize_requests(
    const sched::Scheduler& scheduler, const OutputProcessor& outputs,
    const std::unordered_map<sched::RequestId, int32_t>& step_drafts, double now) {
  std::vector<sched::RequestId> ids = outputs.ids();
  std::sort(ids.begin(), ids.end());
  std::vector<RequestSummary> rows;
  rows.reserve(ids.size());
  std::vector<const sched::Request*> samples;
  for (sched::RequestId id : ids) {
    const sched::Request* req = scheduler.find(id);
    if (req == nullptr) continue;  // finished, its final event not yet sent
    samples.clear();
    if (req->status == sched::RequestStatus::kForked) {
      for (int32_t i = 0; i < req->best_of; ++i) {
        const sched::Request* child = scheduler.find(sched::child_request_id(id, i));
        if (child != nullptr) samples.push_back(child);
      }
    }
    if (samples.empty()) samples.push_back(req);
    rows.push_back(summarize_request(std::string(outputs.name(id)), samples, step_drafts, now));
  }
  return rows;
}

void ActivityBoard::publish(const StepSummary* step, std::vector<RequestSummary> requests,
                            const KvSummary& kv) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step != nullptr) ring_[static_cast<size_t>(num_steps_++ % kMaxSteps)] = *step;
  requests_.swap(requests);
  kv_ = kv;
  ++num_published_;
}

EngineActivity ActivityBoard::read() const {
  EngineActivity a;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t first = std::max<int64_t>(0, num_steps_ - kMaxSteps);
  a.steps.reserve(static_cast<size_t>(num_steps_ - first));
  for (int64_t i = first; i < num_steps_; ++i) {
    a.steps.push_back(ring_[static_cast<size_t>(i % kMaxSteps)]);
  }
  a.requests = requests_;
  a.kv = kv_;
  a.num_published = num_published_;
  return a;
}

}  // namespace arbor::engine
