// Exact expectations for KV cache groups (sliding-window layers): which blocks each group's table
// holds as a request grows past the window, when blocks are released (null entries), per-group
// accounting, prefix hits that need only the window, fork and truncate per group, and the
// bounds the scheduler admits by.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_cache_utils.h"

namespace arbor::kv {
namespace {

using Ids = std::vector<BlockId>;
constexpr BlockId N = kNullBlockId;

Ids ids(std::span<const BlockId> s) { return Ids(s.begin(), s.end()); }

struct Req {
  KvRequestId id = 0;
  std::vector<int32_t> tokens{};
  int64_t computed = 0;
  KvRequest view() const { return KvRequest{id, tokens, computed, "", 0}; }
};

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// What the scheduler does for a step of n committed tokens: allocate, "run", commit, cache.
void run_step(KvCacheManager& kv, Req& r, int64_t n) {
  ASSERT_TRUE(kv.allocate_slots(r.view(), n).has_value());
  r.computed += n;
  if (r.computed == static_cast<int64_t>(r.tokens.size())) {
    r.tokens.push_back(1000 + static_cast<int32_t>(r.tokens.size()));  // the sampled token
  }
  kv.cache_full_blocks(r.view());
  kv.check_invariants();
}

// A full-attention group and a sliding group of 8 tokens, blocks of 4 tokens: a query at
// position p reads p - 7 .. p, so after c tokens are computed the blocks wholly before c - 7
// are released.
class KvGroupsTest : public testing::Test {
 protected:
  KvCacheManager kv{KvCacheManagerOptions{
      .num_blocks = 40, .block_size = 4, .group_windows = {0, 8}}};
};

TEST_F(KvGroupsTest, SlidingTableReleasesBlocksThatLeftTheWindow) {
  Req a{.id = 1, .tokens = iota_tokens(6)};
  run_step(kv, a, 6);  // the prompt; samples token 6
  // One block per group per logical block, group by group from the front of the free queue.
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{3, 4}));
  // Decode, one position per step. The step that computes position 8 opens logical block 2.
  run_step(kv, a, 1);
  run_step(kv, a, 1);  // computed 8
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{3, 4}));
  run_step(kv, a, 1);  // computed 9
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 5}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{3, 4, 6}));
  run_step(kv, a, 1);  // computed 10: the next query (position 10) reads 3 .. 10
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{3, 4, 6}));
  EXPECT_EQ(kv.stats().group_released_blocks, (std::vector<int64_t>{0, 0}));
  run_step(kv, a, 1);  // computed 11: the next query reads 4 .. 11; block 0 (0 .. 3) is dead
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 5}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, 4, 6}));
  EXPECT_EQ(kv.stats().group_released_blocks, (std::vector<int64_t>{0, 1}));
  // The released block was hashed (cached) first: it waits at the back of the free queue.
  EXPECT_EQ(kv.block_pool().block(3).ref_cnt, 0);
  EXPECT_TRUE(kv.block_pool().block(3).is_cached);
  EXPECT_EQ(kv.block_pool().free_queue_order().back(), 3);
  run_step(kv, a, 1);
  run_step(kv, a, 1);  // computed 13: position 12 opened logical block 3
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 5, 7}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, 4, 6, 8}));
  run_step(kv, a, 1);
  run_step(kv, a, 1);  // computed 15: reads 8 .. 15
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, N, 6, 8}));
  KvCacheStats s = kv.stats();
  EXPECT_EQ(s.group_used_blocks, (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(s.num_used_blocks, 6);
  EXPECT_EQ(s.group_released_blocks, (std::vector<int64_t>{0, 2}));
  // Far past the window: after computing c tokens the sliding table holds blocks
  // (c - 7) / 4 .. (c - 1) / 4 and nothing before; the full one every block.
  for (int64_t c = 16; c <= 56; ++c) {
    run_step(kv, a, 1);
    ASSERT_EQ(a.computed, c);
    const std::span<const BlockId> full = kv.block_ids(1, 0), sliding = kv.block_ids(1, 1);
    ASSERT_EQ(static_cast<int64_t>(full.size()), (c + 3) / 4);
    ASSERT_EQ(sliding.size(), full.size());
    for (int64_t i = 0; i < static_cast<int64_t>(sliding.size()); ++i) {
      ASSERT_EQ(sliding[i] == N, i < (c - 7) / 4) << "computed " << c << " entry " << i;
    }
  }
  s = kv.stats();
  EXPECT_EQ(s.group_used_blocks, (std::vector<int32_t>{14, 2}));
  EXPECT_EQ(s.group_released_blocks, (std::vector<int64_t>{0, 12}));
  kv.free(1);
  EXPECT_EQ(kv.stats().group_used_blocks, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(kv.num_free_blocks(), 39);
  kv.check_invariants();
}

TEST_F(KvGroupsTest, ReleaseHappensOnAllocationToo) {
  // Without cache_full_blocks after its steps (a caller that skips it), allocate_slots releases.
  Req a{.id = 1, .tokens = iota_tokens(20)};
  ASSERT_TRUE(kv.allocate_slots(a.view(), 16).has_value());  // a 16-token prefill chunk
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{5, 6, 7, 8}));
  a.computed = 16;  // the chunk ran; the next chunk's first query reads 9 .. 16
  ASSERT_TRUE(kv.allocate_slots(a.view(), 4).has_value());
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 3, 4, 9}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, N, 7, 8, 10}));
  // Released after being cached: both dead blocks stay reusable for prefix hits.
  EXPECT_TRUE(kv.block_pool().block(5).is_cached);
  EXPECT_TRUE(kv.block_pool().block(6).is_cached);
  kv.check_invariants();
}

TEST_F(KvGroupsTest, PrefixHitNeedsOnlyTheWindowBeforeIt) {
  Req a{.id = 1, .tokens = iota_tokens(20)};
  for (int i = 0; i < 5; ++i) run_step(kv, a, 4);  // chunks of 4: the prompt, sampled token 20
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 3, 5, 7, 9}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, N, N, 8, 10}));
  kv.free(1);
  // Free queue: uncached blocks, then cached ones in the order freed (released sliding blocks
  // first, then A's tables tail first, every group).
  const Ids queue = kv.block_pool().free_queue_order();
  EXPECT_EQ(Ids(queue.end() - 10, queue.end()), (Ids{2, 4, 6, 9, 10, 7, 8, 5, 3, 1}));

  // B: the same 20 tokens and 4 more. The full group serves blocks 0-4; the sliding group needs
  // only blocks 3 and 4 (ceil((8 - 1) / 4) = 2 before position 20): hit 20 tokens.
  Req b{.id = 2, .tokens = iota_tokens(24)};
  ComputedBlocks hit = kv.get_computed_blocks(b.view());
  EXPECT_EQ(hit.num_computed_tokens, 20);
  ASSERT_EQ(hit.group_block_ids.size(), 2u);
  EXPECT_EQ(hit.group_block_ids[0], (Ids{1, 3, 5, 7, 9}));
  EXPECT_EQ(hit.group_block_ids[1], (Ids{N, N, N, 8, 10}));
  // Evict the released sliding blocks 2, 4, 6 (at the front of the cached part): same hit.
  Req filler{.id = 9, .tokens = iota_tokens(1, 500)};
  const int32_t uncached = kv.block_pool().num_free_uncached_blocks();
  ASSERT_EQ(uncached, 29);
  ASSERT_TRUE(kv.allocate_slots(filler.view(), 0, {}, 4 * 16));  // 16 blocks per group
  kv.free(9);  // its uncached blocks go back to the front; the evictions stay
  EXPECT_FALSE(kv.block_pool().block(2).is_cached);
  EXPECT_FALSE(kv.block_pool().block(4).is_cached);
  EXPECT_FALSE(kv.block_pool().block(6).is_cached);
  EXPECT_TRUE(kv.block_pool().block(9).is_cached);
  hit = kv.get_computed_blocks(b.view());
  EXPECT_EQ(hit.num_computed_tokens, 20);
  EXPECT_EQ(hit.group_block_ids[1], (Ids{N, N, N, 8, 10}));
  ASSERT_TRUE(kv.allocate_slots(b.view(), 4, hit).has_value());
  EXPECT_EQ(ids(kv.block_ids(2, 0)).size(), 6u);
  EXPECT_EQ(ids(kv.block_ids(2, 1)).size(), 6u);
  EXPECT_EQ(Ids(kv.block_ids(2, 1).begin(), kv.block_ids(2, 1).begin() + 5),
            (Ids{N, N, N, 8, 10}));
  kv.check_invariants();

  // C: A's first 12 tokens and more. The full group still serves blocks 0-2 (B holds them), but
  // the sliding group's blocks 1 and 2 (the window before position 12) were evicted: no hit.
  Req c{.id = 3, .tokens = iota_tokens(12)};
  c.tokens.push_back(777);
  EXPECT_EQ(kv.get_computed_blocks(c.view()).num_computed_tokens, 0);
  // D: A's first 16 tokens and more: blocks 2 and 3 of the sliding group are needed; 6 is gone.
  // Position 8's window would need blocks 0 and 1: gone too. No hit either.
  Req d{.id = 4, .tokens = iota_tokens(16)};
  d.tokens.push_back(777);
  EXPECT_EQ(kv.get_computed_blocks(d.view()).num_computed_tokens, 0);
  // E: A's 20 tokens and more: the window before position 20 (blocks 3, 4) is B's: hit 20.
  Req e{.id = 5, .tokens = iota_tokens(21)};
  EXPECT_EQ(kv.get_computed_blocks(e.view()).num_computed_tokens, 20);
  // With a cap below 20 (prompt logprobs): the hit must end where the window is cached too.
  EXPECT_EQ(kv.get_computed_blocks(e.view(), 19).num_computed_tokens, 0);
}

TEST(KvGroupsLeadingRunTest, AHitWithinTheFirstWindowNeedsEveryBlockBeforeIt) {
  // Window 9 with blocks of 2: a hit at block h needs blocks h - 4 .. h - 1, or all of 0 .. h - 1.
  KvCacheManager kv(KvCacheManagerOptions{.num_blocks = 40, .block_size = 2, .group_windows = {9}});
  Req a{.id = 1, .tokens = iota_tokens(8)};
  run_step(kv, a, 8);
  EXPECT_EQ(ids(kv.block_ids(1)), (Ids{1, 2, 3, 4}));
  kv.free(1);
  Req b{.id = 2, .tokens = iota_tokens(7)};
  b.tokens.push_back(99);  // 8 tokens: at most 3 blocks of hit (a token must be left to run)
  ComputedBlocks hit = kv.get_computed_blocks(b.view());
  EXPECT_EQ(hit.num_computed_tokens, 6);
  EXPECT_EQ(hit.group_block_ids[0], (Ids{1, 2, 3}));  // all needed: the window reaches position 0
}

TEST(KvGroupsForkTest, ForkSharesEachGroupAndCopiesEachTail) {
  KvCacheManager kv(KvCacheManagerOptions{
      .num_blocks = 40, .block_size = 4, .group_windows = {0, 8}});
  Req p{.id = 1, .tokens = iota_tokens(19)};
  for (int i = 0; i < 4; ++i) run_step(kv, p, 4);
  run_step(kv, p, 2);  // the parent of n > 1 computes the prompt but its last token: 18
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 3, 5, 7, 9}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, N, 6, 8, 10}));
  const std::optional<ForkResult> fr = kv.fork(1, 2, 18);
  ASSERT_TRUE(fr.has_value());
  // Full blocks shared (released entries stay null), the partial tail copied in each group.
  EXPECT_EQ(ids(kv.block_ids(2, 0)), (Ids{1, 3, 5, 7, 11}));
  EXPECT_EQ(ids(kv.block_ids(2, 1)), (Ids{N, N, 6, 8, 12}));
  ASSERT_EQ(fr->copies_on_write.size(), 2u);
  EXPECT_EQ(fr->copies_on_write[0].src_block, 9);
  EXPECT_EQ(fr->copies_on_write[0].dst_block, 11);
  EXPECT_EQ(fr->copies_on_write[1].src_block, 10);
  EXPECT_EQ(fr->copies_on_write[1].dst_block, 12);
  EXPECT_EQ(fr->copies_on_write[1].num_tokens, 2);
  EXPECT_EQ(kv.block_pool().block(6).ref_cnt, 2);
  kv.check_invariants();
  // Forking at a point whose window the parent released is a caller bug.
  EXPECT_DEATH(kv.fork(1, 3, 5), "released blocks the child's window needs");
}

TEST(KvGroupsTruncateTest, RejectedDraftsLeaveEveryGroup) {
  KvCacheManager kv(KvCacheManagerOptions{
      .num_blocks = 40, .block_size = 4, .group_windows = {0, 8}});
  Req a{.id = 1, .tokens = iota_tokens(13)};
  run_step(kv, a, 13);  // computed 13, 14 tokens
  // A verify step: the last token and 6 drafts (lookahead) need slots up to position 19.
  ASSERT_TRUE(kv.allocate_slots(a.view(), 1, {}, 6).has_value());
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 3, 4, 9}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, 6, 7, 8, 10}));
  // Two drafts accepted: 17 tokens, 16 computed; truncate to the committed tokens.
  a.computed = 16;
  for (int i = 0; i < 3; ++i) a.tokens.push_back(2000 + i);
  kv.truncate(1, 17);
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 3, 4, 9}));
  kv.truncate(1, 16);
  EXPECT_EQ(ids(kv.block_ids(1, 0)), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(ids(kv.block_ids(1, 1)), (Ids{N, 6, 7, 8}));
  kv.check_invariants();
}

TEST(KvGroupsBoundsTest, MaxBlocksPerRequestAndBlocksToAllocate) {
  KvCacheManager kv(KvCacheManagerOptions{
      .num_blocks = 64, .block_size = 4, .group_windows = {0, 8, 8}});
  // 100 tokens: 25 full blocks; a sliding group at most the blocks a step's span of
  // 8 - 1 + 16 positions touches: ceil(22 / 4) + 1 = 7.
  EXPECT_EQ(kv.max_blocks_per_request(100, 16), 25 + 7 + 7);
  EXPECT_EQ(kv.max_blocks_per_request(10, 16), 3 + 3 + 3);  // never more than the sequence
  EXPECT_EQ(kv.max_blocks_per_request(100, 1), 25 + 3 + 3);  // ceil(7 / 4) + 1
  Req a{.id = 1, .tokens = iota_tokens(10)};
  EXPECT_EQ(kv.num_blocks_to_allocate(a.view(), 10), 9);
  // One full-attention group: exactly the blocks of the sequence.
  KvCacheManager one(KvCacheManagerOptions{.num_blocks = 64, .block_size = 4});
  EXPECT_EQ(one.max_blocks_per_request(100, 16), 25);
  EXPECT_EQ(one.num_blocks_to_allocate(a.view(), 10, {}, 3), 4);
}

TEST(KvGroupsHashTest, GroupKeysDifferAndGroupZeroIsTheHash) {
  const BlockHash h{0x1234, 0x5678};
  EXPECT_EQ(group_block_hash(h, 0), h);
  EXPECT_NE(group_block_hash(h, 1), h);
  EXPECT_NE(group_block_hash(h, 1), group_block_hash(h, 2));
  EXPECT_EQ(group_block_hash(group_block_hash(h, 3), 0), group_block_hash(h, 3));
}

}  // namespace
}  // namespace arbor::kv
