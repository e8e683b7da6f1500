// Seeded random invariant runs: 100k operations (admit with prefix hits, chunked prefill,
// decode with draft slots, fork, truncate, preempt, finish) over a small pool with a two-token
// vocabulary, so prompts collide and blocks are shared constantly; once with one full-attention
// group, and with KV cache groups of sliding windows (blocks released as requests grow past
// them). After every operation:
//   * the manager's and pool's own invariants (check_invariants);
//   * independently: every ref_cnt equals the number of table entries (over every group)
//     holding the block, no block is handed out twice (nor to two groups), the null block
//     appears only where a sliding group released a block, used + cached_free + free_uncached
//     = total, and each group's used count is the blocks its tables hold;
//   * a shadow K/V store per group (what the executor would have written, token and salt per
//     slot) agrees with every live request's tokens at every position its next query can read
//     (every computed position; for a sliding group of window W those from computed - W + 1):
//     prefix hits, sharing, fork copies, truncation and releases never let a request read K/V
//     that is not its own, and a released block is never in a table;
//   * right after allocate_slots or cache_full_blocks, a sliding group holds no block wholly
//     before that window (released eagerly);
//   * each request's block hashes are the hash chain of its tokens.
// Seed: ARBOR_KV_SEED overrides the default; it is printed at the start and on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace arbor::kv {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kVocab = 2;
constexpr int kNumOps = 100'000;
constexpr size_t kMaxLive = 12;
constexpr size_t kMaxTokens = 64;
constexpr uint64_t kDefaultSeed = 20261121;

const char* const kSalts[] = {"", "tenant-b"};

struct SimRequest {
  KvRequestId id = 0;
  std::vector<int32_t> tokens;  // committed
  int64_t computed = 0;
  int salt = 0;
  KvRequest view() const { return KvRequest{id, tokens, computed, kSalts[salt], 0}; }
};

struct Coverage {
  int64_t admitted = 0, rejected = 0, hit_blocks = 0, steps = 0, drafts_rejected = 0;
  int64_t forks = 0, copies = 0, truncated_blocks = 0, preempted = 0, finished = 0;
  int64_t windowed_hits = 0;  // hits whose sliding group tables start with released entries
};

uint64_t seed_from_env() {
  const char* s = std::getenv("ARBOR_KV_SEED");
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 10) : kDefaultSeed;
}

class RandomRun {
 public:
  RandomRun(uint64_t seed, std::vector<int32_t> windows, int32_t num_blocks)
      : rng_(seed),
        windows_(std::move(windows)),
        num_blocks_(num_blocks),
        kv_(KvCacheManagerOptions{
            .num_blocks = num_blocks, .block_size = kBlockSize, .group_windows = windows_}),
        shadow_(windows_.size(),
                std::vector<int32_t>(static_cast<size_t>(num_blocks) * kBlockSize, -1)) {
    kv_.record_kv_events(true);
  }

  void step_once();
  void check() const;
  // The KvEvents since the last call, applied in order to a mirror of the cached hashes (as the
  // router's prefix index applies them), must leave exactly the pool's cached hashes (compared
  // in full when `compare`: every 16th operation, the scan costs as much as check()).
  void check_events(bool compare);
  const Coverage& coverage() const { return cov_; }
  const KvCacheManager& kv() const { return kv_; }

 private:
  std::unordered_set<BlockHash, BlockHashHasher> mirror_;
  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  int32_t token() { return static_cast<int32_t>(uniform(0, kVocab - 1)); }
  static int32_t encode(const SimRequest& r, int32_t t) { return r.salt * kVocab + t; }
  int32_t num_groups() const { return static_cast<int32_t>(windows_.size()); }
  // The first position a query at `computed` reads in group g.
  int64_t first_read(int32_t g, int64_t computed) const {
    const int32_t w = windows_[static_cast<size_t>(g)];
    return w == 0 ? 0 : std::max<int64_t>(0, computed - w + 1);
  }
  int32_t* slot(const SimRequest& r, int32_t g, int64_t pos) {
    const BlockId b = kv_.block_ids(r.id, g)[static_cast<size_t>(pos / kBlockSize)];
    EXPECT_NE(b, kNullBlockId) << "request " << r.id << " group " << g << " writes position "
                               << pos << " into a released block";
    return &shadow_[static_cast<size_t>(g)][static_cast<size_t>(b) * kBlockSize + pos % kBlockSize];
  }
  // The executor writes K/V of positions [from, to) of r (committed tokens, or drafts) in the
  // layers of every group.
  void execute(const SimRequest& r, int64_t from, const std::vector<int32_t>& tokens) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      for (size_t i = 0; i < tokens.size(); ++i) *slot(r, g, from + i) = encode(r, tokens[i]);
    }
  }
  // A sliding group holds no block wholly before the window of position `computed`.
  void expect_released(const SimRequest& r, int64_t computed) const {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const std::span<const BlockId> table = kv_.block_ids(r.id, g);
      const auto end = std::min<size_t>(table.size(), first_read(g, computed) / kBlockSize);
      for (size_t i = 0; i < end; ++i) {
        ASSERT_EQ(table[i], kNullBlockId) << "request " << r.id << " group " << g << " entry "
                                          << i << " is out of the window of " << computed;
      }
    }
  }
  // Whether group tables still hold what a fork child of n tokens reads.
  bool can_fork(const SimRequest& parent, int64_t n) const {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const size_t lo = first_read(g, n) / kBlockSize;
      const size_t hi = (n + kBlockSize - 1) / kBlockSize;
      if (lo < hi && kv_.block_ids(parent.id, g)[lo] == kNullBlockId) return false;
    }
    return true;
  }
  size_t pick() { return static_cast<size_t>(uniform(0, static_cast<int64_t>(live_.size()) - 1)); }
  static std::vector<int32_t> slice(const SimRequest& r, int64_t from, int64_t n) {
    return std::vector<int32_t>(r.tokens.begin() + from, r.tokens.begin() + from + n);
  }
  std::vector<int32_t> new_prompt();

  void op_admit();
  void op_step();
  void op_fork();
  void op_truncate();
  void op_finish(bool preempt);
  void finish(size_t index, bool preempt);

  std::mt19937_64 rng_;
  std::vector<int32_t> windows_;
  int32_t num_blocks_;
  KvCacheManager kv_;
  // [num_groups][num_blocks * block_size] encoded token per slot, -1 unwritten
  std::vector<std::vector<int32_t>> shadow_;
  std::vector<SimRequest> live_;
  std::deque<SimRequest> waiting_;  // preempted: tokens kept, computed = 0
  std::deque<std::vector<int32_t>> recent_prompts_;
  KvRequestId next_id_ = 1;
  Coverage cov_;
};

std::vector<int32_t> RandomRun::new_prompt() {
  std::vector<int32_t> p;
  if (!recent_prompts_.empty() && chance(0.5)) {
    const auto& src = recent_prompts_[static_cast<size_t>(uniform(0, recent_prompts_.size() - 1))];
    p.assign(src.begin(), src.begin() + uniform(1, static_cast<int64_t>(src.size())));
  }
  const int64_t extra = uniform(p.empty() ? 1 : 0, 12);
  for (int64_t i = 0; i < extra; ++i) p.push_back(token());
  if (p.size() > 40) p.resize(40);
  return p;
}

void RandomRun::op_admit() {
  if (live_.size() >= kMaxLive) return;
  SimRequest r;
  if (!waiting_.empty() && chance(0.5)) {
    r = waiting_.front();
    waiting_.pop_front();
  } else {
    r.id = next_id_++;
    r.tokens = new_prompt();
    r.salt = chance(0.2) ? 1 : 0;
  }
  const ComputedBlocks hit = kv_.get_computed_blocks(r.view());
  ASSERT_LT(hit.num_computed_tokens, static_cast<int64_t>(r.tokens.size()));
  const int64_t remaining = static_cast<int64_t>(r.tokens.size()) - hit.num_computed_tokens;
  const int64_t chunk = chance(0.5) ? remaining : uniform(1, remaining);
  if (!kv_.allocate_slots(r.view(), chunk, hit, uniform(0, 2))) {
    ASSERT_FALSE(kv_.has_request(r.id));
    ++cov_.rejected;
    if (chance(0.5)) {
      waiting_.push_back(r);  // asked again later: the manager kept its block hashes
    } else {
      kv_.free(r.id);  // given up (an abort while waiting), as the scheduler does
    }
    return;
  }
  kv_.record_prefix_query(r.view(), hit);
  ++cov_.admitted;
  cov_.hit_blocks += hit.num_blocks();
  for (const std::vector<BlockId>& ids : hit.group_block_ids) {
    if (!ids.empty() && ids[0] == kNullBlockId) {
      ++cov_.windowed_hits;
      break;
    }
  }
  r.computed = hit.num_computed_tokens;
  execute(r, r.computed, slice(r, r.computed, chunk));
  r.computed += chunk;
  if (r.computed == static_cast<int64_t>(r.tokens.size())) r.tokens.push_back(token());
  live_.push_back(r);
}

// One scheduler step for one running request: the rest of its prefill (or a chunk) or one
// decode token, plus k draft slots; drafts are written, a random prefix is accepted and the
// rejected ones are rolled back (sometimes right away, sometimes by a later truncate).
void RandomRun::op_step() {
  if (live_.empty()) return;
  const size_t index = pick();
  SimRequest& r = live_[index];
  const int64_t remaining = static_cast<int64_t>(r.tokens.size()) - r.computed;
  const int64_t n = chance(0.7) ? 1 : uniform(1, remaining);
  const int64_t k = uniform(0, 3);
  if (!kv_.allocate_slots(r.view(), n, {}, k)) {
    finish(index, /*preempt=*/true);
    return;
  }
  expect_released(r, r.computed);
  ++cov_.steps;
  execute(r, r.computed, slice(r, r.computed, n));
  r.computed += n;
  if (r.computed < static_cast<int64_t>(r.tokens.size())) return;  // prefill chunk
  std::vector<int32_t> drafts;
  for (int64_t i = 0; i < k; ++i) drafts.push_back(token());
  execute(r, r.computed, drafts);
  const int64_t accepted = uniform(0, k);
  cov_.drafts_rejected += k - accepted;
  r.tokens.insert(r.tokens.end(), drafts.begin(), drafts.begin() + accepted);
  r.computed += accepted;
  r.tokens.push_back(token());  // bonus token: committed, not computed
  if (chance(0.5)) {
    kv_.cache_full_blocks(r.view());
    expect_released(r, r.computed);
  }
  if (chance(0.5)) {
    const int64_t slots = kv_.num_slots(r.id);
    kv_.truncate(r.id, static_cast<int64_t>(r.tokens.size()));
    cov_.truncated_blocks += (slots - kv_.num_slots(r.id)) / kBlockSize;
  }
  if (r.tokens.size() >= kMaxTokens) finish(index, /*preempt=*/false);
}

void RandomRun::op_fork() {
  if (live_.empty() || live_.size() >= kMaxLive) return;
  const SimRequest parent = live_[pick()];
  int64_t n = chance(0.7) ? parent.computed : uniform(0, parent.computed);
  if (!can_fork(parent, n)) n = parent.computed;
  SimRequest child = parent;
  child.id = next_id_++;
  child.computed = n;
  const std::optional<ForkResult> forked = kv_.fork(parent.id, child.id, n);
  if (!forked) {
    ASSERT_FALSE(kv_.has_request(child.id));
    return;
  }
  ++cov_.forks;
  ASSERT_EQ(forked->copies_on_write.size(), n % kBlockSize != 0 ? windows_.size() : 0u);
  for (size_t g = 0; g < forked->copies_on_write.size(); ++g) {
    const BlockCopy& c = forked->copies_on_write[g];
    ASSERT_EQ(c.num_tokens, n % kBlockSize);
    ASSERT_EQ(c.dst_block, kv_.block_ids(child.id, static_cast<int32_t>(g)).back());
    ASSERT_EQ(c.src_block,
              kv_.block_ids(parent.id, static_cast<int32_t>(g))[static_cast<size_t>(n / kBlockSize)]);
    // The executor copies the block in every layer; group g's layers are what matter here.
    for (int32_t i = 0; i < c.num_tokens; ++i) {
      shadow_[g][static_cast<size_t>(c.dst_block) * kBlockSize + i] =
          shadow_[g][static_cast<size_t>(c.src_block) * kBlockSize + i];
    }
  }
  if (!forked->copies_on_write.empty()) ++cov_.copies;
  live_.push_back(child);
}

void RandomRun::op_truncate() {
  if (live_.empty()) return;
  const SimRequest& r = live_[pick()];
  const int64_t slots = kv_.num_slots(r.id);
  const int64_t to = uniform(r.computed, slots);
  kv_.truncate(r.id, to);
  const int64_t expect = std::min<int64_t>(slots, (to + kBlockSize - 1) / kBlockSize * kBlockSize);
  ASSERT_EQ(kv_.num_slots(r.id), expect);
  cov_.truncated_blocks += (slots - expect) / kBlockSize;
}

// Finish (its prompt becomes a source of future prefix hits) or preempt (back to waiting).
void RandomRun::op_finish(bool preempt) {
  if (!live_.empty()) finish(pick(), preempt);
}

void RandomRun::finish(size_t index, bool preempt) {
  SimRequest r = live_[index];
  if (chance(0.5)) {
    kv_.cache_full_blocks(r.view());
    expect_released(r, r.computed);
  }
  kv_.free(r.id);
  ASSERT_FALSE(kv_.has_request(r.id));
  live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(index));
  if (preempt) {
    ++cov_.preempted;
    r.computed = 0;
    waiting_.push_back(r);
  } else {
    ++cov_.finished;
    recent_prompts_.push_back(r.tokens);
    if (recent_prompts_.size() > 16) recent_prompts_.pop_front();
  }
}

void RandomRun::step_once() {
  const int64_t dice = uniform(0, 99);
  if (dice < 22) {
    op_admit();
  } else if (dice < 62) {
    op_step();
  } else if (dice < 70) {
    op_fork();
  } else if (dice < 80) {
    op_truncate();
  } else if (dice < 92) {
    op_finish(/*preempt=*/false);
  } else if (dice < 96) {
    op_finish(/*preempt=*/true);
  } else if (!waiting_.empty()) {
    kv_.free(waiting_.front().id);  // abort of a waiting request: a no-op for the manager
    waiting_.pop_front();
  }
}

void RandomRun::check() const {
  kv_.check_invariants();
  const BlockPool& pool = kv_.block_pool();
  std::vector<int32_t> entries(static_cast<size_t>(num_blocks_), 0);
  std::vector<int32_t> group_of(static_cast<size_t>(num_blocks_), -1);
  ASSERT_EQ(kv_.num_requests(), static_cast<int64_t>(live_.size()));
  for (const SimRequest& r : live_) {
    ASSERT_GE(kv_.num_slots(r.id), r.computed);
    for (int32_t g = 0; g < num_groups(); ++g) {
      const std::span<const BlockId> table = kv_.block_ids(r.id, g);
      ASSERT_EQ(table.size(), kv_.block_ids(r.id).size()) << "request " << r.id << " group " << g;
      const size_t first = first_read(g, r.computed) / kBlockSize;
      for (size_t i = 0; i < table.size(); ++i) {
        const BlockId b = table[i];
        if (b == kNullBlockId) {
          ASSERT_LT(i, first) << "request " << r.id << " group " << g << " entry " << i
                              << ": the null block inside the window";
          continue;
        }
        ASSERT_TRUE(group_of[static_cast<size_t>(b)] == -1 || group_of[static_cast<size_t>(b)] == g)
            << "block " << b << " handed to groups " << group_of[static_cast<size_t>(b)] << " and " << g;
        group_of[static_cast<size_t>(b)] = g;
        ++entries[static_cast<size_t>(b)];
      }
      for (int64_t p = first_read(g, r.computed); p < r.computed; ++p) {
        const BlockId b = table[static_cast<size_t>(p / kBlockSize)];
        ASSERT_EQ(shadow_[static_cast<size_t>(g)][static_cast<size_t>(b) * kBlockSize + p % kBlockSize],
                  encode(r, r.tokens[static_cast<size_t>(p)]))
            << "request " << r.id << " group " << g << " position " << p << " block " << b
            << ": K/V not its own";
      }
    }
    const std::span<const BlockHash> hashes = kv_.block_hashes(r.id);
    ASSERT_LE(static_cast<int64_t>(hashes.size()) * kBlockSize, r.computed);
    BlockHash parent = kRootParentHash;
    for (size_t i = 0; i < hashes.size(); ++i) {
      parent = hash_block_tokens(parent, std::span(r.tokens).subspan(i * kBlockSize, kBlockSize),
                                 BlockHashExtraKeys{kSalts[r.salt], 0}, i == 0);
      ASSERT_EQ(hashes[i], parent) << "request " << r.id << " block " << i;
    }
  }
  int32_t used = 0;
  std::vector<int32_t> group_used(windows_.size(), 0);
  for (BlockId b = 0; b < num_blocks_; ++b) {
    ASSERT_EQ(pool.block(b).ref_cnt, entries[static_cast<size_t>(b)]) << "block " << b;
    if (entries[static_cast<size_t>(b)] == 0) continue;
    ++used;
    ++group_used[static_cast<size_t>(group_of[static_cast<size_t>(b)])];
  }
  const KvCacheStats s = kv_.stats();
  ASSERT_EQ(s.num_used_blocks, used);
  ASSERT_EQ(s.group_used_blocks, group_used);
  ASSERT_EQ(s.num_used_blocks + s.num_cached_free_blocks + s.num_free_uncached_blocks,
            num_blocks_ - 1);
  ASSERT_EQ(kv_.num_free_blocks(), s.num_cached_free_blocks + s.num_free_uncached_blocks);
}

void RandomRun::check_events(bool compare) {
  for (const KvEvent& e : kv_.take_kv_events()) {
    if (e.stored) {
      ASSERT_TRUE(mirror_.insert(e.hash).second) << "stored twice without a removal";
    } else {
      ASSERT_EQ(mirror_.erase(e.hash), 1u) << "removed a hash that was not stored";
    }
  }
  if (!compare) return;
  const BlockPool& pool = kv_.block_pool();
  size_t cached = 0;
  for (BlockId b = 1; b < num_blocks_; ++b) {
    if (!pool.block(b).is_cached) continue;
    ++cached;
    ASSERT_TRUE(mirror_.contains(pool.block(b).block_hash)) << "block " << b;
  }
  ASSERT_EQ(mirror_.size(), cached);
}

struct RunConfig {
  std::vector<int32_t> windows;
  int32_t num_blocks = 0;
};

class KvRandomTest : public testing::TestWithParam<RunConfig> {};

TEST_P(KvRandomTest, InvariantsHoldOverManyOperations) {
  const uint64_t seed = seed_from_env();
  std::fprintf(stderr, "kv random run: seed=%llu (replay with ARBOR_KV_SEED=%llu)\n",
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  const RunConfig& config = GetParam();
  RandomRun run(seed, config.windows, config.num_blocks);
  for (int op = 0; op < kNumOps; ++op) {
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " op=" << op);
    run.step_once();
    ASSERT_FALSE(HasFatalFailure());
    run.check();
    ASSERT_FALSE(HasFatalFailure());
    run.check_events(op % 16 == 0 || op + 1 == kNumOps);
    ASSERT_FALSE(HasFatalFailure());
  }
  // The run must have exercised every path, or it proves little.
  const Coverage& c = run.coverage();
  const KvCacheStats s = run.kv().stats();
  int64_t released = 0;
  for (int64_t r : s.group_released_blocks) released += r;
  std::fprintf(stderr,
               "kv random run: admitted %lld (rejected %lld), hit blocks %lld (windowed hits "
               "%lld), steps %lld, drafts rejected %lld, forks %lld (copies %lld), truncated "
               "blocks %lld, preempted %lld, finished %lld, evictions %lld, released %lld, hit "
               "rate %.3f\n",
               (long long)c.admitted, (long long)c.rejected, (long long)c.hit_blocks,
               (long long)c.windowed_hits, (long long)c.steps, (long long)c.drafts_rejected,
               (long long)c.forks, (long long)c.copies, (long long)c.truncated_blocks,
               (long long)c.preempted, (long long)c.finished, (long long)s.num_evictions,
               (long long)released, s.prefix_hit_rate);
  EXPECT_GT(c.hit_blocks, 1000) << "seed=" << seed;
  EXPECT_GT(c.rejected, 100) << "seed=" << seed;
  EXPECT_GT(c.copies, 100) << "seed=" << seed;
  EXPECT_GT(c.forks - c.copies, 100) << "seed=" << seed;
  EXPECT_GT(c.truncated_blocks, 1000) << "seed=" << seed;
  EXPECT_GT(c.preempted, 100) << "seed=" << seed;
  EXPECT_GT(s.num_evictions, 1000) << "seed=" << seed;
  const bool sliding = std::any_of(config.windows.begin(), config.windows.end(),
                                   [](int32_t w) { return w > 0; });
  if (sliding) {
    EXPECT_GT(released, 10000) << "seed=" << seed;
    EXPECT_GT(c.windowed_hits, 100) << "seed=" << seed;
  }
}

// One full-attention group (every model without sliding layers); full attention with two
// sliding groups of one window and one of another (Gemma 3's shape: several groups of the same
// window); sliding layers only, with the one-token window as an edge case.
INSTANTIATE_TEST_SUITE_P(
    Groups, KvRandomTest,
    testing::Values(RunConfig{{0}, 48}, RunConfig{{0, 6, 6, 13}, 96}, RunConfig{{5, 1}, 48}),
    [](const testing::TestParamInfo<RunConfig>& info) {
      std::string name = "Windows";
      for (int32_t w : info.param.windows) name += "_" + std::to_string(w);
      return name;
    });

}  // namespace
}  // namespace arbor::kv
