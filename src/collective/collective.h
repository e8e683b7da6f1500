// Collectives among the ranks of one tensor-parallel group (docs/tensor_parallel.md).
//
// A TP group is `size` processes (ranks 0 .. size-1), each running the same forward on its slice
// of the weights. They meet in two collectives:
//   all_reduce_sum  every rank contributes [n] floats and every rank gets their sum, added in a
//                   FIXED binary tree over the ranks (tree_sum below: ((r0 + r1) + (r2 + r3))),
//                   never in arrival order, so the bits do not depend on timing;
//   gather          every rank contributes `bytes`; rank 0 gets them concatenated by rank.
// Every call carries a CollectiveTag (the forward's step, its batch digest and the call's index
// within the step) which every implementation compares across ranks: ranks running different
// batches, or different collectives of one batch, get an error naming both tags instead of
// silently summing unrelated data. Every call has a deadline (set_timeout): a rank that does not
// arrive in time (killed, stopped, hung) fails the call on the others with an error naming it,
// instead of a hang. After any error the object is broken: every later call returns the first
// error at once (the group is rebuilt, not resumed).
//
// Thread-safety: one thread per rank calls the collectives, in the same order on every rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace arbor::collective {

struct CollectiveTag {
  uint64_t step = 0;    // the forward's step number, the same on every rank
  uint64_t digest = 0;  // a hash of the step's batch (LlamaForward: tokens, positions, layout)
  uint32_t op = 0;      // the collective's index within the step
};

std::string tag_string(const CollectiveTag& t);

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm", ... for logs and errors.
  virtual std::string_view name() const = 0;

  // data: [n] floats on every rank, replaced by tree_sum over the ranks' data in rank order (the
  // same bits on every rank). Errors: a tag or length mismatch between ranks (kDataLoss), a rank
  // missing the deadline or a rank that failed (kFailedPrecondition), a broken group.
  virtual Status all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) = 0;
  // send: [bytes] on every rank (the same count everywhere, else kDataLoss). Rank 0: recv is
  // [size, bytes], rank r's bytes at offset r * bytes; other ranks: recv is not touched (may be
  // null). Errors as all_reduce_sum.
  virtual Status gather(const void* send, size_t bytes, void* recv, const CollectiveTag& tag) = 0;

  // data: [bytes] on every rank (the same count everywhere, else kDataLoss), replaced by rank
  // 0's bytes on the other ranks (a token rank 0 sampled, where no router sends it to every
  // rank). Errors as all_reduce_sum.
  virtual Status broadcast(void* data, size_t bytes, const CollectiveTag& tag) = 0;

  // The deadline of every later call: how long a rank waits for the others in one collective.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

// out[i] = the sum of parts[0 .. k)[i] in a fixed binary tree: adjacent pairs first, level by
// level ((p0 + p1) + (p2 + p3)); an odd part at a level goes up unchanged. k >= 1; out may alias
// parts[0]. The order every all-reduce and the canonical K segments use (docs/tensor_parallel.md).
void tree_sum(std::span<const float* const> parts, float* out, int64_t n);

}  // namespace arbor::collective
