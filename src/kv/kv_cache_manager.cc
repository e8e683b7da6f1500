#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::kv {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

BlockHashExtraKeys extra_keys(const KvRequest& request) {
  return BlockHashExtraKeys{request.cache_salt, request.adapter_id};
}

}  // namespace

KvCacheManager::KvCacheManager(const KvCacheManagerOptions& options)
    : block_size_(options.block_size),
      enable_prefix_caching_(options.enable_prefix_caching),
      pool_(options.num_blocks) {
  ARBOR_CHECK_GE(options.block_size, 1) << "block_size must be positive";
}

ComputedBlocks KvCacheManager::get_computed_blocks(const KvRequest& request) {
  ComputedBlocks out;
  const int64_t num_tokens = static_cast<int64_t>(request.token_ids.size());
  // Leave at least one token to compute: the step must produce logits for the last token.
  const int64_t max_blocks = num_tokens == 0 ? 0 : (num_tokens - 1) / block_size_;
  if (!enable_prefix_caching_ || max_blocks == 0) return out;
  // A waiting request is asked every step until it is admitted: keep its hashes between calls.
  std::vector<BlockHash> scratch;
  std::vector<BlockHash>& hashes = requests_.contains(request.request_id)
                                       ? scratch
                                       : waiting_hashes_[request.request_id];
  const BlockHashExtraKeys extra = extra_keys(request);
  for (int64_t i = 0; i < max_blocks; ++i) {
    if (i == static_cast<int64_t>(hashes.size())) {
      hashes.push_back(hash_block_tokens(
          i == 0 ? kRootParentHash : hashes[i - 1],
          request.token_ids.subspan(static_cast<size_t>(i * block_size_), block_size_), extra,
          i == 0));
    }
    const std::optional<BlockId> id = pool_.get_cached_block(hashes[i]);
    if (!id) break;
    out.block_ids.push_back(*id);
    out.block_hashes.push_back(hashes[i]);
  }
  out.num_computed_tokens = static_cast<int64_t>(out.block_ids.size()) * block_size_;
  return out;
}

void KvCacheManager::record_prefix_query(const KvRequest& request, const ComputedBlocks& hit) {
  ++num_queries_;
  num_query_tokens_ += static_cast<int64_t>(request.token_ids.size());
  if (!hit.block_ids.empty()) ++num_hits_;
  num_hit_tokens_ += hit.num_computed_tokens;
}

void KvCacheManager::check_computed_blocks(const ComputedBlocks& computed) const {
  ARBOR_CHECK_EQ(computed.block_ids.size(), computed.block_hashes.size());
  ARBOR_CHECK_EQ(computed.num_computed_tokens,
                 static_cast<int64_t>(computed.block_ids.size()) * block_size_);
  for (size_t i = 0; i < computed.block_ids.size(); ++i) {
    const KvCacheBlock& b = pool_.block(computed.block_ids[i]);
    ARBOR_CHECK(b.is_cached && b.block_hash == computed.block_hashes[i])
        << "computed block " << b.block_id << " was evicted between get_computed_blocks and "
        << "allocate_slots";
  }
}

std::span<const BlockId> KvCacheManager::appended(const RequestBlocks& blocks, size_t old_size) {
  return std::span<const BlockId>(blocks.block_ids).subspan(old_size);
}

std::optional<std::span<const BlockId>> KvCacheManager::allocate_slots(
    const KvRequest& request, int64_t num_new_tokens, const ComputedBlocks& new_computed_blocks,
    int64_t num_lookahead_tokens) {
  ARBOR_CHECK(num_new_tokens >= 0 && num_lookahead_tokens >= 0)
      << num_new_tokens << " new, " << num_lookahead_tokens << " lookahead tokens";
  ARBOR_CHECK(request.num_computed_tokens >= 0 &&
              request.num_computed_tokens <= static_cast<int64_t>(request.token_ids.size()))
      << "request " << request.request_id << " has " << request.num_computed_tokens
      << " computed of " << request.token_ids.size() << " tokens";
  auto it = requests_.find(request.request_id);
  const size_t num_table_blocks = it == requests_.end() ? 0 : it->second.block_ids.size();
  const auto num_hit_blocks = static_cast<int64_t>(new_computed_blocks.block_ids.size());
  if (num_hit_blocks > 0) {
    ARBOR_CHECK(num_table_blocks == 0 && request.num_computed_tokens == 0)
        << "computed blocks are for a request without blocks (request " << request.request_id
        << ")";
    check_computed_blocks(new_computed_blocks);
  }
  const int64_t num_tokens = request.num_computed_tokens +
                             new_computed_blocks.num_computed_tokens + num_new_tokens +
                             num_lookahead_tokens;
  const int64_t num_new_blocks = std::max<int64_t>(
      0, cdiv(num_tokens, block_size_) - static_cast<int64_t>(num_table_blocks) - num_hit_blocks);
  // Hit blocks sitting in the free queue stop being free when touched; don't count them twice.
  int64_t num_revived = 0;
  for (BlockId id : new_computed_blocks.block_ids) num_revived += pool_.block(id).ref_cnt == 0;
  if (num_new_blocks > pool_.num_free_blocks() - num_revived) return std::nullopt;

  if (it == requests_.end()) {
    it = requests_.try_emplace(request.request_id).first;
    waiting_hashes_.erase(request.request_id);
  }
  RequestBlocks& blocks = it->second;
  for (int64_t i = 0; i < num_hit_blocks; ++i) {
    pool_.touch(new_computed_blocks.block_ids[i]);
    blocks.block_ids.push_back(new_computed_blocks.block_ids[i]);
    blocks.block_hashes.push_back(new_computed_blocks.block_hashes[i]);
  }
  pool_.get_new_blocks(static_cast<int32_t>(num_new_blocks), &blocks.block_ids);
  cache_blocks(blocks, request);
  return appended(blocks, num_table_blocks);
}

void KvCacheManager::cache_full_blocks(const KvRequest& request) {
  auto it = requests_.find(request.request_id);
  if (it == requests_.end()) return;
  cache_blocks(it->second, request);
}

void KvCacheManager::cache_blocks(RequestBlocks& blocks, const KvRequest& request) {
  if (!enable_prefix_caching_) return;
  const int64_t cacheable = std::min({request.num_computed_tokens,
                                      static_cast<int64_t>(request.token_ids.size()),
                                      static_cast<int64_t>(blocks.block_ids.size()) * block_size_});
  const int64_t num_full = cacheable / block_size_;
  const BlockHashExtraKeys extra = extra_keys(request);
  for (auto i = static_cast<int64_t>(blocks.block_hashes.size()); i < num_full; ++i) {
    const BlockHash parent = i == 0 ? kRootParentHash : blocks.block_hashes[i - 1];
    const BlockHash h = hash_block_tokens(
        parent, request.token_ids.subspan(static_cast<size_t>(i * block_size_), block_size_),
        extra, i == 0);
    blocks.block_hashes.push_back(h);
    const BlockId id = blocks.block_ids[i];
    const KvCacheBlock& b = pool_.block(id);
    if (b.is_cached) {
      // Shared with a fork sibling that hashed it first: the same tokens give the same hash.
      ARBOR_CHECK(b.block_hash == h) << "request " << request.request_id << " block " << i
                                     << " (id " << id << ") is cached under another hash: "
                                     << "its committed tokens changed";
      continue;
    }
    // false: another block already holds these K/V; this one stays an uncached duplicate.
    pool_.cache_block(id, h);
  }
}

void KvCacheManager::free(KvRequestId request_id) {
  waiting_hashes_.erase(request_id);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const std::vector<BlockId>& table = it->second.block_ids;
  for (auto r = table.rbegin(); r != table.rend(); ++r) pool_.free_block(*r);
  requests_.erase(it);
}

std::optional<ForkResult> KvCacheManager::fork(KvRequestId parent_id, KvRequestId child_id,
                                               int64_t num_tokens) {
  auto pit = requests_.find(parent_id);
  ARBOR_CHECK(pit != requests_.end()) << "fork of unknown request " << parent_id;
  ARBOR_CHECK(!requests_.contains(child_id)) << "fork child " << child_id << " already exists";
  const RequestBlocks& parent = pit->second;
  const auto parent_slots = static_cast<int64_t>(parent.block_ids.size()) * block_size_;
  ARBOR_CHECK(num_tokens >= 0 && num_tokens <= parent_slots)
      << "fork of " << num_tokens << " tokens from a request with " << parent_slots << " slots";
  const int64_t num_full = num_tokens / block_size_;
  const auto tail_tokens = static_cast<int32_t>(num_tokens % block_size_);
  if (tail_tokens > 0 && pool_.num_free_blocks() == 0) return std::nullopt;

  // Node-based map: `parent` stays valid across this insertion.
  RequestBlocks& child = requests_[child_id];
  waiting_hashes_.erase(child_id);
  child.block_ids.assign(parent.block_ids.begin(), parent.block_ids.begin() + num_full);
  for (BlockId id : child.block_ids) pool_.touch(id);
  const int64_t num_hashed =
      std::min(static_cast<int64_t>(parent.block_hashes.size()), num_full);
  child.block_hashes.assign(parent.block_hashes.begin(), parent.block_hashes.begin() + num_hashed);
  ForkResult result;
  if (tail_tokens > 0) {
    pool_.get_new_blocks(1, &child.block_ids);
    result.copy_on_write =
        BlockCopy{parent.block_ids[num_full], child.block_ids.back(), tail_tokens};
  }
  return result;
}

void KvCacheManager::truncate(KvRequestId request_id, int64_t num_tokens) {
  auto it = requests_.find(request_id);
  ARBOR_CHECK(it != requests_.end()) << "truncate of unknown request " << request_id;
  ARBOR_CHECK_GE(num_tokens, 0);
  RequestBlocks& blocks = it->second;
  std::vector<BlockId>& table = blocks.block_ids;
  if (num_tokens >= static_cast<int64_t>(table.size()) * block_size_) return;
  ARBOR_CHECK_GE(num_tokens, static_cast<int64_t>(blocks.block_hashes.size()) * block_size_)
      << "truncate of request " << request_id << " cuts into cached (committed) blocks";
  const auto keep = static_cast<size_t>(cdiv(num_tokens, block_size_));
  if (num_tokens % block_size_ != 0) {
    const KvCacheBlock& tail = pool_.block(table[keep - 1]);
    ARBOR_CHECK(tail.ref_cnt == 1 && !tail.is_cached)
        << "truncate of request " << request_id << " to " << num_tokens
        << " tokens would overwrite shared or cached block " << tail.block_id;
  }
  for (size_t i = table.size(); i > keep; --i) pool_.free_block(table[i - 1]);
  table.resize(keep);
}

std::span<const BlockId> KvCacheManager::block_ids(KvRequestId request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.block_ids;
}

std::span<const BlockHash> KvCacheManager::block_hashes(KvRequestId request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.block_hashes;
}

int64_t KvCacheManager::num_slots(KvRequestId request_id) const {
  return static_cast<int64_t>(block_ids(request_id).size()) * block_size_;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.num_usable_blocks = pool_.num_usable_blocks();
  s.num_used_blocks = pool_.num_used_blocks();
  s.num_cached_free_blocks = pool_.num_cached_free_blocks();
  s.num_free_uncached_blocks = pool_.num_free_uncached_blocks();
  s.num_cached_blocks = pool_.num_cached_blocks();
  s.usage = pool_.usage();
  s.num_queries = num_queries_;
  s.num_hits = num_hits_;
  s.num_query_tokens = num_query_tokens_;
  s.num_hit_tokens = num_hit_tokens_;
  s.prefix_hit_rate = num_query_tokens_ == 0
                          ? 0.0
                          : static_cast<double>(num_hit_tokens_) / num_query_tokens_;
  s.num_evictions = pool_.num_evictions();
  return s;
}

void KvCacheManager::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> entries(static_cast<size_t>(pool_.num_blocks()), 0);
  std::vector<KvRequestId> last_owner(static_cast<size_t>(pool_.num_blocks()), 0);
  std::vector<bool> owned(static_cast<size_t>(pool_.num_blocks()), false);
  for (const auto& [id, blocks] : requests_) {
    ARBOR_CHECK_LE(blocks.block_hashes.size(), blocks.block_ids.size()) << "request " << id;
    for (size_t i = 0; i < blocks.block_ids.size(); ++i) {
      const BlockId b = blocks.block_ids[i];
      ARBOR_CHECK(b > kNullBlockId && b < pool_.num_blocks())
          << "request " << id << " holds block " << b;
      ARBOR_CHECK(!(owned[b] && last_owner[b] == id)) << "block " << b << " twice in " << id;
      owned[b] = true;
      last_owner[b] = id;
      ++entries[b];
      const KvCacheBlock& blk = pool_.block(b);
      if (i < blocks.block_hashes.size() && blk.is_cached) {
        ARBOR_CHECK(blk.block_hash == blocks.block_hashes[i])
            << "request " << id << " block " << i << " hash differs from the cached one";
      }
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    ARBOR_CHECK_EQ(pool_.block(b).ref_cnt, entries[b]) << "ref count of block " << b;
  }
  for (const auto& [id, hashes] : waiting_hashes_) {
    ARBOR_CHECK(!requests_.contains(id)) << "request " << id << " has blocks and waiting hashes";
  }
}

}  // namespace arbor::kv
