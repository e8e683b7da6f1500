// Scheduler: decides, each step, which requests run with how many tokens.
//
// Step protocol (docs/scheduler.md):
//   SchedulerOutput out = scheduler.schedule();
//   StepResult res = executor.execute(out);   // copies blocks, runs the model, samples/verifies
//   Result<std::vector<RequestOutput>> outs = scheduler.update_from_output(out, res);
//
// schedule() spends a per-step token budget (max_num_batched_tokens) on running requests first
// (in list order: decode tokens and the next chunk of unfinished prompts), then on waiting ones
// (FCFS, or by (priority, arrival) with SchedulingPolicy::kPriority), capping a request's chunk
// at long_prefill_token_threshold and the running set at max_num_seqs. A newly admitted request
// skips its prefix-cache hit. The running list is in admission order (FCFS) or by (priority,
// arrival) (kPriority); its back is the preemption victim.
//
// Preemption (frees the victim's blocks and queues it again; it later recomputes prompt +
// outputs, mostly from the prefix cache):
//   * When allocate_slots() fails for a running request, the back of the running list goes
//     until the allocation succeeds or the request itself was the victim. A step that preempted
//     this way admits nobody.
//   * kPriority only: when the head of the waiting queue does not fit (KV blocks or
//     max_num_seqs), the fewest running requests with a strictly larger priority value, taken
//     from the back, that make room for it are preempted (and unscheduled from this step), as
//     vLLM's priority scheduler does. If even all of them would not make room, nobody is
//     preempted. A request preempted in a step is not readmitted in that step.
//
// Pooling requests (RequestSpec::pooling) run their prompt like any other, in chunks, and end
// with the step that runs its last token (ScheduledRequest::pool); mean and cls pooling read
// every row from the first, so they take no prefix-cache hit. Their blocks are freed at once.
//
// max_model_len bounds every sequence (prompt + generated tokens): a prompt of max_model_len
// tokens or more is rejected by add_request() (a pooling request's input may have
// max_model_len tokens); a request finishes with kLength when it reaches
// max_model_len tokens, so K/V is written for at most max_model_len - 1 positions.
//
// Speculative decoding: the executor keeps the drafts it proposed after a step and reports their
// shape (Request::drafts: a TokenTree's parents, a chain being the width-1 tree). A decoding
// request with drafts runs [last token + its first k drafts] with k chosen by the SpecPolicy
// within max_drafts(): at most max_spec_tokens levels, the request's own cap, and what
// max_tokens / max_model_len leave (a step never verifies more drafts than could be emitted).
// The drafts take budget tokens and KV slots (allocated as lookahead: they are not committed,
// never cached, and rejected ones are overwritten by later steps); the executor compacts the
// accepted path's K/V before the scheduler commits it.
//
// Threading: engine thread only; no locks. A SchedulerOutput is a value.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampler.h"
#include "sched/draft_planner.h"
#include "sched/request.h"
#include "sched/request_plan.h"
#include "sched/spec_policy.h"
#include "sched/state_checkpoints.h"
#include "step/step.h"

namespace arbor::sched {

enum class SchedulingPolicy : uint8_t { kFcfs, kPriority };

struct SchedulerOptions {
  int32_t max_num_seqs = 64;               // running requests (fork children count), >= 1
  int32_t max_num_batched_tokens = 2048;   // tokens per step, >= 1
  // Per-request chunk cap per step; 0 = max_num_batched_tokens (vLLM's name).
  int32_t long_prefill_token_threshold = 0;
  int32_t max_waiting_requests = 1024;     // add_request() beyond this is kResourceExhausted
  // Longest sequence (prompt + generated tokens), >= 0; 0 = unbounded (only the KV pool and
  // max_tokens bound it). Prompts of max_model_len tokens or more are rejected; generation
  // stops with kLength at max_model_len tokens even if max_tokens allows more.
  int64_t max_model_len = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Drafts verified per request per step, at most (the engine's --spec-k); 0 = no speculation.
  // Requests may ask for fewer (SpecRequest::k) or none; SpecPolicy chooses within that.
  int32_t max_spec_tokens = 0;
  SpecCostModel spec_cost{};          // the executor's measured step costs (SpecPolicy)
  SpecPolicyOptions spec_policy{};
  // The proposer writes K/V for its drafts (a draft model): reserve max_next_draft_tokens
  // lookahead slots past each sampling request's step (dropped, not preempted for, when the
  // pool is short).
  bool reserve_draft_slots = false;
  // The proposer keeps up with every request by itself (ModelExecutor::proposer_keeps_up).
  bool draft_keeps_up = false;
  // The executor proposes token trees of at most this many nodes (ModelExecutor::
  // max_tree_nodes); 0 = chains. A tree's depth is capped like a chain's length.
  int32_t max_tree_nodes = 0;
  // A model with recurrent layers (ModelExecutor::state_checkpoints): the executor's checkpoint
  // slots. > 0: each prompt's state at its last full block boundary is saved into one (least
  // recently used first out), and a prefix-cache hit is cut back to the longest prefix whose
  // state is saved (sched/state_checkpoints.h). 0: prefix hits as they come (the engine turns
  // prefix caching off for a recurrent model without checkpoints).
  int32_t state_checkpoints = 0;
  // Token ids in a StepResult must be below this (the engine sets the executor's vocabulary).
  int32_t vocab_size = std::numeric_limits<int32_t>::max();
};

using step::NewRequestData;
using step::RequestResult;
using step::SampledToken;
using step::ScheduledRequest;
using step::SchedulerOutput;
using step::StepResult;

// What a step changed for one request, for the output path.
struct RequestOutput {
  RequestId request_id = 0;
  RequestId parent_id = 0;        // the user request a fork child belongs to; 0 otherwise
  int32_t sample_index = 0;
  std::vector<SampledToken> new_tokens;  // committed this step, up to and including a stop
  // Prompt logprobs scored this step: prompt_logprobs[i] is position first_prompt_logprob + i.
  // Over the life of a request they arrive in order, each position 1 .. num_prompt - 1 once,
  // all of them before (or with) the output that carries its first token or its stop.
  int64_t first_prompt_logprob = 0;
  std::vector<sampling::PromptLogprob> prompt_logprobs;
  std::optional<StopReason> stop_reason;  // the sample ended (set once, here or by finish_request)
  // A pooling request's vector (step::PoolingResult::values), with its kMaxTokens stop.
  std::vector<float> pooled;
  int32_t num_draft_tokens = 0;           // drafts verified this step
  int32_t num_accepted_tokens = 0;        // ... of which accepted (and emitted, unless stopped)
  // Levels of the drafts verified: num_draft_tokens for a chain, a token tree's depth.
  int32_t num_draft_levels = 0;
  bool draft_tree = false;                // the drafts were a token tree
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prefix-cache hit at first admission
  bool first_scheduled = false;   // its first tokens ran this step (queue time ends)
  // Not ok: the model failed for this request (RequestResult::error); it has ended (kAbort)
  // and the engine must end its whole user request with this error.
  Status error;
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t num_preemptions = 0;     // total since construction
  int64_t num_priority_preemptions = 0;  // ... of those, made for a waiting request (kPriority)
  int64_t num_spec_candidates = 0;   // decoding requests that had drafts to verify (total)
  int64_t num_spec_declined = 0;     // ... for which the policy chose k = 0
  int64_t num_spec_probes = 0;       // probes (kProbeInterval), total
  double spec_acceptance = 0.0;      // the policy's engine-wide acceptance estimate
  // The served curve (sched::StepTimeFit): steepness relative to the startup curve, and a
  // speculative step's extra cost in 1-token steps.
  double spec_steepness = 1.0;
  double spec_overhead = 0.0;
  int64_t num_steps = 0;
  // A recurrent model's state checkpoints (SchedulerOptions::state_checkpoints): held now,
  // saved and continued from since construction.
  int32_t num_state_checkpoints = 0;
  int64_t num_state_checkpoint_saves = 0;
  int64_t num_state_checkpoint_hits = 0;
  kv::KvCacheStats kv{};
};

class Scheduler {
 public:
  // Takes the KV manager by reference; it must outlive the scheduler. CHECKs the options.
  Scheduler(const SchedulerOptions& options, kv::KvCacheManager& kv);

  // Queues a validated request (validate_request_spec). Errors: kResourceExhausted when
  // max_waiting_requests are waiting; kInvalidArgument when the prompt has max_model_len tokens
  // or more, when min(prompt + max_tokens, max_model_len) tokens could never fit in the KV pool,
  // when best_of > max_num_seqs, or for a duplicate id. A rejected request holds no block.
  Status add_request(Request request);

  SchedulerOutput schedule();

  // The measured wall time of executing `out`. Decode-only steps (no prefill chunk) feed the
  // served curve the SpecPolicy plans with (sched::StepTimeFit): how steep the step-cost curve
  // is now relative to its startup measurement, and what a step that speculates (verifies
  // drafts or proposes costly ones) costs more, in 1-token steps. So whatever speculation costs
  // beyond the curve (proposing, catch-ups, bookkeeping) makes drafts pay less, a curve measured
  // too steep at startup is flattened by what steps really cost, and speculation turns itself
  // down where it does not pay.
  // experts_touched: StepResult::experts_touched (a mixture's expert term learns from it);
  // propose_seconds: StepResult::propose_seconds (a draft token's real cost learns from it).
  void observe_step(const SchedulerOutput& out, double seconds, double experts_touched = 0.0,
                    double propose_seconds = 0.0);
  // A draft token's cost relative to a 1-token step: the startup measurement, then what
  // proposing took in served steps.
  double spec_draft_cost() const { return drafts_.draft_cost(); }
  double spec_overhead() const { return drafts_.overhead(); }
  double spec_steepness() const { return drafts_.steepness(); }
  double spec_expert_rho() const { return drafts_.rho(); }
  // Checks `result` against `output` (step::validate_step_result: a malformed result is an error
  // and changes nothing); then appends each request's tokens in order, stopping at the first
  // that ends it (EOS, a stop id, max_tokens, max_model_len: nothing after it is committed),
  // stores the next drafts, caches full blocks, forks parents whose prompt is computed, and
  // frees finished requests (forgotten after this call).
  Result<std::vector<RequestOutput>> update_from_output(const SchedulerOutput& output,
                                                        const StepResult& result);

  // Finishes a request from outside (abort, or a stop string seen by the engine) and its fork
  // children; frees their blocks. Returns the ids finished; empty for an unknown id.
  std::vector<RequestId> finish_request(RequestId request_id, const StopReason& reason);

  // The executor lost its KV memory and per-request state (a shard died: docs/shards.md,
  // "Faults"): preempts every running request, back of the running list first, so they wait at
  // the front of the queue in their running order and later recompute prompt + outputs. Their
  // ids are not reported in any preempted_ids (the executor knows none of them any more).
  // Returns how many were preempted.
  int32_t preempt_all();

  bool has_unfinished_requests() const { return !requests_.empty(); }
  // Requests finished (or forked) since the last schedule(): the next SchedulerOutput's
  // finished_ids. An idle engine still runs that (empty) step so the executor drops their state.
  bool has_unreported_finishes() const { return !finished_since_schedule_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // The sequences the running requests will be: a fork parent counts as its best_of children
  // (what max_num_seqs bounds: the parent forks into them without admission). O(running).
  int32_t num_running_seqs() const;
  // Forgets every recurrent-state checkpoint (the executor lost its state: a shard fault).
  void reset_state_checkpoints();
  // Recurrent-state checkpoints registered (sched/state_checkpoints.h).
  int32_t num_state_checkpoints() const { return checkpoints_.size(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const Request* find(RequestId id) const;
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  Status check_admission(const Request& request) const;
  static bool samples(const Request& req, int64_t num_new);
  int64_t free_blocks() const;
  bool reserve(RequestPlan& p, int32_t lookahead);
  bool fits_new(const Request& req, int64_t num_new, const kv::ComputedBlocks& hit,
                int32_t lookahead) const;
  void plan_running(std::vector<RequestPlan>& plans, int64_t& budget,
                    std::vector<RequestId>& preempted);
  bool make_room(RequestPlan& p, std::vector<RequestId>& preempted);
  void admit_waiting(std::vector<RequestPlan>& plans, int64_t& budget,
                     std::vector<RequestId>& preempted);
  RequestPlan admit(Request& req, const kv::ComputedBlocks& hit, int64_t num_new);
  bool preempt_for_waiting(const Request& req, const kv::ComputedBlocks& hit, int64_t num_new,
                           std::vector<RequestPlan>& plans, int64_t& budget,
                           std::vector<RequestId>& preempted);
  std::optional<size_t> num_victims_needed(const Request& req, const kv::ComputedBlocks& hit,
                                           int64_t num_new,
                                           std::span<const RequestPlan> plans) const;
  void allocate(RequestPlan& p);
  void emit(const RequestPlan& p, SchedulerOutput& out);
  kv::ComputedBlocks computed_blocks(const Request& req) const;
  void preempt(Request& req);
  void enqueue_waiting(Request* req, bool front);
  void insert_running(Request* req);
  int64_t chunk_size(const Request& req, int64_t num_new, int64_t budget) const;
  void fork_parent(Request& parent);
  // A recurrent model: the hit cut back to its longest prefix with a saved state.
  kv::ComputedBlocks checkpointed(kv::ComputedBlocks hit) const;
  // A recurrent model: the step `s` of `req` saves the state at the prompt's last full block
  // boundary when it computes it.
  void plan_state_save(const Request& req, ScheduledRequest& s);
  // After a step: request `id`'s saves registered under their blocks' hashes (or given back
  // when the block is not hashed); id 0: every save left, given back.
  void resolve_state_saves(RequestId id);
  std::optional<StopReason> check_stop(const Request& req, int32_t token_id) const;
  void commit(Request& req, const ScheduledRequest& s, const RequestResult* r, RequestOutput& o);
  void commit_pooled(Request& req, const step::PoolingResult* r, RequestOutput& o);
  void finish(Request& req, const StopReason& reason);
  // The most tokens one request runs in a step (its chunk cap).
  int64_t max_step_tokens() const;
  void set_block_tables(const Request& req, ScheduledRequest& s) const;
  int64_t max_sequence_len(const Request& req) const;

  SchedulerOptions options_;
  kv::KvCacheManager& kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  // Sorted: FCFS by (admit_seq, id); kPriority by (priority, arrival_time, id).
  std::vector<Request*> running_;
  std::deque<Request*> waiting_;    // FCFS order, or (priority, arrival) with kPriority
  std::vector<step::BlockCopy> pending_copies_;
  StateCheckpoints checkpoints_;
  struct PendingSave {
    RequestId request_id = 0;
    int32_t slot = 0;
    int64_t boundary = 0;  // the state after this many tokens
  };
  std::vector<PendingSave> pending_saves_;  // made by the step in flight
  int64_t num_checkpoint_saves_ = 0;        // registered since construction
  int64_t num_checkpoint_hits_ = 0;         // admissions that continued one
  std::vector<RequestId> finished_since_schedule_;
  int64_t next_admit_seq_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t num_priority_preemptions_ = 0;
  int64_t num_steps_ = 0;
  DraftPlanner drafts_;
  int64_t reserved_blocks_ = 0;  // blocks the plans of the step being scheduled hold
};

}  // namespace arbor::sched
