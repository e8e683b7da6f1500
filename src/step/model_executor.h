// ModelExecutor: runs one scheduler step. One step is one execute() call.
//
// The in-process executor (executor/local_executor.h) runs the model on the CPU or a GPU (its
// forward's ops are the device's); remote model shards (gRPC, as text-generation-inference's router talks to its shards) plug in
// behind the same interface. A remote executor serialises the SchedulerOutput (token ids, block
// tables, sampling params) and returns the sampled tokens; the Rng state then lives with the
// shard (seeded from the request's seed), which is why every sample draws exactly one value.
//
// Faults (docs/shards.md): an executor whose forward runs in other processes may lose its KV
// memory and per-request state (a shard killed, or hung past its deadline). execute() then
// fails (kFailedPrecondition, naming the shard and what happened to it) with faulted() true;
// nothing of the step happened.
// The engine drops everything that state held (it preempts every running request and forgets
// the prefix cache) and calls recover(), which brings up a new incarnation that knows no request;
// the preempted requests recompute, and with the counter-based RNG their continuation equals a
// fault-free run. The in-process executor never faults.
//
// Threading: called by the engine thread only, one call at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "step/step.h"

namespace arbor::step {

// One shard process's counters (a remote executor's; none for the in-process one). Times are
// totals in seconds since the executor started.
struct ShardStats {
  int32_t rank = 0;
  int64_t pid = 0;                // the shard's process id (0: not known, e.g. --shard-uri)
  uint64_t incarnation = 0;       // its current incarnation (1 at start, + 1 per recovery)
  bool up = false;                // it answered its last message
  int64_t num_steps = 0;          // steps it answered
  double step_s = 0;              // wall time of those steps as the engine saw them
  double forward_s = 0;           // ... of which the shard spent executing them
  double wait_s = 0;              // step_s - forward_s: the control plane (encode, transport, decode)
  double last_step_s = 0;         // the latest step's three times
  double last_forward_s = 0;
  double last_wait_s = 0;
  int64_t num_faults = 0;         // deaths, hangs and refused or malformed messages
  int64_t num_restarts = 0;       // new incarnations brought up
  std::string last_fault;         // "" when none
};

// One point to measure of the step-cost curve (ModelExecutor::measure_step_costs).
struct StepCostProbe {
  int32_t num_tokens = 1;  // >= 1
  // false: n distinct token ids, whose rows a mixture routes as it routes text; true: one id n
  // times, whose rows go to few experts — the second series that separates a mixture's expert
  // term from its per-token one (docs/speculation.md, "Policy").
  bool repeat_token = false;
};

struct StepCostSample {
  double seconds = 0.0;
  double experts_touched = 0.0;  // StepResult::experts_touched of the measured step
};

struct ExpertShape {
  int32_t num_experts = 0;  // per layer; 0: a dense model
  int32_t num_used = 0;     // routed per token
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  // In this order: performs output.block_copies (copy-on-write of forks) on the KV cache; runs
  // the model over every request's scheduled tokens, writing their K/V into the slots of their
  // block tables; for each request with sample == true draws one token from its last logits row
  // with the request's own params and Rng (and its logprobs when asked). Returns one
  // SampledToken per sampling request. An error means the step did not happen.
  virtual Result<StepResult> execute(const SchedulerOutput& output) = 0;

  virtual int32_t vocab_size() const = 0;
  // The longest sequence (prompt + generated tokens) this executor can run: the model's context
  // length, capped by what the KV pool holds ((num_kv_blocks() - 1) * block_size()). > 0.
  virtual int64_t max_model_len() const = 0;
  // ok when 0 <= max_model_len <= max_model_len(); otherwise kInvalidArgument naming the limit
  // it exceeds ("--max-model-len is 4096, the model's context length is 2048").
  virtual Status check_max_model_len(int64_t max_model_len) const = 0;
  // The KV pool the scheduler's KvCacheManager must mirror: blocks (including the null block
  // 0) and tokens per block.
  virtual int64_t num_kv_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  // The KV cache groups (docs/kv_layout.md): per group its attention window in tokens, 0 = full
  // attention, W > 0 = sliding (its blocks that left every query's window may be released and
  // are then never read). Group 0 first; every group has a block table per request
  // (ScheduledRequest::block_tables), over the one pool of num_kv_blocks() blocks. [num_groups]
  virtual std::vector<int32_t> kv_group_windows() const { return {0}; }

  // The step-cost curve the SpecPolicy plans with: for each probe, the seconds of a step that
  // runs probe.num_tokens new tokens of one sequence with logits for every row (a
  // verification), measured on this machine, and the experts its rows were routed to. Call only
  // before the first execute() (it may write any KV block). [probes.size()]
  virtual Result<std::vector<StepCostSample>> measure_step_costs(
      std::span<const StepCostProbe> probes) = 0;
  // A model with recurrent layers (Qwen3.5's Gated DeltaNet): how many requests' states the
  // executor holds at once (the engine runs at most this many sequences); 0: no recurrent
  // state. Such a model's state cannot start mid-sequence from cached blocks, so the engine runs
  // it without prefix caching (a request runs from its first token, or continues a fork
  // parent's state: NewRequestData::fork_of).
  virtual int32_t recurrent_state_slots() const { return 0; }
  // A model with recurrent layers: how many state checkpoints (the state at a prompt's block
  // boundary) it holds for prefix-cache hits; 0: none (the engine then runs without prefix
  // caching). NewRequestData::state_checkpoint and ScheduledRequest::save_state_slot index them.
  virtual int32_t state_checkpoints() const { return 0; }
  // A mixture of experts' experts per layer and experts routed per token; {0, 0} when dense.
  virtual ExpertShape expert_shape() const { return {}; }
  // The cost of proposing one draft token, in seconds (0 for model-free proposers or none).
  virtual double draft_token_cost() const { return 0.0; }
  // Whether the executor can propose drafts (it has a proposer), and whether proposing writes
  // K/V into the request's slots past its committed tokens (a draft model does: the scheduler
  // then reserves max_next_draft_tokens lookahead slots).
  virtual bool has_proposer() const { return false; }
  virtual bool proposer_writes_kv() const { return false; }
  // Whether the proposer keeps up with every request every step whether or not it was asked
  // to propose (an MTP head, fed the target's hidden rows): a request that did not ask is never
  // behind, so starting to propose costs no catch-up.
  virtual bool proposer_keeps_up() const { return false; }
  // > 0 when the proposer returns token trees: their most nodes per request (the scheduler
  // reserves this many lookahead slots for a draft model's tree forwards); 0 = chains.
  virtual int32_t max_tree_nodes() const { return 0; }

  // True from an execute() that failed because the executor lost its state (see "Faults"
  // above) until recover() succeeds; execute() fails at once meanwhile.
  virtual bool faulted() const { return false; }
  // After a fault, once the engine dropped every request's KV: brings up a new incarnation of
  // the lost shards (restarting or reconnecting them) within the executor's recover timeout.
  // Not ok (kFailedPrecondition): they could not be brought back; the error names the shard and
  // its fate, faulted() stays true, and a later step's fault calls this again.
  virtual Status recover() { return ok_status(); }
  // The shards' counters, [num_shards]; empty for an in-process executor.
  virtual std::vector<ShardStats> shard_stats() const { return {}; }
};

}  // namespace arbor::step
