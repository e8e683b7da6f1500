// EngineOptions: the scheduling knobs shared by every command that runs the engine (`arbor
// serve`, `arbor bench throughput`). cli/engine_flags.h maps them to command-line flags; the
// executor's own knobs (KV pool, threads) are executor::ExecutorOptions.
#pragma once

#include <cstdint>

#include "sched/scheduler.h"

namespace arbor::engine {

struct EngineOptions {
  int32_t max_num_seqs = 64;              // --max-num-seqs: running sequences per step
  int32_t max_num_batched_tokens = 2048;  // --max-num-batched-tokens: token budget per step
  int32_t long_prefill_token_threshold = 0;  // per-request chunk cap; 0 = the budget
  int32_t max_waiting_requests = 1024;    // admission control: more waiting ones are rejected
  // --max-model-len: longest sequence (prompt + generated tokens); 0 = the executor's
  // max_model_len() (the model's context length, capped by the KV pool). Larger than that is a
  // startup error (the executor's load checks it).
  int64_t max_model_len = 0;
  bool enable_prefix_caching = true;
  sched::SchedulingPolicy policy = sched::SchedulingPolicy::kFcfs;
  // --spec-k: drafts verified per request per step, at most; 0 = no speculation. The executor
  // must have a proposer when > 0.
  int32_t max_spec_tokens = 0;
};

}  // namespace arbor::engine
