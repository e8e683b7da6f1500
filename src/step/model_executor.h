// ModelExecutor: runs one scheduler step. One step is one execute() call.
//
// The in-process executor (executor/local_executor.h) runs the model on the CPU or a GPU (its
// forward's ops are the device's); remote model shards (gRPC, as text-generation-inference's router talks to its shards) plug in
// behind the same interface. A remote executor serialises the SchedulerOutput (token ids, block
// tables, sampling params) and returns the sampled tokens; the Rng state then lives with the
// shard (seeded from the request's seed), which is why every sample draws exactly one value.
//
// Threading: called by the engine thread only, one call at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "step/step.h"

namespace arbor::step {

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

  // The step-cost curve the SpecPolicy plans with: for each n in `num_tokens` (increasing,
  // starting at 1), the seconds of a step that runs n new tokens of one sequence with logits for
  // every row (a verification), measured on this machine. Call only before the first execute()
  // (it may write any KV block). [num_tokens.size()]
  virtual Result<std::vector<double>> measure_step_costs(std::span<const int32_t> num_tokens) = 0;
  // The cost of proposing one draft token, in seconds (0 for model-free proposers or none).
  virtual double draft_token_cost() const { return 0.0; }
  // Whether the executor can propose drafts (it has a proposer), and whether proposing writes
  // K/V into the request's slots past its committed tokens (a draft model does: the scheduler
  // then reserves max_next_draft_tokens lookahead slots).
  virtual bool has_proposer() const { return false; }
  virtual bool proposer_writes_kv() const { return false; }
  // > 0 when the proposer returns token trees: their most nodes per request (the scheduler
  // reserves this many lookahead slots for a draft model's tree forwards); 0 = chains.
  virtual int32_t max_tree_nodes() const { return 0; }
};

}  // namespace arbor::step
