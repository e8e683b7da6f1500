// KvCacheManager: per-request block tables over a BlockPool, with automatic prefix caching, for
// one or more KV cache groups (sliding-window layers). vLLM v1's kv_cache_manager.py,
// kv_cache_coordinator.py and single_type_kv_cache_manager.py are the model;
// docs/kv_layout.md has the rules and pictures.
//
// Threading: the engine thread only (the thread that owns the Scheduler). No locks; no method
// may be called concurrently with any other.
//
// Ownership: the manager owns the pool and every request's block tables. Requests are known by
// KvRequestId; the caller passes a KvRequest view per call and the manager keeps no pointer into
// it. A request exists here from its first successful allocate_slots (or fork) until free().
//
// Vocabulary (tokens of one request, block_size = B):
//   token_ids            committed tokens: prompt + accepted outputs (never draft tokens)
//   num_computed_tokens  leading tokens whose K/V are in the request's blocks
//   slots                table.size() * B positions the request may write K/V into
//   hashed blocks        the leading full blocks whose B tokens are all committed and computed;
//                        only these are ever cached (registered in the pool's hash map)
//
// KV cache groups: layers with the same attention window form a group (group_windows: 0 = full
// attention, W > 0 = a query at position p reads positions p - W + 1 .. p). Every group has its
// own table per request over the one shared pool (a block id belongs to one group at a time; the
// model stores group g's layers of block b in the same physical pools as every other group's).
// All of a request's tables have the same length: entry i holds logical block i (positions
// [i * B, (i + 1) * B)). In a sliding group, the blocks wholly before the window of the earliest
// position the request can still query (num_computed_tokens: the first query of its next step;
// drafts, tree nodes and prefill chunks all come later) are released to the pool and their
// entries become kNullBlockId, so a sliding group holds about W / B + 1 blocks per request
// however long it grows. With one full-attention group (the default) everything below is
// exactly the single-table manager it replaces.
//
// Caching rule (decided here, used by the scheduler): a block is cached once all its tokens are
// both committed and computed. allocate_slots() caches what its request view allows; the
// scheduler should also call cache_full_blocks() right after a step (update_from_output), so
// blocks are shareable one step earlier and a finishing request's last blocks survive free().
// Consequence: two identical prompts admitted in the same step do not share blocks that step
// (the second one hits from its next admission on); K/V is never read before it is written.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_cache_utils.h"

namespace arbor::kv {

using KvRequestId = uint64_t;

// What the manager needs to know about a request, built by the caller for each call. Independent
// of the engine's Request type. Only read during the call.
struct KvRequest {
  KvRequestId request_id = 0;
  // [num_tokens] committed token ids: prompt + accepted outputs so far. Must agree with the
  // tokens of earlier calls for the same request (append-only).
  std::span<const int32_t> token_ids{};
  // Tokens at the front of token_ids whose K/V an executed step has written into this request's
  // blocks. 0 <= num_computed_tokens <= token_ids.size().
  int64_t num_computed_tokens = 0;
  // Requests share cached blocks only if their salts (and adapters) are equal.
  std::string_view cache_salt{};
  // LoRA adapter id; 0 = base model.
  uint32_t adapter_id = 0;
};

// The longest cached prefix of a request, as found by get_computed_blocks().
struct ComputedBlocks {
  // [num_groups][num_blocks], or empty (no hit): per group the table entries of the hit, in
  // table order. A full-attention group's are all cached blocks; a sliding group's are
  // kNullBlockId up to the window of the first token to compute, cached blocks after it.
  std::vector<std::vector<BlockId>> group_block_ids{};
  std::vector<BlockHash> block_hashes{}; // [num_blocks] the hit blocks' hashes (checked on allocation)
  int64_t num_computed_tokens = 0;       // num_blocks * block_size
  int64_t num_blocks() const { return static_cast<int64_t>(block_hashes.size()); }
};

// Copy the K/V of the first num_tokens slots of src_block into dst_block (every layer, K and V;
// block ids are pool-wide, so the copy needs no group).
struct BlockCopy {
  BlockId src_block = kNullBlockId;
  BlockId dst_block = kNullBlockId;
  int32_t num_tokens = 0;
};

struct ForkResult {
  // One copy per KV cache group when the shared prefix ends inside a block (none otherwise): the
  // child got a fresh block per group that the executor must fill from the parent's before the
  // child's next step. The source blocks belong to the parent; if the parent is freed or
  // truncated first, a src_block may be handed out again, so the copies must run before any K/V
  // write of the next forward (executors copy first). [num_groups] or empty.
  std::vector<BlockCopy> copies_on_write{};
};

// Counts follow BlockPool's sets (block_pool.h); the null block is in none of them.
struct KvCacheStats {
  int32_t num_usable_blocks = 0;         // num_blocks - 1
  int32_t num_used_blocks = 0;           // ref_cnt > 0
  int32_t num_cached_free_blocks = 0;    // ref_cnt == 0, cached (evictable, reusable)
  int32_t num_free_uncached_blocks = 0;  // ref_cnt == 0, not cached
  int32_t num_cached_blocks = 0;         // in the hash map, used or free
  int32_t num_shared_blocks = 0;         // ref_cnt > 1: in several block tables (prefix hits, forks)
  double usage = 0.0;                    // num_used_blocks / num_usable_blocks
  int64_t num_queries = 0;               // record_prefix_query() calls (admissions)
  int64_t num_hits = 0;                  // ... whose hit had at least one block
  int64_t num_query_tokens = 0;          // sum of token_ids.size() over queries
  int64_t num_hit_tokens = 0;            // sum of the hits' num_computed_tokens
  double prefix_hit_rate = 0.0;          // num_hit_tokens / num_query_tokens (0 if no queries)
  int64_t num_evictions = 0;             // cached blocks whose hash was dropped for reuse
  // Per KV cache group ([num_groups]): blocks its tables hold (they sum to num_used_blocks), and
  // blocks released because they left every query's sliding window (0 for full attention).
  std::vector<int32_t> group_used_blocks{};
  std::vector<int64_t> group_released_blocks{};
};

struct KvCacheManagerOptions {
  int32_t num_blocks = 0;              // total, including the null block; >= 2
  int32_t block_size = 16;             // tokens per block; >= 1
  bool enable_prefix_caching = true;   // false: no hashing, no hits, nothing cached
  // One entry per KV cache group: its attention window in tokens, 0 = full attention (keeps
  // every block), W > 0 = sliding (a query at position p reads positions p - W + 1 .. p; blocks
  // wholly before the earliest window the request can still query are released). Each >= 0.
  // Empty: one full-attention group.
  std::vector<int32_t> group_windows{};
};

class KvCacheManager {
 public:
  // CHECK-fails on bad options (num_blocks < 2, block_size < 1, a negative window). O(num_blocks).
  explicit KvCacheManager(const KvCacheManagerOptions& options);
  // Virtual for tests that count allocations (the scheduler calls allocate_slots at most once
  // per request per step; tests/sched wraps it to show that).
  virtual ~KvCacheManager() = default;
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // The longest prefix of request.token_ids that every group can serve from cached blocks,
  // leaving at least one token to compute (at most (num_tokens - 1) / block_size blocks) and
  // ending at or before max_num_computed_tokens. A full-attention group serves h blocks when its
  // first h blocks are cached; a sliding group of window W when the ceil((W - 1) / B) blocks
  // before block h are (the window of the first token to compute), or all of its first h are.
  // The hit is the largest h that every group serves. Changes no block and counts nothing:
  // the scheduler asks again every step while a request waits blocked, and counts the query once,
  // on admission, with record_prefix_query().
  // For a request that holds no blocks the hashes computed here are kept until it gets blocks
  // (allocate_slots) or is freed, so asking again hashes only blocks not hashed before; its
  // tokens, salt and adapter must not change in between (KvRequest: append-only).
  // The result is valid until the next call that allocates: pass it to allocate_slots() for the
  // same request right away. O(hit blocks + 1) lookups; as many hashes the first time, none
  // after that unless the hit grew (plus, with sliding groups, a backwards scan of the hit).
  ComputedBlocks get_computed_blocks(
      const KvRequest& request,
      int64_t max_num_computed_tokens = std::numeric_limits<int64_t>::max());

  // Counts one prefix-cache query in stats(): request.token_ids.size() query tokens and
  // hit.num_computed_tokens hit tokens (a hit when hit has blocks). Call it once per admission,
  // with the ComputedBlocks that the admission used. O(1).
  void record_prefix_query(const KvRequest& request, const ComputedBlocks& hit);

  // Makes the request's tables cover
  //   request.num_computed_tokens + new_computed_blocks.num_computed_tokens
  //   + num_new_tokens + num_lookahead_tokens
  // slots: first releases the sliding groups' blocks that left the window of position
  // request.num_computed_tokens (release_skipped_blocks), then takes references on
  // new_computed_blocks (reviving free ones), then appends fresh blocks to every group's table
  // from the free queue (evicting the least recently freed cached blocks). Then caches every
  // full block that is committed and computed per `request`.
  // Returns group 0's block ids appended by this call (the computed blocks first), a view into
  // the table valid until the next call that changes this request; or nullopt when the free
  // blocks do not suffice, in which case nothing changed but the release. Tables only grow here.
  // Preconditions: counts >= 0; new_computed_blocks non-empty only for a request without blocks
  // and with request.num_computed_tokens == 0, and still cached as returned.
  // O(blocks appended + blocks cached).
  virtual std::optional<std::span<const BlockId>> allocate_slots(
      const KvRequest& request, int64_t num_new_tokens,
      const ComputedBlocks& new_computed_blocks = ComputedBlocks{},
      int64_t num_lookahead_tokens = 0);

  // How many free-queue blocks allocate_slots(request, num_new_tokens, new_computed_blocks,
  // num_lookahead_tokens) would take: fresh blocks for every group plus the computed blocks it
  // would revive (blocks it would release first are not subtracted). O(hit blocks).
  int64_t num_blocks_to_allocate(const KvRequest& request, int64_t num_new_tokens,
                                 const ComputedBlocks& new_computed_blocks = ComputedBlocks{},
                                 int64_t num_lookahead_tokens = 0) const;

  // The most blocks one request of num_tokens tokens can hold at once, over all groups, when no
  // step runs more than max_step_tokens tokens (its chunk plus lookahead): a full-attention
  // group needs ceil(num_tokens / B); a sliding group of window W at most the blocks touched by
  // the W - 1 + max_step_tokens positions a step can read or write, and never more than that.
  // The scheduler admits no request whose need exceeds the pool. O(num_groups).
  int64_t max_blocks_per_request(int64_t num_tokens, int64_t max_step_tokens) const;

  // Caches the request's full blocks that are committed and computed per `request` and not yet
  // hashed, then releases the sliding groups' blocks that left the window of position
  // request.num_computed_tokens. Idempotent; no-op for an unknown request. O(newly hashed
  // blocks + released blocks).
  void cache_full_blocks(const KvRequest& request);

  // Drops the request's references, tail block first: its cached blocks go to the back of the
  // free queue in reverse table order (so the tail is evicted first), its uncached blocks to the
  // front (reused first). Cached blocks keep their hash until evicted. Forgets the request and
  // the hashes get_computed_blocks() kept for it; nothing else for a waiting request that never
  // got blocks. O(table size).
  void free(KvRequestId request_id);

  // n > 1 sampling: `child` (unknown so far) shares the K/V of the parent's first num_tokens
  // tokens, in every group. Full blocks are shared (ref_cnt + 1; a sliding group's released
  // entries stay kNullBlockId); a partially filled block at num_tokens is copied on write: the
  // child gets a fresh block per group and the returned BlockCopies. nullopt (nothing changed)
  // when those blocks cannot be allocated. Preconditions: the parent exists and num_tokens <= its
  // slots; num_tokens should not exceed its computed tokens; a sliding group still holds the
  // window of position num_tokens (CHECKed; true for num_tokens == the parent's computed
  // tokens, as the scheduler forks). O(table size * groups).
  std::optional<ForkResult> fork(KvRequestId parent_id, KvRequestId child_id, int64_t num_tokens);

  // Rolls back to num_tokens slots (rejected speculative tokens), in every group: drops the
  // references to the blocks past ceil(num_tokens / block_size), tail first (speculative blocks
  // are uncached, so they go to the front of the free queue); keeps the partially filled tail.
  // Preconditions: num_tokens >= 0; it does not cut
  // into a hashed block; a partially kept tail is held by this request alone and uncached (the
  // request will overwrite its slots past num_tokens). No-op when num_tokens >= slots.
  // O(blocks dropped).
  void truncate(KvRequestId request_id, int64_t num_tokens);

  // Drops every cached block's hash (BlockPool::reset_prefix_cache): the executor lost its K/V.
  // Precondition (CHECKed): no request holds a block. Returns the hashes dropped.
  int32_t reset_prefix_cache() { return pool_.reset_prefix_cache(); }

  // The request's block table in `group` as int32 page indices ([num_blocks], the executor's
  // kv_page_indices of that group for this request; a sliding group's released entries are
  // kNullBlockId). Empty for an unknown id. Valid until the next call that changes this request.
  // O(1).
  std::span<const BlockId> block_ids(KvRequestId request_id, int32_t group = 0) const;
  // Hashes of the request's hashed blocks ([num_hashed_blocks], a prefix of the table). O(1).
  std::span<const BlockHash> block_hashes(KvRequestId request_id) const;
  // table size * block_size; 0 for an unknown id. O(1).
  int64_t num_slots(KvRequestId request_id) const;
  bool has_request(KvRequestId request_id) const { return requests_.contains(request_id); }
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

  int32_t block_size() const { return block_size_; }
  int32_t num_groups() const { return static_cast<int32_t>(windows_.size()); }
  // [num_groups] each group's window (0 = full attention).
  std::span<const int32_t> group_windows() const { return windows_; }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  KvCacheStats stats() const;
  const BlockPool& block_pool() const { return pool_; }
  // The pool's cache changes (BlockPool::record_events / take_events): for the router's prefix
  // index, published by the engine after every step.
  void record_kv_events(bool on) { pool_.record_events(on); }
  std::vector<KvEvent> take_kv_events() { return pool_.take_events(); }

  // CHECK-fails unless pool and tables agree: a request's tables have one length; the null
  // block appears only as a leading run of a sliding group's table; no block twice in one table
  // nor in two groups; every ref_cnt equals the number of table entries holding it; each
  // group's used-block count is right; hashed blocks that are cached carry the request's hash
  // (keyed by group); no request with blocks has kept waiting hashes.
  // O(num_blocks + table entries).
  void check_invariants() const;

 private:
  struct RequestBlocks {
    // [num_groups][num_blocks] the block tables, append-only except truncate() and the
    // release of a sliding group's leading entries (to kNullBlockId).
    std::vector<std::vector<BlockId>> tables;
    std::vector<BlockHash> block_hashes;  // [num_hashed_blocks]
    // [num_groups] leading kNullBlockId entries of each table (0 for full attention).
    std::vector<int64_t> num_skipped;
  };

  bool is_sliding(int32_t group) const { return windows_[static_cast<size_t>(group)] > 0; }
  // Blocks a sliding group needs before a hit ends, ceil((W - 1) / B).
  int64_t window_blocks(int32_t group) const;
  // Appends the hash chain of request's full blocks to `hashes` up to num_blocks entries.
  void extend_hashes(const KvRequest& request, std::vector<BlockHash>& hashes,
                     int64_t num_blocks) const;
  int64_t full_groups_hit(const KvRequest& request, std::vector<BlockHash>& hashes,
                          int64_t max_blocks, std::vector<std::vector<BlockId>>* ids) const;
  // The longest hit <= max_blocks that a sliding group serves with its cached blocks.
  int64_t sliding_hit(int32_t group, std::span<const BlockHash> hashes, int64_t max_blocks) const;
  // Pool operations that keep the per-group used-block counts.
  void take_new_blocks(int32_t group, int64_t n, std::vector<BlockId>& table);
  void touch_block(int32_t group, BlockId id);
  void free_block(int32_t group, BlockId id);
  void release_skipped_blocks(RequestBlocks& blocks, int64_t num_computed_tokens);
  void cache_blocks(RequestBlocks& blocks, const KvRequest& request);
  void check_computed_blocks(const ComputedBlocks& computed) const;
  static std::span<const BlockId> appended(const RequestBlocks& blocks, size_t old_size);

  int32_t block_size_;
  bool enable_prefix_caching_;
  std::vector<int32_t> windows_;  // [num_groups]
  BlockPool pool_;
  std::vector<int32_t> block_group_;  // [num_blocks] the group a used or cached block serves
  std::vector<int32_t> group_used_;   // [num_groups]
  std::vector<int64_t> group_released_;  // [num_groups]
  bool any_sliding_;
  std::unordered_map<KvRequestId, RequestBlocks> requests_;
  // Hash chains of the leading full blocks of requests that hold no blocks yet, as far as
  // get_computed_blocks() has hashed them ([num_hashed] each, kRootParentHash-rooted). Dropped by
  // allocate_slots() when the request gets blocks, and by free().
  std::unordered_map<KvRequestId, std::vector<BlockHash>> waiting_hashes_;
  int64_t num_queries_ = 0;
  int64_t num_hits_ = 0;
  int64_t num_query_tokens_ = 0;
  int64_t num_hit_tokens_ = 0;
};

}  // namespace arbor::kv
