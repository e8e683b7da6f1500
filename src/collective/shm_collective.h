// ShmCollective: the collectives of one host's TP group over POSIX shared memory (the default:
// docs/tensor_parallel.md, "Collectives").
//
// The region holds, per rank, two slots (alternating by call: while a slow rank still reads
// call k's slot, a fast one already writes call k + 1 into the other) and two counters:
// `arrived` (the last call whose slot this rank has filled) and `done` (the last call whose
// slots it has finished reading). A call: wait until every rank is done with the call that last
// used this slot (k - 2), write the header (tag, kind, length) and data, publish arrived = k,
// wait until every rank has arrived at k, compare headers, read. all_reduce_sum has every rank
// sum all slots itself with tree_sum in rank order: one meeting per call, the lowest latency at
// the sizes a decode step sends (a few to a few hundred KiB). Messages longer than a slot are
// sent in slot-sized pieces, one call each. Waits spin briefly, then yield, then sleep in
// 50 us steps, and check the deadline and the group's failure flag: a rank that fails a call
// (deadline, mismatch) records why in the region, so the others fail at once with that reason
// instead of each waiting out its own deadline.
//
// Setup: ShmRegion::create_anonymous (MAP_SHARED, inherited by fork(): tests, one launcher
// forking its ranks) or ShmRegion::open_named (shm_open: ranks started separately, each opening
// the same name; all zero-initialised state is valid, so no rank needs to go first). A region
// serves one group incarnation: a restarted group opens a new one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "collective/collective.h"

namespace arbor::collective {

struct ShmRegionOptions {
  int size = 1;                           // ranks in the group, >= 1
  size_t slot_bytes = size_t{4} << 20;    // bytes one rank sends per call (larger: pieces)
};

// A shared mapping laid out for `size` ranks. Move-only; unmaps on destruction (and unlinks a
// named region when it was opened with unlink_on_close).
class ShmRegion {
 public:
  // An anonymous shared mapping; children forked after this call share it.
  static Result<std::shared_ptr<ShmRegion>> create_anonymous(const ShmRegionOptions& options);
  // shm_open(name) (name: "/arbor-tp-...", created when absent), sized and laid out for
  // `options`; a region already laid out for other options is kFailedPrecondition.
  static Result<std::shared_ptr<ShmRegion>> open_named(const std::string& name,
                                                       const ShmRegionOptions& options,
                                                       bool unlink_on_close);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int size() const { return options_.size; }
  size_t slot_bytes() const { return options_.slot_bytes; }
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  static size_t bytes_for(const ShmRegionOptions& options);

 private:
  ShmRegion() = default;
  ShmRegionOptions options_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  std::string unlink_name_;
};

class ShmCollective final : public Collective {
 public:
  // Rank `rank` of the region's group. The region must outlive this object.
  ShmCollective(std::shared_ptr<ShmRegion> region, int rank,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  int rank() const override { return rank_; }
  int size() const override { return region_->size(); }
  std::string_view name() const override { return "shm"; }
  Status all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) override;
  Status gather(const void* send, size_t bytes, void* recv, const CollectiveTag& tag) override;
  Status broadcast(void* data, size_t bytes, const CollectiveTag& tag) override;
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  struct Piece;
  Status all_reduce_piece(float* data, int64_t n, const Piece& piece);
  Status broadcast_piece(uint8_t* data, size_t bytes, const Piece& piece);
  Status gather_piece(const uint8_t* send, size_t bytes, size_t offset, size_t total,
                      uint8_t* recv, const Piece& piece);
  // Waits until every rank's counter (arrived or done) is >= target.
  Status wait_all(bool arrived, uint64_t target, const Piece& piece, const char* what);
  Status check_headers(const Piece& piece);
  // Records `s` as this object's (and the group's) failure; returns it.
  Status fail(Status s);

  std::shared_ptr<ShmRegion> region_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;  // calls (pieces) made so far
  Status broken_;
};

}  // namespace arbor::collective
