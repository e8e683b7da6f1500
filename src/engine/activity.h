// Engine activity: what the engine did in its recent steps and what each live request is doing,
// for the server's engine view (GET /v1/engine/events, docs/web_ui.md).
//
// The engine thread summarises every step it runs (summarize_step: O(requests in the step)) and,
// after every loop iteration, every live request (summarize_requests: O(live requests)), and
// publishes both to an ActivityBoard: a ring of the last kMaxSteps step summaries and the current
// request rows. Any thread reads a consistent copy (the steps and rows of one publish). The board's
// lock is held only to store one summary and swap the rows in, or to copy them out: never across
// a step.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/request.h"
#include "sched/scheduler.h"

namespace arbor::engine {

class OutputProcessor;

// One engine step. A scheduled request "prefills" when it runs more than one committed token or
// any prompt token (a prompt chunk, or the recompute of prompt + outputs after a preemption);
// otherwise it "decodes" one committed token, plus the drafts it verifies.
struct StepSummary {
  int64_t step = 0;                  // 1 = the engine's first step
  double end_time_s = 0.0;           // engine clock (steady, seconds) when its outputs were applied
  double duration_s = 0.0;           // seconds inside ModelExecutor::execute
  int32_t num_requests = 0;          // requests scheduled (fork children count one each)
  int32_t num_prefill_requests = 0;
  int32_t num_prefill_tokens = 0;    // committed tokens the prefilling requests ran
  int32_t num_decode_requests = 0;
  int32_t num_new_requests = 0;      // admitted (or resumed after preemption) this step
  int32_t num_draft_tokens = 0;      // drafts verified (every node of a token tree)
  int32_t num_tree_nodes = 0;        // ... of those, in token trees (not chains)
  int32_t num_accepted_tokens = 0;   // drafts accepted
  int32_t num_generated_tokens = 0;  // tokens committed to outputs (accepted drafts included)
  int32_t num_preempted = 0;         // requests preempted to make room
  int32_t kv_used_blocks = 0;        // after the step (KvCacheStats::num_used_blocks)
  int32_t kv_shared_blocks = 0;      // ... held by more than one table (KvCacheStats)
};

// One live user request (all its samples when n / best_of > 1).
struct RequestSummary {
  std::string id;                    // the caller's request id (GenerateRequest::request_id)
  sched::RequestId engine_id = 0;
  // kRunning when any sample runs, else kPreempted when any was preempted, else kWaiting.
  sched::RequestStatus status = sched::RequestStatus::kWaiting;
  int32_t num_samples = 1;           // samples being generated (1, or the forked children left)
  int32_t priority = 0;
  double age_s = 0.0;                // since arrival
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;     // prefix-cache hit at first admission
  int64_t num_computed_tokens = 0;   // the furthest sample's K/V-cached tokens
  int64_t num_output_tokens = 0;     // generated so far, all samples
  int64_t num_draft_tokens = 0;      // drafts verified so far, all samples
  int64_t num_accepted_tokens = 0;   // ... of which accepted
  int32_t num_step_drafts = 0;       // drafts (tree nodes) it verified in the latest step
  int32_t num_pending_drafts = 0;    // drafts the executor proposed for its next step
  bool draft_tree = false;           // ... and they form a tree rather than a chain
  int32_t num_preemptions = 0;
};

// Pure. Step number `step` ran `out` in `duration_s`; `outputs`: update_from_output's result for
// it. The KV fields are left 0 (the engine fills them after the step).
StepSummary summarize_step(int64_t step, const sched::SchedulerOutput& out,
                           std::span<const sched::RequestOutput> outputs, double duration_s);

// Pure. The row of user request `id` from its samples: the request itself, or once forked its
// live children (non-empty, no nulls). `step_drafts`: drafts each request id verified in the
// latest step (absent = none).
RequestSummary summarize_request(std::string id, std::span<const sched::Request* const> samples,
                                 const std::unordered_map<sched::RequestId, int32_t>& step_drafts,
                                 double now);

// Engine thread: a row per live request of `outputs` that the scheduler holds, ordered by
// engine id (arrival order).
std::vector<RequestSummary> summarize_requests(
    const sched::Scheduler& scheduler, const OutputProcessor& outputs,
    const std::unordered_map<sched::RequestId, int32_t>& step_drafts, double now);

// The KV pool as of a publish (kv::KvCacheStats).
struct KvSummary {
  int32_t usable_blocks = 0;
  int32_t used_blocks = 0;    // held by block tables
  int32_t shared_blocks = 0;  // ... by more than one (prefix-cache hits, forked samples)
  int32_t cached_blocks = 0;  // in the prefix cache's hash map, used or free
};

// A consistent copy of the board.
struct EngineActivity {
  std::vector<StepSummary> steps;        // the latest <= kMaxSteps steps, oldest first
  std::vector<RequestSummary> requests;  // as of the latest publish
  KvSummary kv;                          // as of the latest publish
  int64_t num_published = 0;             // publishes so far (changes with every one)
};

class ActivityBoard {
 public:
  static constexpr int32_t kMaxSteps = 64;

  // Engine thread: appends `step` (when not null) to the ring, dropping the oldest beyond
  // kMaxSteps, and replaces the rows and the KV figures. O(1) under the lock (the rows are
  // swapped in).
  void publish(const StepSummary* step, std::vector<RequestSummary> requests,
               const KvSummary& kv);
  // Any thread. O(kMaxSteps + rows).
  EngineActivity read() const;

 private:
  mutable std::mutex mu_;
  std::array<StepSummary, kMaxSteps> ring_{};  // step i (0-based count) at i % kMaxSteps
  int64_t num_steps_ = 0;
  int64_t num_published_ = 0;
  std::vector<RequestSummary> requests_;
  KvSummary kv_;
};

}  // namespace arbor::engine
