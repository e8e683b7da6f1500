// BlockHashMap: the pool's hash -> block map of cached blocks. Open addressing with linear
// probing and backward-shift deletion over one flat array sized once for the pool, so lookups,
// inserts and erases touch one cache line in the common case, never allocate and never rehash.
// (std::unordered_map's per-node allocation and pointer chasing dominated the decode-step
// benchmark.) Keys are XXH3 outputs, so the low 64 bits index the table directly.
//
// Threading: engine thread only. Ownership: owns its slot array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/kv_cache_utils.h"

namespace arbor::kv {

class BlockHashMap {
 public:
  // Holds at most max_entries keys; capacity is the power of two >= 2 * max_entries (load
  // factor <= 1/2). O(capacity).
  explicit BlockHashMap(int32_t max_entries);

  int32_t size() const { return size_; }
  // O(1) expected.
  std::optional<BlockId> find(const BlockHash& hash) const;
  // Inserts hash -> id; returns false and changes nothing if hash is present. Precondition:
  // size() < max_entries. O(1) expected.
  bool insert(const BlockHash& hash, BlockId id);
  // Removes hash; returns false if it was absent. O(1) expected.
  bool erase(const BlockHash& hash);

 private:
  struct Slot {
    BlockHash hash;
    BlockId block_id = kNoBlock;  // kNoBlock: empty
  };
  size_t home(const BlockHash& hash) const { return static_cast<size_t>(hash.low) & mask_; }
  // The slot holding hash, or the empty slot that ends its probe sequence.
  size_t probe(const BlockHash& hash) const;

  std::vector<Slot> slots_;  // [capacity]
  size_t mask_;
  int32_t size_ = 0;
  int32_t max_entries_;
};

}  // namespace arbor::kv
