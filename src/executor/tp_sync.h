// TpSync: what the ranks of a tensor-parallel group exchange besides the forward's own
// collectives (docs/shards.md, "Tensor parallelism across shard processes"). Every rank receives the same Step, so the
// batch is the same everywhere except for what only rank 0 knows:
//   * the drafts to verify: rank 0's Drafter proposed them (their tokens never leave the
//     executor); the other ranks need their tokens and parents to run the same rows;
//   * the accepted paths: rank 0 verifies (sampling runs on rank 0 only); every rank moves the
//     accepted nodes' K/V of its own kv heads into place (LocalExecutor::compact_kv).
// Each is one broadcast from rank 0, made only when a request of the step verifies drafts (a
// fact every rank reads from the Step), so every rank makes the same calls in the same order.
//
// Threading: the engine thread of the rank (one per process).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "collective/collective.h"
#include "sampling/token_tree.h"
#include "step/step.h"

namespace arbor::executor {

class TpSync {
 public:
  // collective: the group's (null or size 1: a single rank, every call returns at once).
  explicit TpSync(collective::Collective* collective) : collective_(collective) {}

  bool active() const { return collective_ != nullptr && collective_->size() > 1; }
  // Rank 0 (or a single rank): proposes, samples, verifies and answers the engine.
  bool leader() const { return !active() || collective_->rank() == 0; }

  // trees: [requests]. Rank 0: the trees it verifies (request i's first s.num_drafts nodes);
  // other ranks: replaced by rank 0's (tokens and parents; one-hot, which is all a forward reads).
  Status share_drafts(const step::SchedulerOutput& output, std::vector<sampling::TokenTree>& trees);

  // accepted: [requests]. Rank 0: each request's accepted draft indices (empty when none or when
  // its sampling failed); other ranks: replaced by rank 0's.
  Status share_accepted(const step::SchedulerOutput& output,
                        std::vector<std::vector<int32_t>>& accepted);

 private:
  collective::CollectiveTag tag(const step::SchedulerOutput& output);

  collective::Collective* collective_;
  uint32_t calls_ = 0;  // broadcasts made so far (the same on every rank)
  std::vector<int32_t> buf_;
};

}  // namespace arbor::executor
