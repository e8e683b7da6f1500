// The router's view of each replica's prefix cache (docs/router.md, "Exact prefix index").
//
//   prompt_block_hashes  the chain of block hashes a replica's KV cache manager computes for a
//                        prompt (kv::hash_block_tokens: same tokens, block size and cache salt
//                        give the same hashes), full blocks only
//   CachedBlockSet       one replica's cached hashes, applied from its KvEvents stream: exact,
//                        and bounded by the replica's pool size (it cannot cache more blocks
//                        than it has), so the whole index is bounded by the replicas' pools
//   RoutedBlockSet       the approximate baseline (SGLang's cache-aware router keeps a tree of
//                        the text it routed): the hashes of prompts routed to a replica, the
//                        least recently routed dropped beyond a bound; it never hears of
//                        evictions
//
// Threading: none inside; the owner locks.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"

namespace arbor::router {

// [num_tokens / block_size] hashes of the prompt's full blocks. O(num_tokens).
std::vector<kv::BlockHash> prompt_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                               std::string_view cache_salt);

class CachedBlockSet {
 public:
  // max_blocks: the replica's pool size; a stream that would hold more is refused.
  explicit CachedBlockSet(int64_t max_blocks = 0) : max_blocks_(max_blocks) {}
  void set_max_blocks(int64_t max_blocks) { max_blocks_ = max_blocks; }
  void clear() { hashes_.clear(); }
  // Applies events in order. Errors (kDataLoss; the caller resubscribes): a stored hash already
  // present, a removed one absent, or more than max_blocks hashes.
  Status apply(std::span<const kv::KvEvent> events);
  // How many leading hashes of `chain` are cached: the blocks a request would hit. O(result + 1).
  int64_t matched(std::span<const kv::BlockHash> chain) const;
  int64_t size() const { return static_cast<int64_t>(hashes_.size()); }

 private:
  int64_t max_blocks_;
  std::unordered_set<kv::BlockHash, kv::BlockHashHasher> hashes_;
};

class RoutedBlockSet {
 public:
  explicit RoutedBlockSet(int64_t max_blocks) : max_blocks_(max_blocks) {}
  void set_max_blocks(int64_t max_blocks) { max_blocks_ = max_blocks; }
  // Records `chain` as routed here (most recent), dropping the least recent beyond the bound.
  void add(std::span<const kv::BlockHash> chain);
  int64_t matched(std::span<const kv::BlockHash> chain) const;
  int64_t size() const { return static_cast<int64_t>(where_.size()); }

 private:
  int64_t max_blocks_;
  std::list<kv::BlockHash> order_;  // least recent first
  std::unordered_map<kv::BlockHash, std::list<kv::BlockHash>::iterator, kv::BlockHashHasher> where_;
};

}  // namespace arbor::router
