// BlockPool: a fixed set of KV blocks with reference counts, an LRU free queue and a
// hash -> block map of cached full blocks (automatic prefix caching). vLLM v1's block_pool.py is
// the model; docs/kv_layout.md has the picture.
//
// The three sets. Every block except the null block (id 0) is in exactly one of them:
//   used           ref_cnt > 0: held by at least one block-table entry (cached or not)
//   cached_free    ref_cnt == 0 and is_cached: in the free queue, K/V reusable by a prefix hit
//   free_uncached  ref_cnt == 0 and !is_cached: in the free queue, K/V meaningless
// so num_used + num_cached_free + num_free_uncached == num_blocks - 1, and the free queue holds
// exactly cached_free + free_uncached. "Cached" blocks (the hash map) = cached used + cached_free.
//
// Free-queue order (front = handed out next):
//   [free_uncached blocks ... | cached_free blocks, least recently freed first]
// Freed uncached blocks go to the front: reusing them loses nothing. Freed cached blocks go to
// the back, so the cached block freed longest ago is evicted first (LRU). Handing out a cached
// free block evicts it: its hash leaves the map and num_evictions grows. A prefix hit on a
// cached free block takes it out of the middle of the queue in O(1) ("revives" it).
//
// Threading: engine thread only; no locks. Ownership: the pool owns every KvCacheBlock; callers
// see blocks by id and through const references that stay valid for the pool's lifetime.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kv/block_hash_map.h"
#include "kv/kv_cache_utils.h"

namespace arbor::kv {

// A change to the set of cached hashes (the router's exact prefix index, docs/router.md): a
// hash became cached (stored) or stopped being cached (removed: evicted, or the cache reset).
struct KvEvent {
  BlockHash hash;  // the pool's key (group_block_hash of the content hash)
  bool stored = true;
  friend bool operator==(const KvEvent&, const KvEvent&) = default;
};

class BlockPool {
 public:
  // num_blocks includes the null block; must be >= 2. Initially every usable block is
  // free_uncached and the queue holds 1, 2, ..., num_blocks - 1 in that order. O(num_blocks).
  explicit BlockPool(int32_t num_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }  // incl. null
  int32_t num_usable_blocks() const { return num_blocks() - 1; }
  int32_t num_free_blocks() const { return free_queue_.size(); }  // allocatable now
  int32_t num_used_blocks() const { return num_used_; }
  int32_t num_cached_free_blocks() const { return num_cached_free_; }
  int32_t num_free_uncached_blocks() const { return free_queue_.size() - num_cached_free_; }
  int32_t num_cached_blocks() const { return cached_.size(); }
  // Blocks held by more than one block-table entry (ref_cnt > 1): prefix-cache hits and the
  // prompt blocks of forked samples. O(1): kept up to date by touch() and free_block().
  int32_t num_shared_blocks() const { return num_shared_; }
  int64_t num_evictions() const { return num_evictions_; }
  // num_used / num_usable, in [0, 1].
  double usage() const { return static_cast<double>(num_used_) / num_usable_blocks(); }

  // O(1). id must be in [0, num_blocks).
  const KvCacheBlock& block(BlockId id) const;

  // Pops n blocks off the front of the free queue (evicting cached ones), sets each ref_cnt to
  // 1 and appends their ids to *out. Precondition: n <= num_free_blocks(). O(n).
  void get_new_blocks(int32_t n, std::vector<BlockId>* out);
  // Adds a reference. A block at ref_cnt 0 leaves the free queue (O(1), from anywhere in it);
  // returns whether it did (the block went from free to used).
  bool touch(BlockId id);
  // Drops a reference. At ref_cnt 0 the block enters the free queue: at the back if cached
  // (kept for prefix hits until evicted), at the front if not. Returns whether it did. O(1).
  bool free_block(BlockId id);

  // The cached block with this hash, if any. O(1) expected.
  std::optional<BlockId> get_cached_block(const BlockHash& hash) const;
  // Registers a used, uncached block under `hash`. Returns false and changes nothing when the
  // hash already names another block (two requests computed the same block): the caller keeps
  // its duplicate uncached. O(1) expected.
  bool cache_block(BlockId id, const BlockHash& hash);

  // Forgets every cached block's hash (an executor lost the K/V they held: docs/shards.md,
  // "Faults"), so no prefix hit can name them. Precondition (CHECKed): no block is used. Returns
  // how many hashes were dropped; they do not count as evictions. O(num_blocks).
  int32_t reset_prefix_cache();

  // Starts (or, with false, stops) recording KvEvents in order; take_events() hands them over.
  // Off by default: recording costs an append per cache change.
  void record_events(bool on) { record_events_ = on; if (!on) events_.clear(); }
  // The events recorded since the last call, oldest first. O(events).
  std::vector<KvEvent> take_events() { return std::exchange(events_, {}); }

  // Free-queue contents front to back. O(num_free_blocks); for tests and debugging.
  std::vector<BlockId> free_queue_order() const;
  // CHECK-fails unless the sets, counters, queue links and hash map agree. O(num_blocks).
  void check_invariants() const;

 private:
  void evict(KvCacheBlock& b);

  std::vector<KvCacheBlock> blocks_;  // [num_blocks]; index = block_id; never resized
  FreeKvCacheBlockQueue free_queue_;
  BlockHashMap cached_;  // hash -> cached block
  int32_t num_used_ = 0;
  int32_t num_cached_free_ = 0;
  int32_t num_shared_ = 0;  // ref_cnt > 1
  int64_t num_evictions_ = 0;
  bool record_events_ = false;
  std::vector<KvEvent> events_;
};

}  // namespace arbor::kv
