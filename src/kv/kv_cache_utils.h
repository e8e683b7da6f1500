// Vocabulary of the paged KV cache: block ids, block hashes, the block record and the intrusive
// free queue. Pure bookkeeping; no tensors. (How many blocks a memory budget holds is decided by
// the model, which owns the storage: model::PagedKvCache::blocks_for_budget.) See docs/kv_layout.md for the picture.
//
// Threading: nothing here is thread-safe. Every object is owned by the engine thread (through
// BlockPool / KvCacheManager); hash_block_tokens() is a pure function and may be called from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace arbor::kv {

// Index of a block in the paged K/V pools (model::PagedKvCache). int32 because the executor's
// batch layout (kv_page_indices) is int32.
using BlockId = int32_t;
// Block 0 is reserved: never handed out, never in the free queue, never in a block table.
inline constexpr BlockId kNullBlockId = 0;
// Marks "no block" in the free-queue links.
inline constexpr BlockId kNoBlock = -1;

// 128-bit XXH3 digest of one full block of committed tokens and everything before it.
//
// Collision policy: two blocks with equal BlockHash are treated as having equal K/V; tokens are
// not re-verified on a hit. A 128-bit hash makes an accidental collision among N distinct blocks
// happen with probability <= N^2 / 2^129 (N = 2^40 blocks: < 2^-49). XXH3 is not a
// cryptographic hash: a client that can choose prompts could in principle craft a collision, so
// tenants that must not share K/V get distinct cache salts (the salt enters the first block's
// hash, and the chain carries it to every later block).
struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// For hash containers of BlockHash (the router's prefix index, the engine's event log): the
// digest's low half, already uniformly distributed.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low); }
};

// The parent hash of a request's first block.
inline constexpr BlockHash kRootParentHash{0, 0};

// Keys besides the tokens that decide whether two blocks hold the same K/V.
struct BlockHashExtraKeys {
  // Per-request cache salt; hashed into the first block only (the chain carries it on).
  std::string_view cache_salt{};
  // LoRA adapter the K/V were computed with; 0 = base model. Hashed into every block.
  uint32_t adapter_id = 0;
};

// hash(block i) = XXH3_128(parent || token_ids || adapter_id || salt_len || salt), where
//   parent     16 bytes: hash of block i-1 (low then high, little-endian), kRootParentHash for i=0
//   token_ids  4 bytes each, little-endian int32, exactly block_size of them
//   adapter_id 4 bytes little-endian
//   salt_len   4 bytes little-endian, then the salt bytes; salt_len = 0 unless is_first_block
// The fixed-width fields make the encoding unambiguous. O(block_size + salt length).
BlockHash hash_block_tokens(const BlockHash& parent, std::span<const int32_t> token_ids,
                            const BlockHashExtraKeys& extra, bool is_first_block);

// The key under which KV cache group `group` caches the block whose hash is `hash`. Groups share
// the content hashes (a block's tokens and prefix are the same in every group) but not the
// blocks: each group's layers have their own K/V, so the pool's hash map is keyed by (hash,
// group). Group 0's key is the hash itself; group g > 0 XORs the halves with the first two
// SplitMix64 outputs seeded with g (base/bits.h): a bijection per group, so keys of distinct
// (hash, group) pairs collide with the same probability as two hashes. O(1).
BlockHash group_key(const BlockHash& hash, int32_t group);  // group > 0
inline BlockHash group_block_hash(const BlockHash& hash, int32_t group) {
  return group == 0 ? hash : group_key(hash, group);
}

// One block of the pool. Owned by BlockPool; readers get const references.
struct KvCacheBlock {
  BlockId block_id = kNullBlockId;
  // Number of block-table entries (over all requests) that hold this block.
  int32_t ref_cnt = 0;
  // True while block_hash is registered in the pool's hash -> block map ("cached").
  bool is_cached = false;
  BlockHash block_hash{};
  // Free-queue links; kNoBlock when not in the queue (or at its ends).
  BlockId prev_free = kNoBlock;
  BlockId next_free = kNoBlock;
  bool in_free_queue = false;
};

// Doubly linked list of free blocks threaded through KvCacheBlock::prev_free/next_free, so
// removal from the middle (a prefix hit reviving a cached free block) is O(1). Front = next to be
// handed out (evicted first); back = most recently freed cached block.
// Does not own the blocks: it links records of an array owned by BlockPool, which must outlive
// it and must not be resized while blocks are linked.
class FreeKvCacheBlockQueue {
 public:
  explicit FreeKvCacheBlockQueue(std::span<KvCacheBlock> blocks) : blocks_(blocks) {}

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  BlockId front() const { return head_; }
  BlockId back() const { return tail_; }
  // O(1). The block must not be in the queue.
  void push_front(BlockId id);
  void push_back(BlockId id);
  // O(1). The queue must not be empty.
  BlockId pop_front();
  // O(1). The block must be in the queue.
  void remove(BlockId id);

 private:
  void link(BlockId id, BlockId prev, BlockId next);

  std::span<KvCacheBlock> blocks_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  int32_t size_ = 0;
};

}  // namespace arbor::kv
