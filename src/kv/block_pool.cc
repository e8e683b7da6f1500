#include "kv/block_pool.h"

#include "base/check.h"

namespace arbor::kv {

BlockPool::BlockPool(int32_t num_blocks)
    : blocks_(static_cast<size_t>(num_blocks > 0 ? num_blocks : 0)),
      free_queue_(blocks_),
      cached_(num_blocks) {
  ARBOR_CHECK_GE(num_blocks, 2) << "a block pool needs the null block and one usable block";
  for (BlockId id = 0; id < num_blocks; ++id) blocks_[id].block_id = id;
  for (BlockId id = 1; id < num_blocks; ++id) free_queue_.push_back(id);
}

const KvCacheBlock& BlockPool::block(BlockId id) const {
  ARBOR_CHECK(id >= 0 && id < num_blocks()) << "block id " << id << " out of range";
  return blocks_[id];
}

void BlockPool::evict(KvCacheBlock& b) {
  const bool erased = cached_.erase(b.block_hash);
  ARBOR_CHECK(erased) << "cached block " << b.block_id << " was not in the hash map";
  if (record_events_) events_.push_back(KvEvent{.hash = b.block_hash, .stored = false});
  b.is_cached = false;
  b.block_hash = BlockHash{};
  ++num_evictions_;
}

int32_t BlockPool::reset_prefix_cache() {
  ARBOR_CHECK_EQ(num_used_, 0) << "the prefix cache is reset only when no block is used";
  int32_t n = 0;
  for (KvCacheBlock& b : blocks_) {
    if (!b.is_cached) continue;
    evict(b);
    --num_evictions_;
    ++n;
  }
  num_cached_free_ = 0;
  return n;
}

void BlockPool::get_new_blocks(int32_t n, std::vector<BlockId>* out) {
  ARBOR_CHECK_LE(n, num_free_blocks()) << "asked for more blocks than are free";
  for (int32_t i = 0; i < n; ++i) {
    KvCacheBlock& b = blocks_[free_queue_.pop_front()];
    ARBOR_DCHECK(b.ref_cnt == 0);
    if (b.is_cached) {
      --num_cached_free_;
      evict(b);
    }
    b.ref_cnt = 1;
    ++num_used_;
    out->push_back(b.block_id);
  }
}

bool BlockPool::touch(BlockId id) {
  ARBOR_CHECK(id > kNullBlockId && id < num_blocks()) << "touch of block " << id;
  KvCacheBlock& b = blocks_[id];
  const bool revived = b.ref_cnt == 0;
  if (revived) {
    free_queue_.remove(id);
    ++num_used_;
    if (b.is_cached) --num_cached_free_;
  }
  if (++b.ref_cnt == 2) ++num_shared_;
  return revived;
}

bool BlockPool::free_block(BlockId id) {
  ARBOR_CHECK(id > kNullBlockId && id < num_blocks()) << "free of block " << id;
  KvCacheBlock& b = blocks_[id];
  ARBOR_CHECK_GT(b.ref_cnt, 0) << "block " << id << " freed more often than referenced";
  if (b.ref_cnt == 2) --num_shared_;
  if (--b.ref_cnt > 0) return false;
  --num_used_;
  if (b.is_cached) {
    free_queue_.push_back(id);
    ++num_cached_free_;
  } else {
    free_queue_.push_front(id);
  }
  return true;
}

std::optional<BlockId> BlockPool::get_cached_block(const BlockHash& hash) const {
  return cached_.find(hash);
}

bool BlockPool::cache_block(BlockId id, const BlockHash& hash) {
  ARBOR_CHECK(id > kNullBlockId && id < num_blocks()) << "cache of block " << id;
  KvCacheBlock& b = blocks_[id];
  ARBOR_CHECK_GT(b.ref_cnt, 0) << "only a used block can be cached";
  ARBOR_CHECK(!b.is_cached) << "block " << id << " is already cached";
  if (!cached_.insert(hash, id)) return false;
  b.is_cached = true;
  b.block_hash = hash;
  if (record_events_) events_.push_back(KvEvent{.hash = hash, .stored = true});
  return true;
}

std::vector<BlockId> BlockPool::free_queue_order() const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(free_queue_.size()));
  for (BlockId id = free_queue_.front(); id != kNoBlock; id = blocks_[id].next_free) {
    order.push_back(id);
  }
  return order;
}

void BlockPool::check_invariants() const {
  const KvCacheBlock& null_block = blocks_[kNullBlockId];
  ARBOR_CHECK(null_block.ref_cnt == 0 && !null_block.in_free_queue && !null_block.is_cached)
      << "the null block was touched";
  // Walk the queue: links consistent, uncached blocks before cached ones, every member free.
  int32_t queued = 0, queued_cached = 0;
  BlockId prev = kNoBlock;
  bool seen_cached = false;
  for (BlockId id = free_queue_.front(); id != kNoBlock; id = blocks_[id].next_free) {
    ARBOR_CHECK(id > kNullBlockId && id < num_blocks()) << "bad id " << id << " in free queue";
    const KvCacheBlock& b = blocks_[id];
    ARBOR_CHECK(b.in_free_queue && b.ref_cnt == 0) << "block " << id << " queued but used";
    ARBOR_CHECK_EQ(b.prev_free, prev) << "broken back link at block " << id;
    ARBOR_CHECK(!seen_cached || b.is_cached) << "uncached block " << id << " behind a cached one";
    seen_cached = seen_cached || b.is_cached;
    queued_cached += b.is_cached ? 1 : 0;
    ARBOR_CHECK_LE(++queued, free_queue_.size()) << "free queue has a cycle";
    prev = id;
  }
  ARBOR_CHECK_EQ(prev, free_queue_.back());
  ARBOR_CHECK_EQ(queued, free_queue_.size());
  ARBOR_CHECK_EQ(queued_cached, num_cached_free_);
  int32_t used = 0, cached = 0, shared = 0;
  for (BlockId id = 1; id < num_blocks(); ++id) {
    const KvCacheBlock& b = blocks_[id];
    ARBOR_CHECK_GE(b.ref_cnt, 0);
    ARBOR_CHECK_EQ(b.in_free_queue, b.ref_cnt == 0) << "block " << id;
    used += b.ref_cnt > 0 ? 1 : 0;
    shared += b.ref_cnt > 1 ? 1 : 0;
    if (b.is_cached) {
      ++cached;
      ARBOR_CHECK(cached_.find(b.block_hash) == std::optional<BlockId>(id))
          << "cached block " << id << " unmapped";
    }
  }
  ARBOR_CHECK_EQ(used, num_used_);
  ARBOR_CHECK_EQ(shared, num_shared_);
  ARBOR_CHECK_EQ(cached, num_cached_blocks()) << "hash map names blocks that are not cached";
  ARBOR_CHECK_EQ(num_used_ + num_free_blocks(), num_usable_blocks());
}

}  // namespace arbor::kv
