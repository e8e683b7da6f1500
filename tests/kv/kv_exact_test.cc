// Exact expectations for the KV bookkeeping: block ids handed out, reference counts, hash chains,
// free-queue (eviction) order, prefix hits, fork + copy-on-write, truncate.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kv/block_hash_map.h"
#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_cache_utils.h"

namespace arbor::kv {
namespace {

using Ids = std::vector<BlockId>;

Ids ids(std::span<const BlockId> s) { return Ids(s.begin(), s.end()); }

// Group `g`'s blocks of a prefix hit (empty: no hit).
Ids hit_ids(const ComputedBlocks& hit, size_t g = 0) {
  return hit.group_block_ids.empty() ? Ids{} : hit.group_block_ids.at(g);
}

BlockHash fake_hash(uint64_t i) { return BlockHash{i * 0x9e3779b97f4a7c15ull, i}; }

// A request as the scheduler would hold it.
struct Req {
  KvRequestId id = 0;
  std::vector<int32_t> tokens{};
  int64_t computed = 0;
  std::string salt{};
  KvRequest view() const { return KvRequest{id, tokens, computed, salt, 0}; }
};

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// The chain hashes of the full blocks of `tokens`, computed independently of the manager.
std::vector<BlockHash> chain(const std::vector<int32_t>& tokens, size_t num_blocks,
                             int32_t block_size, std::string_view salt = "") {
  std::vector<BlockHash> out;
  BlockHash parent = kRootParentHash;
  for (size_t i = 0; i < num_blocks; ++i) {
    parent = hash_block_tokens(
        parent, std::span<const int32_t>(tokens).subspan(i * block_size, block_size),
        BlockHashExtraKeys{salt, 0}, i == 0);
    out.push_back(parent);
  }
  return out;
}

TEST(BlockHashTest, MatchesTheDocumentedEncoding) {
  const std::vector<int32_t> t0 = {1, 2, 3, 4}, t1 = {5, 6, 7, -8};
  const BlockHashExtraKeys extra{"tenant-a", 7};
  // Block 0: root parent, tokens, adapter 7, salt length 8, salt.
  std::vector<uint8_t> bytes(16, 0);
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  };
  put(t0.data(), 16);
  const uint32_t adapter = 7, salt_len = 8, no_salt = 0;
  put(&adapter, 4);
  put(&salt_len, 4);
  put("tenant-a", 8);
  const XXH128_hash_t e0 = XXH3_128bits(bytes.data(), bytes.size());
  const BlockHash h0 = hash_block_tokens(kRootParentHash, t0, extra, /*is_first_block=*/true);
  EXPECT_EQ(h0, (BlockHash{e0.low64, e0.high64}));
  // Block 1: parent = h0, tokens, adapter, salt length 0 and no salt.
  bytes.clear();
  put(&h0.low, 8);
  put(&h0.high, 8);
  put(t1.data(), 16);
  put(&adapter, 4);
  put(&no_salt, 4);
  const XXH128_hash_t e1 = XXH3_128bits(bytes.data(), bytes.size());
  EXPECT_EQ(hash_block_tokens(h0, t1, extra, false), (BlockHash{e1.low64, e1.high64}));
}

TEST(BlockHashTest, ChainCarriesEveryKey) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const BlockHashExtraKeys plain{"", 0}, salted{"s", 0}, adapted{"", 3};
  const BlockHash root = kRootParentHash;
  const BlockHash ha = hash_block_tokens(root, a, plain, true);
  EXPECT_EQ(ha, hash_block_tokens(root, a, plain, true));  // deterministic
  EXPECT_NE(ha, hash_block_tokens(root, b, plain, true));
  EXPECT_NE(ha, hash_block_tokens(root, a, salted, true));
  EXPECT_NE(ha, hash_block_tokens(root, a, adapted, true));
  // Same tokens under different parents: different hashes, so a block is only reused after the
  // same prefix.
  const BlockHash hb = hash_block_tokens(root, b, plain, true);
  EXPECT_NE(hash_block_tokens(ha, a, plain, false), hash_block_tokens(hb, a, plain, false));
  // The salt enters the first block only; later blocks inherit it through the parent.
  EXPECT_EQ(hash_block_tokens(ha, b, salted, false), hash_block_tokens(ha, b, plain, false));
  EXPECT_NE(hash_block_tokens(ha, b, adapted, false), hash_block_tokens(ha, b, plain, false));
  // A salt is not confusable with tokens: "" vs a 4-byte salt that spells a token.
  const int32_t one = 1;
  const std::string spelled(reinterpret_cast<const char*>(&one), 4);
  EXPECT_NE(hash_block_tokens(root, std::vector<int32_t>{1, 1}, plain, true),
            hash_block_tokens(root, std::vector<int32_t>{1}, {spelled, 0}, true));
}

TEST(FreeQueueTest, LinksAndUnlinksAnywhereInO1) {
  std::vector<KvCacheBlock> blocks(6);
  FreeKvCacheBlockQueue q(blocks);
  for (BlockId i = 1; i <= 5; ++i) q.push_back(i);
  q.remove(3);  // middle
  q.push_front(3);
  q.remove(5);  // back
  auto order = [&] {
    Ids o;
    for (BlockId id = q.front(); id != kNoBlock; id = blocks[id].next_free) o.push_back(id);
    return o;
  };
  EXPECT_EQ(order(), (Ids{3, 1, 2, 4}));
  EXPECT_EQ(q.back(), 4);
  EXPECT_EQ(q.pop_front(), 3);
  EXPECT_EQ(q.pop_front(), 1);
  EXPECT_EQ(q.size(), 2);
  q.remove(2);
  q.remove(4);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.front(), kNoBlock);
  EXPECT_EQ(q.back(), kNoBlock);
  EXPECT_FALSE(blocks[4].in_free_queue);
}

TEST(BlockHashMapTest, ProbesAcrossTheWrapAndShiftsBackOnErase) {
  BlockHashMap m(4);  // capacity 8
  // Three keys with home slot 7: they occupy 7, 0, 1 (wrapping).
  const BlockHash a{7, 1}, b{15, 2}, c{23, 3}, d{0, 4};
  EXPECT_TRUE(m.insert(a, 1));
  EXPECT_TRUE(m.insert(b, 2));
  EXPECT_TRUE(m.insert(c, 3));
  EXPECT_FALSE(m.insert(b, 9));  // present: unchanged
  EXPECT_EQ(m.find(b), std::optional<BlockId>(2));
  EXPECT_TRUE(m.insert(d, 4));  // home 0 is taken by b: lands in 2
  EXPECT_EQ(m.size(), 4);
  EXPECT_TRUE(m.erase(a));  // b, c shift back across the wrap; d stays reachable
  EXPECT_FALSE(m.erase(a));
  EXPECT_EQ(m.find(a), std::nullopt);
  EXPECT_EQ(m.find(b), std::optional<BlockId>(2));
  EXPECT_EQ(m.find(c), std::optional<BlockId>(3));
  EXPECT_EQ(m.find(d), std::optional<BlockId>(4));
  EXPECT_EQ(m.size(), 3);
}

// Against std::map, with keys crowded into few home slots so clusters form, wrap and merge.
TEST(BlockHashMapTest, AgreesWithAReferenceMap) {
  constexpr int32_t kMax = 100;
  BlockHashMap m(kMax);  // capacity 256
  std::map<std::pair<uint64_t, uint64_t>, BlockId> ref;
  std::mt19937 rng(7);
  for (int op = 0; op < 200000; ++op) {
    const BlockHash h{250 + rng() % 12, rng() % 40};  // homes 250..255 and 0..5
    const auto key = std::make_pair(h.low, h.high);
    const auto it = ref.find(key);
    if (rng() % 2 == 0 && static_cast<int32_t>(ref.size()) < kMax) {
      const auto id = static_cast<BlockId>(op % 1000 + 1);
      ASSERT_EQ(m.insert(h, id), it == ref.end()) << "op " << op;
      if (it == ref.end()) ref[key] = id;
    } else {
      ASSERT_EQ(m.erase(h), it != ref.end()) << "op " << op;
      if (it != ref.end()) ref.erase(it);
    }
    ASSERT_EQ(m.size(), static_cast<int32_t>(ref.size()));
    if (op % 97 == 0) {
      for (const auto& [k, id] : ref) {
        ASSERT_EQ(m.find(BlockHash{k.first, k.second}), std::optional<BlockId>(id)) << op;
      }
    }
  }
}

TEST(BlockPoolTest, HandsOutBlocksInOrderAndNeverTheNullBlock) {
  BlockPool pool(6);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_EQ(pool.free_queue_order(), (Ids{1, 2, 3, 4, 5}));
  Ids got;
  pool.get_new_blocks(3, &got);
  EXPECT_EQ(got, (Ids{1, 2, 3}));
  for (BlockId id : got) EXPECT_EQ(pool.block(id).ref_cnt, 1);
  EXPECT_EQ(pool.block(kNullBlockId).ref_cnt, 0);
  EXPECT_EQ(pool.num_used_blocks(), 3);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.6);
  pool.touch(2);
  EXPECT_EQ(pool.block(2).ref_cnt, 2);
  pool.free_block(2);
  pool.free_block(2);  // uncached: to the front, reused first
  EXPECT_EQ(pool.free_queue_order(), (Ids{2, 4, 5}));
  got.clear();
  pool.get_new_blocks(3, &got);
  EXPECT_EQ(got, (Ids{2, 4, 5}));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  pool.check_invariants();
  EXPECT_DEATH(pool.get_new_blocks(1, &got), "more blocks than are free");
  EXPECT_DEATH(pool.touch(kNullBlockId), "touch of block 0");
}

// Shared = held by more than one table entry: counted when a reference makes it 2, uncounted
// when one takes it back to 1, whatever the count climbs to in between.
TEST(BlockPoolTest, CountsSharedBlocks) {
  BlockPool pool(6);
  Ids got;
  pool.get_new_blocks(3, &got);  // 1, 2, 3 at ref 1
  EXPECT_EQ(pool.num_shared_blocks(), 0);
  pool.touch(2);
  EXPECT_EQ(pool.num_shared_blocks(), 1);
  pool.touch(2);  // ref 3: still one shared block
  pool.touch(3);
  EXPECT_EQ(pool.num_shared_blocks(), 2);
  pool.check_invariants();
  pool.free_block(2);  // ref 2
  EXPECT_EQ(pool.num_shared_blocks(), 2);
  pool.free_block(2);  // ref 1
  EXPECT_EQ(pool.num_shared_blocks(), 1);
  pool.free_block(3);
  pool.free_block(3);  // ref 0: free
  EXPECT_EQ(pool.num_shared_blocks(), 0);
  pool.touch(3);  // revived at ref 1: not shared
  EXPECT_EQ(pool.num_shared_blocks(), 0);
  pool.check_invariants();
}

TEST(BlockPoolTest, CachedFreeBlocksAreLruAndRevivedFromTheMiddle) {
  BlockPool pool(6);
  Ids got;
  pool.get_new_blocks(5, &got);
  for (BlockId id = 1; id <= 4; ++id) ASSERT_TRUE(pool.cache_block(id, fake_hash(id)));
  EXPECT_FALSE(pool.cache_block(5, fake_hash(1)));  // duplicate content stays uncached
  EXPECT_FALSE(pool.block(5).is_cached);
  for (BlockId id = 1; id <= 5; ++id) pool.free_block(id);
  // Uncached 5 at the front; cached 1..4 behind it in the order they were freed.
  EXPECT_EQ(pool.free_queue_order(), (Ids{5, 1, 2, 3, 4}));
  EXPECT_EQ(pool.num_cached_free_blocks(), 4);
  EXPECT_EQ(pool.num_free_uncached_blocks(), 1);
  EXPECT_EQ(pool.num_used_blocks(), 0);
  EXPECT_EQ(pool.get_cached_block(fake_hash(3)), std::optional<BlockId>(3));
  pool.touch(3);  // a prefix hit revives a free cached block
  EXPECT_EQ(pool.free_queue_order(), (Ids{5, 1, 2, 4}));
  EXPECT_TRUE(pool.block(3).is_cached);
  EXPECT_EQ(pool.num_cached_free_blocks(), 3);
  got.clear();
  pool.get_new_blocks(2, &got);  // 5 (uncached), then 1 (LRU cached: evicted)
  EXPECT_EQ(got, (Ids{5, 1}));
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_FALSE(pool.get_cached_block(fake_hash(1)).has_value());
  EXPECT_FALSE(pool.block(1).is_cached);
  EXPECT_EQ(pool.num_cached_blocks(), 3);  // 2, 4 free and 3 used
  pool.free_block(3);                       // cached, freed last: evicted last
  EXPECT_EQ(pool.free_queue_order(), (Ids{2, 4, 3}));
  pool.check_invariants();
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  static constexpr int32_t kBlockSize = 4;
  KvCacheManager kv{KvCacheManagerOptions{.num_blocks = 10, .block_size = kBlockSize}};

  // get_computed_blocks + allocate_slots for the whole prompt, as the scheduler admits a request
  // (and counts the prefix query when it is admitted).
  std::optional<Ids> admit(const Req& r, int64_t lookahead = 0) {
    ComputedBlocks hit = kv.get_computed_blocks(r.view());
    const auto n = static_cast<int64_t>(r.tokens.size()) - hit.num_computed_tokens;
    auto slots = kv.allocate_slots(r.view(), n, hit, lookahead);
    kv.check_invariants();
    if (!slots) return std::nullopt;
    kv.record_prefix_query(r.view(), hit);
    return ids(*slots);
  }
  Ids free_queue() const { return kv.block_pool().free_queue_order(); }
  int32_t ref(BlockId id) const { return kv.block_pool().block(id).ref_cnt; }
};

TEST_F(KvCacheManagerTest, CachesOnlyFullBlocksOfCommittedComputedTokens) {
  Req a{.id = 1, .tokens = iota_tokens(10)};
  EXPECT_EQ(admit(a), (Ids{1, 2, 3}));
  EXPECT_TRUE(kv.block_hashes(1).empty());  // nothing computed yet: nothing cached
  EXPECT_EQ(kv.stats().num_cached_blocks, 0);
  a.computed = 10;  // the step ran
  kv.cache_full_blocks(a.view());
  const std::vector<BlockHash> expect = chain(a.tokens, 2, kBlockSize);
  EXPECT_EQ(std::vector<BlockHash>(kv.block_hashes(1).begin(), kv.block_hashes(1).end()), expect);
  EXPECT_TRUE(kv.block_pool().block(1).is_cached);
  EXPECT_EQ(kv.block_pool().block(2).block_hash, expect[1]);
  EXPECT_FALSE(kv.block_pool().block(3).is_cached);  // 2 of 4 slots: never cached while partial
  // Decode: one new token fits in block 3.
  a.tokens.push_back(100);
  auto slots = kv.allocate_slots(a.view(), 1);
  ASSERT_TRUE(slots.has_value());
  EXPECT_TRUE(slots->empty());
  // Decode with 3 lookahead (draft) slots: 10 + 1 + 3 = 14 slots -> a 4th block.
  slots = kv.allocate_slots(a.view(), 1, {}, 3);
  ASSERT_TRUE(slots.has_value());
  EXPECT_EQ(ids(*slots), (Ids{4}));
  EXPECT_EQ(ids(kv.block_ids(1)), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(kv.num_slots(1), 16);
  // Block 3 fills with computed tokens 8..11 but token 11 is not committed: still uncached.
  a.computed = 11;
  kv.cache_full_blocks(a.view());
  EXPECT_EQ(kv.block_hashes(1).size(), 2u);
  a.tokens.push_back(101);
  kv.cache_full_blocks(a.view());  // computed 11 < 12: still not
  EXPECT_EQ(kv.block_hashes(1).size(), 2u);
  a.computed = 12;
  kv.cache_full_blocks(a.view());
  EXPECT_EQ(kv.block_hashes(1).size(), 3u);
  EXPECT_TRUE(kv.block_pool().block(3).is_cached);
  kv.check_invariants();
}

TEST_F(KvCacheManagerTest, PrefixHitsAcrossRequests) {
  Req a{.id = 1, .tokens = iota_tokens(10)};
  ASSERT_EQ(admit(a), (Ids{1, 2, 3}));
  a.computed = 10;
  kv.cache_full_blocks(a.view());
  // B shares A's first 8 tokens.
  Req b{.id = 2, .tokens = iota_tokens(8)};
  b.tokens.insert(b.tokens.end(), {99, 98});
  ComputedBlocks hit = kv.get_computed_blocks(b.view());
  EXPECT_EQ(hit_ids(hit), (Ids{1, 2}));
  EXPECT_EQ(hit.num_computed_tokens, 8);
  auto slots = kv.allocate_slots(b.view(), 2, hit);
  ASSERT_TRUE(slots.has_value());
  kv.record_prefix_query(b.view(), hit);
  EXPECT_EQ(ids(*slots), (Ids{1, 2, 4}));
  EXPECT_EQ(ref(1), 2);
  EXPECT_EQ(ref(2), 2);
  EXPECT_EQ(ref(3), 1);
  EXPECT_EQ(ref(4), 1);
  EXPECT_EQ(std::vector<BlockHash>(kv.block_hashes(2).begin(), kv.block_hashes(2).end()),
            chain(a.tokens, 2, kBlockSize));
  // C is exactly A's first 8 tokens: one token must stay to compute, so only block 1 hits.
  Req c{.id = 3, .tokens = iota_tokens(8)};
  const ComputedBlocks hit_c = kv.get_computed_blocks(c.view());
  EXPECT_EQ(hit_ids(hit_c), (Ids{1}));
  // D has the same tokens under another cache salt: no hit.
  Req d{.id = 4, .tokens = iota_tokens(10), .salt = "other-tenant"};
  const ComputedBlocks hit_d = kv.get_computed_blocks(d.view());
  EXPECT_TRUE(hit_ids(hit_d).empty());
  // Asking is not counting: only record_prefix_query() (the scheduler's admission) counts.
  EXPECT_EQ(kv.stats().num_queries, 2);
  kv.record_prefix_query(c.view(), hit_c);
  kv.record_prefix_query(d.view(), hit_d);
  // Queries: A (10 tokens, 0 hit), B (10, 8), C (8, 4), D (10, 0).
  const KvCacheStats s = kv.stats();
  EXPECT_EQ(s.num_queries, 4);
  EXPECT_EQ(s.num_hits, 2);
  EXPECT_EQ(s.num_query_tokens, 38);
  EXPECT_EQ(s.num_hit_tokens, 12);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 12.0 / 38.0);
  EXPECT_EQ(s.num_used_blocks, 4);
  EXPECT_EQ(s.num_cached_blocks, 2);
  EXPECT_EQ(s.num_shared_blocks, 2);  // 1 and 2: A's and B's tables
  EXPECT_EQ(s.num_free_uncached_blocks, 5);
  EXPECT_EQ(s.num_cached_free_blocks, 0);
}

// A request that waits blocked is asked for its prefix hit every step; it counts as one query,
// when it is admitted, so the hit rate is exact.
TEST_F(KvCacheManagerTest, BlockedWaitingRequestCountsOneQuery) {
  Req a{.id = 1, .tokens = iota_tokens(16)};
  ASSERT_EQ(admit(a), (Ids{1, 2, 3, 4}));
  a.computed = 16;
  kv.cache_full_blocks(a.view());
  // B shares A's first 8 tokens and needs 8 blocks: 2 hit + 6 new, but only 5 are free.
  Req b{.id = 2, .tokens = iota_tokens(8)};
  const std::vector<int32_t> tail = iota_tokens(24, 500);
  b.tokens.insert(b.tokens.end(), tail.begin(), tail.end());
  for (int step = 0; step < 5; ++step) {
    const ComputedBlocks hit = kv.get_computed_blocks(b.view());
    EXPECT_EQ(hit_ids(hit), (Ids{1, 2})) << "step " << step;
    EXPECT_EQ(hit.block_hashes, chain(b.tokens, 2, kBlockSize)) << "step " << step;
    EXPECT_FALSE(kv.allocate_slots(b.view(), 24, hit).has_value()) << "step " << step;
    kv.check_invariants();
  }
  EXPECT_EQ(kv.stats().num_queries, 1);  // A only
  kv.free(1);                            // A finishes; its cached blocks stay hittable
  EXPECT_EQ(admit(b), (Ids{1, 2, 5, 6, 7, 8, 9, 4}));
  const KvCacheStats s = kv.stats();
  // (queries, hits, query tokens, hit tokens): A (16 tokens, no hit) and B (32, 8 hit), once.
  EXPECT_EQ(std::tuple(s.num_queries, s.num_hits, s.num_query_tokens, s.num_hit_tokens),
            std::tuple(2, 1, 16 + 32, 8));
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 8.0 / 48.0);
}

// The hashes kept for a waiting request extend when its prefix becomes cached later, and free()
// drops them: a later request under the same id with other tokens is hashed afresh.
TEST_F(KvCacheManagerTest, KeptWaitingHashesExtendAndAreDroppedByFree) {
  Req c{.id = 3, .tokens = iota_tokens(12, 40)};
  EXPECT_TRUE(hit_ids(kv.get_computed_blocks(c.view())).empty());  // nothing cached yet
  Req d{.id = 4, .tokens = iota_tokens(12, 40)};
  ASSERT_TRUE(admit(d).has_value());
  d.computed = 12;
  kv.cache_full_blocks(d.view());
  // Now C's first two blocks (at most (12 - 1) / 4) are D's.
  ComputedBlocks hit = kv.get_computed_blocks(c.view());
  EXPECT_EQ(hit_ids(hit), (Ids{1, 2}));
  EXPECT_EQ(hit.block_hashes, chain(c.tokens, 2, kBlockSize));
  kv.check_invariants();
  kv.free(3);  // C aborted while waiting
  Req other{.id = 3, .tokens = iota_tokens(12, 70)};
  EXPECT_TRUE(hit_ids(kv.get_computed_blocks(other.view())).empty());
  // Freed again, id 3 with C's tokens hashes afresh and finds D's blocks.
  kv.free(3);
  hit = kv.get_computed_blocks(c.view());
  EXPECT_EQ(hit_ids(hit), (Ids{1, 2}));
  ASSERT_TRUE(kv.allocate_slots(c.view(), 4, hit).has_value());
  kv.check_invariants();  // C holds blocks now: no kept hashes left for it
}

TEST_F(KvCacheManagerTest, FreeSendsTailFirstAndRevivesOnHit) {
  Req a{.id = 1, .tokens = iota_tokens(13)};
  ASSERT_EQ(admit(a), (Ids{1, 2, 3, 4}));
  a.computed = 12;  // block 4 holds the one uncomputed token
  kv.cache_full_blocks(a.view());
  EXPECT_EQ(free_queue(), (Ids{5, 6, 7, 8, 9}));
  kv.free(1);
  kv.check_invariants();
  // Uncached 4 to the front; cached 3, 2, 1 to the back, tail first (evicted first).
  EXPECT_EQ(free_queue(), (Ids{4, 5, 6, 7, 8, 9, 3, 2, 1}));
  KvCacheStats s = kv.stats();
  EXPECT_EQ(s.num_used_blocks, 0);
  EXPECT_EQ(s.num_cached_free_blocks, 3);
  EXPECT_EQ(s.num_free_uncached_blocks, 6);
  EXPECT_EQ(s.num_cached_free_blocks + s.num_free_uncached_blocks + s.num_used_blocks,
            s.num_usable_blocks);
  EXPECT_FALSE(kv.has_request(1));
  kv.free(1);  // unknown id: no-op
  // The same prompt again: the cached free blocks are revived from the queue's middle and end.
  Req again{.id = 2, .tokens = a.tokens};
  EXPECT_EQ(admit(again), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(free_queue(), (Ids{5, 6, 7, 8, 9}));
  EXPECT_EQ(kv.stats().num_evictions, 0);
}

TEST_F(KvCacheManagerTest, EvictionOrderAfterFrees) {
  Req a{.id = 1, .tokens = iota_tokens(13)};
  ASSERT_EQ(admit(a), (Ids{1, 2, 3, 4}));
  a.computed = 12;
  kv.cache_full_blocks(a.view());
  kv.free(1);  // queue: 4 5 6 7 8 9 3 2 1
  Req b{.id = 2, .tokens = iota_tokens(32, 1000)};
  EXPECT_EQ(admit(b), (Ids{4, 5, 6, 7, 8, 9, 3, 2}));
  EXPECT_EQ(kv.stats().num_evictions, 2);  // 3 and 2, A's tail first
  EXPECT_EQ(free_queue(), (Ids{1}));
  // A's first block survives: a request with A's prompt hits exactly one block.
  Req c{.id = 3, .tokens = a.tokens};
  EXPECT_EQ(hit_ids(kv.get_computed_blocks(c.view())), (Ids{1}));
}

TEST_F(KvCacheManagerTest, DoesNotFitIsNulloptAndChangesNothing) {
  Req big{.id = 1, .tokens = iota_tokens(37)};  // 10 blocks > 9 usable
  EXPECT_EQ(admit(big), std::nullopt);
  EXPECT_FALSE(kv.has_request(1));
  EXPECT_EQ(kv.num_free_blocks(), 9);
  Req a{.id = 2, .tokens = iota_tokens(36)};
  EXPECT_EQ(admit(a), (Ids{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(kv.usage(), 1.0);
  a.computed = 36;
  a.tokens.push_back(7);
  EXPECT_EQ(kv.allocate_slots(a.view(), 1), std::nullopt);  // needs a 10th block
  EXPECT_EQ(kv.block_ids(2).size(), 9u);
  kv.check_invariants();
}

TEST_F(KvCacheManagerTest, RevivedHitBlocksAreNotCountedAsFree) {
  KvCacheManager small(KvCacheManagerOptions{.num_blocks = 5, .block_size = kBlockSize});
  Req a{.id = 1, .tokens = iota_tokens(9)};
  ASSERT_TRUE(small.allocate_slots(a.view(), 9).has_value());  // blocks 1 2 3
  a.computed = 8;
  small.cache_full_blocks(a.view());
  small.free(1);
  EXPECT_EQ(small.block_pool().free_queue_order(), (Ids{3, 4, 2, 1}));
  Req b{.id = 2, .tokens = a.tokens};
  ComputedBlocks hit = small.get_computed_blocks(b.view());
  ASSERT_EQ(hit_ids(hit), (Ids{1, 2}));
  // 8 hit + 1 new + 8 lookahead = 17 slots = 5 blocks: 3 new, but only 4 - 2 revived = 2 free.
  EXPECT_EQ(small.allocate_slots(b.view(), 1, hit, 8), std::nullopt);
  EXPECT_EQ(small.block_pool().free_queue_order(), (Ids{3, 4, 2, 1}));
  auto slots = small.allocate_slots(b.view(), 1, hit, 4);  // 13 slots = 4 blocks: 2 new
  ASSERT_TRUE(slots.has_value());
  EXPECT_EQ(ids(*slots), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(small.num_free_blocks(), 0);
  small.check_invariants();
}

TEST_F(KvCacheManagerTest, DuplicateBlocksFromTheSameStepStayUncached) {
  Req a{.id = 1, .tokens = iota_tokens(9)}, b{.id = 2, .tokens = iota_tokens(9)};
  ASSERT_EQ(admit(a), (Ids{1, 2, 3}));
  ASSERT_EQ(admit(b), (Ids{4, 5, 6}));  // admitted in the same step: nothing cached yet
  a.computed = b.computed = 9;
  kv.cache_full_blocks(a.view());
  kv.cache_full_blocks(b.view());
  EXPECT_TRUE(kv.block_pool().block(1).is_cached);
  EXPECT_FALSE(kv.block_pool().block(4).is_cached);  // duplicate of block 1
  EXPECT_EQ(std::vector<BlockHash>(kv.block_hashes(2).begin(), kv.block_hashes(2).end()),
            chain(a.tokens, 2, kBlockSize));  // the chain is still known for B's next blocks
  kv.free(2);
  EXPECT_EQ(free_queue(), (Ids{4, 5, 6, 7, 8, 9}));  // duplicates are reused first
  kv.check_invariants();
}

TEST_F(KvCacheManagerTest, ForkSharesFullBlocksAndCopiesThePartialTail) {
  Req p{.id = 1, .tokens = iota_tokens(10)};
  ASSERT_EQ(admit(p), (Ids{1, 2, 3}));
  p.computed = 10;
  kv.cache_full_blocks(p.view());
  auto forked = kv.fork(1, 2, 10);
  ASSERT_TRUE(forked.has_value());
  ASSERT_EQ(forked->copies_on_write.size(), 1u);
  EXPECT_EQ(forked->copies_on_write[0].src_block, 3);
  EXPECT_EQ(forked->copies_on_write[0].dst_block, 4);
  EXPECT_EQ(forked->copies_on_write[0].num_tokens, 2);
  EXPECT_EQ(ids(kv.block_ids(2)), (Ids{1, 2, 4}));
  EXPECT_EQ(kv.block_hashes(2).size(), 2u);
  EXPECT_EQ(ref(1), 2);
  EXPECT_EQ(ref(2), 2);
  EXPECT_EQ(ref(3), 1);
  EXPECT_EQ(ref(4), 1);
  // A block-aligned fork shares everything and copies nothing.
  forked = kv.fork(1, 3, 8);
  ASSERT_TRUE(forked.has_value());
  EXPECT_TRUE(forked->copies_on_write.empty());
  EXPECT_EQ(ids(kv.block_ids(3)), (Ids{1, 2}));
  EXPECT_EQ(ref(1), 3);
  kv.check_invariants();
  // The parent finishes: shared blocks stay with the children, its own tail is freed.
  kv.free(1);
  EXPECT_EQ(ref(1), 2);
  EXPECT_EQ(ref(3), 0);
  EXPECT_EQ(free_queue().front(), 3);
  // The child decodes into its private copy of the tail.
  Req c{.id = 2, .tokens = p.tokens, .computed = 10};
  c.tokens.push_back(55);
  auto slots = kv.allocate_slots(c.view(), 1);
  ASSERT_TRUE(slots.has_value());
  EXPECT_TRUE(slots->empty());
  kv.check_invariants();
  EXPECT_DEATH((void)kv.fork(2, 3, 4), "already exists");
}

TEST_F(KvCacheManagerTest, ForkWithoutAFreeBlockForTheTailIsNullopt) {
  Req p{.id = 1, .tokens = iota_tokens(34)};
  ASSERT_TRUE(admit(p).has_value());  // 9 blocks, none free
  EXPECT_EQ(kv.fork(1, 2, 34), std::nullopt);
  EXPECT_FALSE(kv.has_request(2));
  EXPECT_EQ(ref(1), 1);
  auto aligned = kv.fork(1, 2, 32);  // no tail: fits
  ASSERT_TRUE(aligned.has_value());
  EXPECT_EQ(kv.block_ids(2).size(), 8u);
  kv.check_invariants();
}

TEST_F(KvCacheManagerTest, TruncateRollsBackSpeculativeSlots) {
  Req a{.id = 1, .tokens = iota_tokens(5)};
  ASSERT_EQ(admit(a), (Ids{1, 2}));
  a.computed = 5;
  a.tokens.push_back(50);
  // Decode the new token plus 7 draft slots: 5 + 1 + 7 = 13 slots -> blocks 3 and 4.
  auto slots = kv.allocate_slots(a.view(), 1, {}, 7);
  ASSERT_TRUE(slots.has_value());
  EXPECT_EQ(ids(*slots), (Ids{3, 4}));
  // One draft accepted: 7 computed, 8 committed; roll back to 8 slots.
  kv.truncate(1, 8);
  EXPECT_EQ(ids(kv.block_ids(1)), (Ids{1, 2}));
  EXPECT_EQ(free_queue(), (Ids{3, 4, 5, 6, 7, 8, 9}));  // speculative blocks: front, uncached
  kv.truncate(1, 7);                                     // keeps the partial tail: no change
  EXPECT_EQ(ids(kv.block_ids(1)), (Ids{1, 2}));
  kv.truncate(1, 100);  // beyond the slots: no-op
  EXPECT_EQ(kv.num_slots(1), 8);
  kv.check_invariants();
  // Committed, computed blocks are cached and may not be rolled back into.
  a.computed = 8;
  a.tokens.insert(a.tokens.end(), {51, 52});
  kv.cache_full_blocks(a.view());
  ASSERT_EQ(kv.block_hashes(1).size(), 2u);
  EXPECT_DEATH(kv.truncate(1, 6), "cuts into cached");
}

TEST_F(KvCacheManagerTest, TruncateNeverWritesIntoASharedTail) {
  Req p{.id = 1, .tokens = iota_tokens(8)};
  ASSERT_EQ(admit(p), (Ids{1, 2}));
  ASSERT_TRUE(kv.fork(1, 2, 8).has_value());  // shares blocks 1 and 2
  EXPECT_DEATH(kv.truncate(1, 6), "shared or cached block 2");
  kv.truncate(1, 4);  // drops the reference to block 2 only
  EXPECT_EQ(ref(2), 1);
  EXPECT_EQ(ids(kv.block_ids(1)), (Ids{1}));
  kv.check_invariants();
}

TEST_F(KvCacheManagerTest, AllocateRejectsStaleComputedBlocks) {
  Req a{.id = 1, .tokens = iota_tokens(9)};
  ASSERT_TRUE(admit(a).has_value());
  a.computed = 8;
  kv.cache_full_blocks(a.view());
  kv.free(1);
  Req b{.id = 2, .tokens = a.tokens};
  ComputedBlocks hit = kv.get_computed_blocks(b.view());
  ASSERT_EQ(hit_ids(hit), (Ids{1, 2}));
  Req filler{.id = 3, .tokens = iota_tokens(36, 500)};  // evicts everything
  ASSERT_TRUE(admit(filler).has_value());
  EXPECT_DEATH((void)kv.allocate_slots(b.view(), 1, hit), "was evicted");
}

TEST(KvCacheManagerNoCachingTest, NeverHashesOrHits) {
  KvCacheManager kv(KvCacheManagerOptions{
      .num_blocks = 8, .block_size = 4, .enable_prefix_caching = false});
  Req a{.id = 1, .tokens = iota_tokens(9), .computed = 0};
  ASSERT_TRUE(kv.allocate_slots(a.view(), 9).has_value());
  a.computed = 9;
  kv.cache_full_blocks(a.view());
  EXPECT_TRUE(kv.block_hashes(1).empty());
  kv.free(1);
  EXPECT_EQ(kv.block_pool().free_queue_order(), (Ids{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(hit_ids(kv.get_computed_blocks(a.view())).empty());
  EXPECT_EQ(kv.stats().num_cached_blocks, 0);
}

}  // namespace
}  // namespace arbor::kv
