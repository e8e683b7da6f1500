#include "kv/kv_cache_utils.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <vector>

#include "base/bits.h"
#include "base/check.h"

namespace arbor::kv {

// The hash encoding is defined as little-endian; memcpy of native integers is that encoding.
static_assert(std::endian::native == std::endian::little, "hash encoding assumes little-endian");

namespace {

// Blocks up to this many bytes of hash input are encoded on the stack (256 tokens, short salt).
constexpr size_t kStackBytes = 1280;

void put_u32(uint8_t*& p, uint32_t v) {
  std::memcpy(p, &v, sizeof(v));
  p += sizeof(v);
}

}  // namespace

BlockHash hash_block_tokens(const BlockHash& parent, std::span<const int32_t> token_ids,
                            const BlockHashExtraKeys& extra, bool is_first_block) {
  const std::string_view salt = is_first_block ? extra.cache_salt : std::string_view();
  ARBOR_CHECK_LE(salt.size(), std::numeric_limits<uint32_t>::max());
  const size_t n = sizeof(BlockHash) + token_ids.size_bytes() + 2 * sizeof(uint32_t) + salt.size();
  uint8_t stack[kStackBytes];
  std::vector<uint8_t> heap;
  uint8_t* buf = stack;
  if (n > kStackBytes) {
    heap.resize(n);
    buf = heap.data();
  }
  uint8_t* p = buf;
  std::memcpy(p, &parent.low, sizeof(uint64_t));
  std::memcpy(p + sizeof(uint64_t), &parent.high, sizeof(uint64_t));
  p += sizeof(BlockHash);
  if (!token_ids.empty()) std::memcpy(p, token_ids.data(), token_ids.size_bytes());
  p += token_ids.size_bytes();
  put_u32(p, extra.adapter_id);
  put_u32(p, static_cast<uint32_t>(salt.size()));
  if (!salt.empty()) std::memcpy(p, salt.data(), salt.size());
  p += salt.size();
  ARBOR_DCHECK(static_cast<size_t>(p - buf) == n);
  const XXH128_hash_t h = XXH3_128bits(buf, n);
  return BlockHash{h.low64, h.high64};
}

BlockHash group_key(const BlockHash& hash, int32_t group) {
  ARBOR_CHECK_GT(group, 0);
  uint64_t state = static_cast<uint64_t>(group);
  const uint64_t low = splitmix64(state);
  return BlockHash{hash.low ^ low, hash.high ^ splitmix64(state)};
}

void FreeKvCacheBlockQueue::link(BlockId id, BlockId prev, BlockId next) {
  KvCacheBlock& b = blocks_[id];
  ARBOR_CHECK(!b.in_free_queue) << "block " << id << " is already in the free queue";
  ARBOR_CHECK_NE(id, kNullBlockId) << "the null block never enters the free queue";
  b.prev_free = prev;
  b.next_free = next;
  b.in_free_queue = true;
  if (prev == kNoBlock) {
    head_ = id;
  } else {
    blocks_[prev].next_free = id;
  }
  if (next == kNoBlock) {
    tail_ = id;
  } else {
    blocks_[next].prev_free = id;
  }
  ++size_;
}

void FreeKvCacheBlockQueue::push_front(BlockId id) { link(id, kNoBlock, head_); }

void FreeKvCacheBlockQueue::push_back(BlockId id) { link(id, tail_, kNoBlock); }

BlockId FreeKvCacheBlockQueue::pop_front() {
  ARBOR_CHECK(!empty()) << "pop_front on an empty free queue";
  const BlockId id = head_;
  remove(id);
  return id;
}

void FreeKvCacheBlockQueue::remove(BlockId id) {
  KvCacheBlock& b = blocks_[id];
  ARBOR_CHECK(b.in_free_queue) << "block " << id << " is not in the free queue";
  if (b.prev_free == kNoBlock) {
    head_ = b.next_free;
  } else {
    blocks_[b.prev_free].next_free = b.next_free;
  }
  if (b.next_free == kNoBlock) {
    tail_ = b.prev_free;
  } else {
    blocks_[b.next_free].prev_free = b.prev_free;
  }
  b.prev_free = kNoBlock;
  b.next_free = kNoBlock;
  b.in_free_queue = false;
  --size_;
}

}  // namespace arbor::kv
