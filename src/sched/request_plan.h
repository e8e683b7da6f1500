// RequestPlan: one request's part of the step being scheduled. Scheduler::schedule() plans every
// request first (committed tokens, drafts to verify, what to propose next, lookahead slots),
// then allocates each plan's KV slots with one KvCacheManager::allocate_slots call and emits
// one ScheduledRequest per plan (docs/scheduler.md, "schedule()").
#pragma once

#include <cstdint>

#include "sched/request.h"

namespace arbor::sched {

struct RequestPlan {
  Request* req = nullptr;
  int64_t num_new = 0;      // committed tokens run
  bool sample = false;      // the step reaches its last committed token
  bool is_new = false;      // admitted (or resumed) this step
  int32_t num_drafts = 0;   // drafts verified: a prefix of req->spec.drafts
  int32_t ask_depth = 0;    // propose up to this many levels after the step (0: none)
  int32_t ask_nodes = 0;    // > 0: a tree of at most this many nodes; 0: a chain
  // Slots reserved past the committed tokens: the drafts plus a draft model's next proposals.
  int32_t lookahead = 0;
  int64_t reserved_blocks = 0;  // blocks the plan holds in the step's ledger until allocated
  bool allocated = false;       // admitted requests allocate at admission
};

}  // namespace arbor::sched
