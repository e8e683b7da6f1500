#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "base/check.h"

namespace arbor::kv {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

BlockHashExtraKeys extra_keys(const KvRequest& request) {
  return BlockHashExtraKeys{request.cache_salt, request.adapter_id};
}

std::vector<int32_t> windows_of(const KvCacheManagerOptions& options) {
  std::vector<int32_t> w = options.group_windows.empty() ? std::vector<int32_t>{0}
                                                         : options.group_windows;
  for (int32_t x : w) ARBOR_CHECK_GE(x, 0) << "a KV cache group's window must be >= 0";
  return w;
}

}  // namespace

KvCacheManager::KvCacheManager(const KvCacheManagerOptions& options)
    : block_size_(options.block_size),
      enable_prefix_caching_(options.enable_prefix_caching),
      windows_(windows_of(options)),
      pool_(options.num_blocks),
      block_group_(static_cast<size_t>(std::max(options.num_blocks, 0)), -1),
      group_used_(windows_.size(), 0),
      group_released_(windows_.size(), 0),
      any_sliding_(std::any_of(windows_.begin(), windows_.end(), [](int32_t w) { return w > 0; })) {
  ARBOR_CHECK_GE(options.block_size, 1) << "block_size must be positive";
}

int64_t KvCacheManager::window_blocks(int32_t group) const {
  return cdiv(windows_[static_cast<size_t>(group)] - 1, block_size_);
}

// vLLM's SlidingWindowManager.find_longest_cache_hit: from block max_blocks - 1 down, the first
// run of window_blocks() cached blocks ends the hit; failing that, the run that starts at block 0.
int64_t KvCacheManager::sliding_hit(int32_t group, std::span<const BlockHash> hashes,
                                    int64_t max_blocks) const {
  const int64_t need = window_blocks(group);
  if (need == 0) return max_blocks;
  int64_t run = 0;
  for (int64_t i = max_blocks - 1; i >= 0; --i) {
    if (!pool_.get_cached_block(group_block_hash(hashes[static_cast<size_t>(i)], group))) {
      run = 0;
      continue;
    }
    if (++run == need) return i + need;
  }
  return run;
}

void KvCacheManager::extend_hashes(const KvRequest& request, std::vector<BlockHash>& hashes,
                                   int64_t num_blocks) const {
  const BlockHashExtraKeys extra = extra_keys(request);
  for (auto i = static_cast<int64_t>(hashes.size()); i < num_blocks; ++i) {
    hashes.push_back(hash_block_tokens(
        i == 0 ? kRootParentHash : hashes[i - 1],
        request.token_ids.subspan(static_cast<size_t>(i * block_size_), block_size_), extra,
        i == 0));
  }
}

// The hit of the full-attention groups (the shortest of their cached prefixes, at most
// max_blocks), hashing only as far as it goes; each group's scanned ids into (*ids)[g].
int64_t KvCacheManager::full_groups_hit(const KvRequest& request, std::vector<BlockHash>& hashes,
                                        int64_t max_blocks,
                                        std::vector<std::vector<BlockId>>* ids) const {
  int64_t hit = max_blocks;
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (is_sliding(g)) continue;
    std::vector<BlockId>& found = (*ids)[static_cast<size_t>(g)];
    for (auto i = static_cast<int64_t>(found.size()); i < hit; ++i) {
      extend_hashes(request, hashes, i + 1);
      const std::optional<BlockId> id = pool_.get_cached_block(group_block_hash(hashes[i], g));
      if (!id) break;
      found.push_back(*id);
    }
    hit = static_cast<int64_t>(found.size());
  }
  return hit;
}

ComputedBlocks KvCacheManager::get_computed_blocks(const KvRequest& request,
                                                   int64_t max_num_computed_tokens) {
  ComputedBlocks out;
  const int64_t num_tokens = static_cast<int64_t>(request.token_ids.size());
  // Leave at least one token to compute: the step must produce logits for the last token.
  const int64_t max_blocks =
      num_tokens == 0 ? 0
                      : std::min((num_tokens - 1) / block_size_,
                                 std::max<int64_t>(max_num_computed_tokens, 0) / block_size_);
  if (!enable_prefix_caching_ || max_blocks == 0) return out;
  // A waiting request is asked every step until it is admitted: keep its hashes between calls.
  std::vector<BlockHash> scratch;
  std::vector<BlockHash>& hashes = requests_.contains(request.request_id)
                                       ? scratch
                                       : waiting_hashes_[request.request_id];
  out.group_block_ids.resize(windows_.size());
  int64_t hit = full_groups_hit(request, hashes, max_blocks, &out.group_block_ids);
  // Sliding groups look backwards from the hit: hash every block up to it first. A shorter hit
  // may break another sliding group's window: repeat until every group agrees (full groups
  // serve every prefix of their hit). Terminates: hit only decreases.
  extend_hashes(request, hashes, hit);
  for (bool changed = true; changed && hit > 0;) {
    changed = false;
    for (int32_t g = 0; g < num_groups(); ++g) {
      if (!is_sliding(g)) continue;
      const int64_t h = sliding_hit(g, hashes, hit);
      changed = changed || h < hit;
      hit = std::min(hit, h);
    }
  }
  if (hit == 0) {
    out.group_block_ids.clear();
    return out;
  }
  out.block_hashes.assign(hashes.begin(), hashes.begin() + hit);
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<BlockId>& ids = out.group_block_ids[static_cast<size_t>(g)];
    if (!is_sliding(g)) {
      ids.resize(static_cast<size_t>(hit));  // a full group's hit is a prefix of its scan
      continue;
    }
    const int64_t first = std::max<int64_t>(0, hit - window_blocks(g));
    ids.assign(static_cast<size_t>(first), kNullBlockId);
    for (int64_t i = first; i < hit; ++i) {
      ids.push_back(*pool_.get_cached_block(group_block_hash(hashes[i], g)));
    }
  }
  out.num_computed_tokens = hit * block_size_;
  return out;
}

void KvCacheManager::record_prefix_query(const KvRequest& request, const ComputedBlocks& hit) {
  ++num_queries_;
  num_query_tokens_ += static_cast<int64_t>(request.token_ids.size());
  if (hit.num_blocks() > 0) ++num_hits_;
  num_hit_tokens_ += hit.num_computed_tokens;
}

void KvCacheManager::check_computed_blocks(const ComputedBlocks& computed) const {
  ARBOR_CHECK_EQ(computed.num_computed_tokens, computed.num_blocks() * block_size_);
  if (computed.num_blocks() == 0) return;
  ARBOR_CHECK_EQ(computed.group_block_ids.size(), windows_.size());
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<BlockId>& ids = computed.group_block_ids[static_cast<size_t>(g)];
    ARBOR_CHECK_EQ(static_cast<int64_t>(ids.size()), computed.num_blocks());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == kNullBlockId && is_sliding(g)) continue;
      const KvCacheBlock& b = pool_.block(ids[i]);
      ARBOR_CHECK(b.is_cached && b.block_hash == group_block_hash(computed.block_hashes[i], g))
          << "computed block " << b.block_id << " (group " << g << ") was evicted between "
          << "get_computed_blocks and allocate_slots";
    }
  }
}

std::span<const BlockId> KvCacheManager::appended(const RequestBlocks& blocks, size_t old_size) {
  return std::span<const BlockId>(blocks.tables[0]).subspan(old_size);
}

void KvCacheManager::take_new_blocks(int32_t group, int64_t n, std::vector<BlockId>& table) {
  const size_t first = table.size();
  pool_.get_new_blocks(static_cast<int32_t>(n), &table);
  for (size_t i = first; i < table.size(); ++i) block_group_[static_cast<size_t>(table[i])] = group;
  group_used_[static_cast<size_t>(group)] += static_cast<int32_t>(n);
}

void KvCacheManager::touch_block(int32_t group, BlockId id) {
  if (pool_.touch(id)) ++group_used_[static_cast<size_t>(group)];
  block_group_[static_cast<size_t>(id)] = group;
}

void KvCacheManager::free_block(int32_t group, BlockId id) {
  if (pool_.free_block(id)) --group_used_[static_cast<size_t>(group)];
}

// vLLM's SlidingWindowManager.remove_skipped_blocks: the next query is at num_computed_tokens at
// the earliest, so it reads no position below num_computed_tokens - W + 1; blocks wholly below
// it are released, the last of them first (like free(): the tail is evicted first).
void KvCacheManager::release_skipped_blocks(RequestBlocks& blocks, int64_t num_computed_tokens) {
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!is_sliding(g)) continue;
    const int64_t first_needed = num_computed_tokens - windows_[static_cast<size_t>(g)] + 1;
    if (first_needed <= 0) continue;
    std::vector<BlockId>& table = blocks.tables[static_cast<size_t>(g)];
    int64_t& skipped = blocks.num_skipped[static_cast<size_t>(g)];
    const int64_t end = std::min<int64_t>(first_needed / block_size_,
                                          static_cast<int64_t>(table.size()));
    for (int64_t i = end - 1; i >= skipped; --i) {
      free_block(g, table[static_cast<size_t>(i)]);
      table[static_cast<size_t>(i)] = kNullBlockId;
      ++group_released_[static_cast<size_t>(g)];
    }
    skipped = std::max(skipped, end);
  }
}

int64_t KvCacheManager::num_blocks_to_allocate(const KvRequest& request, int64_t num_new_tokens,
                                               const ComputedBlocks& new_computed_blocks,
                                               int64_t num_lookahead_tokens) const {
  auto it = requests_.find(request.request_id);
  const int64_t num_table_blocks =
      it == requests_.end() ? 0 : static_cast<int64_t>(it->second.tables[0].size());
  const int64_t num_tokens = request.num_computed_tokens +
                             new_computed_blocks.num_computed_tokens + num_new_tokens +
                             num_lookahead_tokens;
  const int64_t per_group = std::max<int64_t>(
      0, cdiv(num_tokens, block_size_) - num_table_blocks - new_computed_blocks.num_blocks());
  // Hit blocks sitting in the free queue stop being free when touched; count them too.
  int64_t num_revived = 0;
  for (const std::vector<BlockId>& ids : new_computed_blocks.group_block_ids) {
    for (BlockId id : ids) num_revived += id != kNullBlockId && pool_.block(id).ref_cnt == 0;
  }
  return per_group * num_groups() + num_revived;
}

int64_t KvCacheManager::max_blocks_per_request(int64_t num_tokens, int64_t max_step_tokens) const {
  const int64_t full = cdiv(std::max<int64_t>(num_tokens, 0), block_size_);
  int64_t total = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    if (!is_sliding(g)) {
      total += full;
      continue;
    }
    // A step reads from num_computed - W + 1 and writes up to num_computed + step - 1: a span of
    // W - 1 + step positions, which touches at most ceil((span - 1) / B) + 1 blocks.
    const int64_t span = windows_[static_cast<size_t>(g)] - 1 + std::max<int64_t>(max_step_tokens, 1);
    total += std::min(full, cdiv(span - 1, block_size_) + 1);
  }
  return total;
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
  const size_t num_table_blocks = it == requests_.end() ? 0 : it->second.tables[0].size();
  const int64_t num_hit_blocks = new_computed_blocks.num_blocks();
  if (num_hit_blocks > 0) {
    ARBOR_CHECK(num_table_blocks == 0 && request.num_computed_tokens == 0)
        << "computed blocks are for a request without blocks (request " << request.request_id
        << ")";
    check_computed_blocks(new_computed_blocks);
  }
  // Cache before releasing, so a released block stays reusable by prefix hits. (Without
  // sliding groups nothing is released, and nothing changes unless the allocation succeeds.)
  if (it != requests_.end() && any_sliding_) {
    cache_blocks(it->second, request);
    release_skipped_blocks(it->second, request.num_computed_tokens);
  }
  if (num_blocks_to_allocate(request, num_new_tokens, new_computed_blocks, num_lookahead_tokens) >
      pool_.num_free_blocks()) {
    return std::nullopt;
  }
  const int64_t num_tokens = request.num_computed_tokens +
                             new_computed_blocks.num_computed_tokens + num_new_tokens +
                             num_lookahead_tokens;
  const int64_t num_new_blocks = std::max<int64_t>(
      0, cdiv(num_tokens, block_size_) - static_cast<int64_t>(num_table_blocks) - num_hit_blocks);
  if (it == requests_.end()) {
    it = requests_.try_emplace(request.request_id).first;
    it->second.tables.resize(windows_.size());
    it->second.num_skipped.assign(windows_.size(), 0);
    waiting_hashes_.erase(request.request_id);
  }
  RequestBlocks& blocks = it->second;
  for (int32_t g = 0; g < num_groups() && num_hit_blocks > 0; ++g) {
    const std::vector<BlockId>& hit = new_computed_blocks.group_block_ids[static_cast<size_t>(g)];
    std::vector<BlockId>& table = blocks.tables[static_cast<size_t>(g)];
    for (BlockId id : hit) {
      if (id != kNullBlockId) touch_block(g, id);
      table.push_back(id);
    }
    blocks.num_skipped[static_cast<size_t>(g)] =
        std::find_if(hit.begin(), hit.end(), [](BlockId id) { return id != kNullBlockId; }) -
        hit.begin();
  }
  blocks.block_hashes.insert(blocks.block_hashes.end(), new_computed_blocks.block_hashes.begin(),
                             new_computed_blocks.block_hashes.end());
  for (int32_t g = 0; g < num_groups(); ++g) {
    take_new_blocks(g, num_new_blocks, blocks.tables[static_cast<size_t>(g)]);
  }
  cache_blocks(blocks, request);
  return appended(blocks, num_table_blocks);
}

void KvCacheManager::cache_full_blocks(const KvRequest& request) {
  auto it = requests_.find(request.request_id);
  if (it == requests_.end()) return;
  cache_blocks(it->second, request);
  release_skipped_blocks(it->second, request.num_computed_tokens);
}

void KvCacheManager::cache_blocks(RequestBlocks& blocks, const KvRequest& request) {
  if (!enable_prefix_caching_) return;
  const int64_t cacheable =
      std::min({request.num_computed_tokens, static_cast<int64_t>(request.token_ids.size()),
                static_cast<int64_t>(blocks.tables[0].size()) * block_size_});
  const int64_t num_full = cacheable / block_size_;
  const BlockHashExtraKeys extra = extra_keys(request);
  for (auto i = static_cast<int64_t>(blocks.block_hashes.size()); i < num_full; ++i) {
    const BlockHash parent = i == 0 ? kRootParentHash : blocks.block_hashes[i - 1];
    const BlockHash h = hash_block_tokens(
        parent, request.token_ids.subspan(static_cast<size_t>(i * block_size_), block_size_),
        extra, i == 0);
    blocks.block_hashes.push_back(h);
    for (int32_t g = 0; g < num_groups(); ++g) {
      const BlockId id = blocks.tables[static_cast<size_t>(g)][static_cast<size_t>(i)];
      // Released before it was hashed (only without a cache_full_blocks after its step).
      if (id == kNullBlockId) continue;
      const BlockHash key = group_block_hash(h, g);
      const KvCacheBlock& b = pool_.block(id);
      if (b.is_cached) {
        // Shared with a fork sibling that hashed it first: the same tokens give the same hash.
        ARBOR_CHECK(b.block_hash == key) << "request " << request.request_id << " block " << i
                                         << " (id " << id << ", group " << g
                                         << ") is cached under another hash: its committed "
                                         << "tokens changed";
        continue;
      }
      // false: another block already holds these K/V; this one stays an uncached duplicate.
      pool_.cache_block(id, key);
    }
  }
}

void KvCacheManager::free(KvRequestId request_id) {
  waiting_hashes_.erase(request_id);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const std::vector<std::vector<BlockId>>& tables = it->second.tables;
  // Tail first in every group, so every group's prefix is evicted last.
  for (size_t i = tables[0].size(); i > 0; --i) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const BlockId id = tables[static_cast<size_t>(g)][i - 1];
      if (id != kNullBlockId) free_block(g, id);
    }
  }
  requests_.erase(it);
}

std::optional<ForkResult> KvCacheManager::fork(KvRequestId parent_id, KvRequestId child_id,
                                               int64_t num_tokens) {
  auto pit = requests_.find(parent_id);
  ARBOR_CHECK(pit != requests_.end()) << "fork of unknown request " << parent_id;
  ARBOR_CHECK(!requests_.contains(child_id)) << "fork child " << child_id << " already exists";
  const RequestBlocks& parent = pit->second;
  const auto parent_slots = static_cast<int64_t>(parent.tables[0].size()) * block_size_;
  ARBOR_CHECK(num_tokens >= 0 && num_tokens <= parent_slots)
      << "fork of " << num_tokens << " tokens from a request with " << parent_slots << " slots";
  const int64_t num_full = num_tokens / block_size_;
  const auto tail_tokens = static_cast<int32_t>(num_tokens % block_size_);
  for (int32_t g = 0; g < num_groups(); ++g) {
    // The child's first query, at num_tokens, reads the window before it: still the parent's?
    const int64_t first_needed =
        is_sliding(g) ? std::max<int64_t>(0, num_tokens - windows_[static_cast<size_t>(g)] + 1)
                      : 0;
    const int64_t needed_end = num_full + (tail_tokens > 0 ? 1 : 0);
    ARBOR_CHECK(first_needed / block_size_ >= needed_end ||
                first_needed / block_size_ >= parent.num_skipped[static_cast<size_t>(g)])
        << "fork of " << num_tokens << " tokens: group " << g << " of request " << parent_id
        << " has released blocks the child's window needs";
  }
  if (tail_tokens > 0 && pool_.num_free_blocks() < num_groups()) return std::nullopt;

  // Node-based map: `parent` stays valid across this insertion.
  RequestBlocks& child = requests_[child_id];
  waiting_hashes_.erase(child_id);
  child.tables.resize(windows_.size());
  child.num_skipped.resize(windows_.size());
  ForkResult result;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<BlockId>& from = parent.tables[static_cast<size_t>(g)];
    std::vector<BlockId>& table = child.tables[static_cast<size_t>(g)];
    table.assign(from.begin(), from.begin() + num_full);
    for (BlockId id : table) {
      if (id != kNullBlockId) touch_block(g, id);
    }
    child.num_skipped[static_cast<size_t>(g)] =
        std::min(parent.num_skipped[static_cast<size_t>(g)], num_full);
    if (tail_tokens > 0) {
      const BlockId src = from[static_cast<size_t>(num_full)];
      ARBOR_CHECK_NE(src, kNullBlockId) << "fork of a released block (group " << g << ")";
      take_new_blocks(g, 1, table);
      result.copies_on_write.push_back(BlockCopy{src, table.back(), tail_tokens});
    }
  }
  const int64_t num_hashed =
      std::min(static_cast<int64_t>(parent.block_hashes.size()), num_full);
  child.block_hashes.assign(parent.block_hashes.begin(), parent.block_hashes.begin() + num_hashed);
  return result;
}

void KvCacheManager::truncate(KvRequestId request_id, int64_t num_tokens) {
  auto it = requests_.find(request_id);
  ARBOR_CHECK(it != requests_.end()) << "truncate of unknown request " << request_id;
  ARBOR_CHECK_GE(num_tokens, 0);
  RequestBlocks& blocks = it->second;
  const size_t size = blocks.tables[0].size();
  if (num_tokens >= static_cast<int64_t>(size) * block_size_) return;
  ARBOR_CHECK_GE(num_tokens, static_cast<int64_t>(blocks.block_hashes.size()) * block_size_)
      << "truncate of request " << request_id << " cuts into cached (committed) blocks";
  const auto keep = static_cast<size_t>(cdiv(num_tokens, block_size_));
  for (int32_t g = 0; g < num_groups(); ++g) {
    std::vector<BlockId>& table = blocks.tables[static_cast<size_t>(g)];
    if (num_tokens % block_size_ != 0) {
      const KvCacheBlock& tail = pool_.block(table[keep - 1]);
      ARBOR_CHECK(tail.block_id != kNullBlockId && tail.ref_cnt == 1 && !tail.is_cached)
          << "truncate of request " << request_id << " to " << num_tokens
          << " tokens would overwrite shared or cached block " << tail.block_id
          << " (group " << g << ")";
    }
    for (size_t i = size; i > keep; --i) {
      if (table[i - 1] != kNullBlockId) free_block(g, table[i - 1]);
    }
    table.resize(keep);
    int64_t& skipped = blocks.num_skipped[static_cast<size_t>(g)];
    skipped = std::min(skipped, static_cast<int64_t>(keep));
  }
}

std::span<const BlockId> KvCacheManager::block_ids(KvRequestId request_id, int32_t group) const {
  ARBOR_CHECK(group >= 0 && group < num_groups()) << "KV cache group " << group;
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.tables[static_cast<size_t>(group)];
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
  s.num_shared_blocks = pool_.num_shared_blocks();
  s.usage = pool_.usage();
  s.num_queries = num_queries_;
  s.num_hits = num_hits_;
  s.num_query_tokens = num_query_tokens_;
  s.num_hit_tokens = num_hit_tokens_;
  s.prefix_hit_rate = num_query_tokens_ == 0
                          ? 0.0
                          : static_cast<double>(num_hit_tokens_) / num_query_tokens_;
  s.num_evictions = pool_.num_evictions();
  s.group_used_blocks = group_used_;
  s.group_released_blocks = group_released_;
  return s;
}

void KvCacheManager::check_invariants() const {
  pool_.check_invariants();
  const auto n = static_cast<size_t>(pool_.num_blocks());
  std::vector<int32_t> entries(n, 0), group_of(n, -1);
  std::vector<KvRequestId> last_owner(n, 0);
  std::vector<bool> owned(n, false);
  for (const auto& [id, blocks] : requests_) {
    ARBOR_CHECK_EQ(blocks.tables.size(), windows_.size()) << "request " << id;
    ARBOR_CHECK_LE(blocks.block_hashes.size(), blocks.tables[0].size()) << "request " << id;
    for (int32_t g = 0; g < num_groups(); ++g) {
      const std::vector<BlockId>& table = blocks.tables[static_cast<size_t>(g)];
      const int64_t skipped = blocks.num_skipped[static_cast<size_t>(g)];
      ARBOR_CHECK_EQ(table.size(), blocks.tables[0].size()) << "request " << id << " group " << g;
      ARBOR_CHECK(skipped == 0 || is_sliding(g)) << "request " << id << " group " << g;
      for (size_t i = 0; i < table.size(); ++i) {
        const BlockId b = table[i];
        if (static_cast<int64_t>(i) < skipped) {
          ARBOR_CHECK_EQ(b, kNullBlockId) << "request " << id << " group " << g << " entry " << i;
          continue;
        }
        ARBOR_CHECK(b > kNullBlockId && b < pool_.num_blocks())
            << "request " << id << " group " << g << " entry " << i << " holds block " << b;
        ARBOR_CHECK(!(owned[b] && last_owner[b] == id && group_of[b] == g))
            << "block " << b << " twice in " << id;
        ARBOR_CHECK(group_of[b] == -1 || group_of[b] == g)
            << "block " << b << " in groups " << group_of[b] << " and " << g;
        ARBOR_CHECK_EQ(block_group_[static_cast<size_t>(b)], g) << "block " << b;
        owned[b] = true;
        last_owner[b] = id;
        group_of[b] = g;
        ++entries[b];
        const KvCacheBlock& blk = pool_.block(b);
        if (i < blocks.block_hashes.size() && blk.is_cached) {
          ARBOR_CHECK(blk.block_hash == group_block_hash(blocks.block_hashes[i], g))
              << "request " << id << " group " << g << " block " << i
              << " hash differs from the cached one";
        }
      }
    }
  }
  std::vector<int32_t> used(windows_.size(), 0);
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    ARBOR_CHECK_EQ(pool_.block(b).ref_cnt, entries[b]) << "ref count of block " << b;
    if (entries[b] > 0) ++used[static_cast<size_t>(group_of[b])];
  }
  ARBOR_CHECK(used == group_used_) << "per-group used block counts";
  for (const auto& [id, hashes] : waiting_hashes_) {
    ARBOR_CHECK(!requests_.contains(id)) << "request " << id << " has blocks and waiting hashes";
  }
}

}  // namespace arbor::kv
