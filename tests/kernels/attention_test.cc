// Paged attention against the naive reference (contiguous K/V, explicit mask), plus the
// metamorphic checks: chain mask == causal, ragged batch == one at a time, page size 1 ==
// contiguous, split KV == unsplit. Tolerance: 2e-5 absolute on outputs of magnitude ~1 (f32
// online softmax against a double two-pass reference).
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "kernels/attention_internal.h"
#include "kernels/cpu_features.h"
#include "kernels_test_util.h"

namespace arbor::kernels {
namespace {

constexpr float kTol = 2e-5f;

struct SeqSpec {
  int committed = 0;
  int num_new = 1;
  std::vector<uint8_t> mask;  // [num_new * num_new] or empty = causal
};

using Geometry = kernels::testing::AttnGeometry;

// Random sequences written into a paged cache (shuffled block ids), with the contiguous copies
// the reference reads (rounded through F16 when the cache is F16).
class PagedFixture {
 public:
  PagedFixture(const Geometry& g, const std::vector<SeqSpec>& seqs, uint32_t seed)
      : g_(g), seqs_(seqs), seed_(seed), rng_(seed) {
    int total_blocks = 0;
    for (const SeqSpec& s : seqs_) total_blocks += blocks_for(s.committed + s.num_new);
    std::vector<int32_t> ids(total_blocks + 3);  // a few spare blocks stay unused
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    num_blocks_ = (int)ids.size();
    const size_t pool_elems = (size_t)num_blocks_ * g.num_kv_heads * g.block_size * g.head_dim;
    k32_.assign(pool_elems, 0.0f);
    v32_.assign(pool_elems, 0.0f);
    k16_.assign(pool_elems, 0);
    v16_.assign(pool_elems, 0);
    qo_indptr_ = {0};
    kv_indptr_ = {0};
    mask_indptr_ = {0};
    int next_block = 0;
    for (const SeqSpec& s : seqs_) add_sequence(s, ids, next_block);
  }

  // Sliding window and soft-cap (PagedAttentionParams::window, softcap) for params() and
  // reference().
  void set_window(int window, float softcap) {
    window_ = window;
    softcap_ = softcap;
  }
  // Attention sinks (PagedAttentionParams::sinks): [num_q_heads] or empty.
  void set_sinks(std::vector<float> sinks) { sinks_ = std::move(sinks); }

  PagedAttentionParams params(float* out, bool use_masks = true) const {
    PagedAttentionParams p = kernels::testing::attention_params(g_, (int)seqs_.size(), k32_.data(),
                                                       v32_.data(), k16_.data(), v16_.data());
    p.window = window_;
    p.softcap = softcap_;
    if (!sinks_.empty()) p.sinks = sinks_.data();
    p.q = q_.data();
    p.out = out;
    p.qo_indptr = qo_indptr_.data();
    p.kv_indptr = kv_indptr_.data();
    p.kv_page_indices = pages_.data();
    p.kv_len = kv_len_.data();
    if (use_masks && mask_indptr_.back() > 0) {
      p.mask_indptr = mask_indptr_.data();
      p.mask_bits = mask_bits_.data();
    }
    return p;
  }

  size_t out_size() const { return q_.size(); }

  // Reference output of every sequence, concatenated like p.out.
  std::vector<float> reference() const {
    std::vector<float> out(out_size());
    for (size_t b = 0; b < seqs_.size(); ++b) reference_seq((int)b, out.data());
    return out;
  }

  const std::vector<float>& q() const { return q_; }
  const std::vector<int32_t>& qo_indptr() const { return qo_indptr_; }

 private:
  int blocks_for(int n) const { return (n + g_.block_size - 1) / g_.block_size; }
  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(value_rng_); }

  void add_sequence(const SeqSpec& s, const std::vector<int32_t>& ids, int& next_block) {
    // Values depend only on the seed and the sequence's index, not on the block geometry or
    // on the other sequences' lengths.
    value_rng_.seed(seed_ * 1000 + (uint32_t)kv_len_.size());
    const int kv_len = s.committed + s.num_new;
    const int nb = blocks_for(kv_len);
    for (int i = 0; i < nb; ++i) pages_.push_back(ids[next_block++]);
    kv_indptr_.push_back((int32_t)pages_.size());
    qo_indptr_.push_back(qo_indptr_.back() + s.num_new);
    kv_len_.push_back(kv_len);
    const size_t row = (size_t)g_.num_kv_heads * g_.head_dim;
    std::vector<float> kc(kv_len * row), vc(kv_len * row);
    for (int t = 0; t < kv_len; ++t) {
      const int32_t block = pages_[kv_indptr_[kv_indptr_.size() - 2] + t / g_.block_size];
      for (int h = 0; h < g_.num_kv_heads; ++h) {
        for (int d = 0; d < g_.head_dim; ++d) {
          const size_t at = (((size_t)block * g_.num_kv_heads + h) * g_.block_size +
                             t % g_.block_size) * g_.head_dim + d;
          store(kc[t * row + h * g_.head_dim + d], k32_[at], k16_[at]);
          store(vc[t * row + h * g_.head_dim + d], v32_[at], v16_[at]);
        }
      }
    }
    for (size_t i = 0; i < (size_t)s.num_new * g_.num_q_heads * g_.head_dim; ++i) {
      q_.push_back(normal());
    }
    k_contig_.push_back(std::move(kc));
    v_contig_.push_back(std::move(vc));
    const int64_t start = mask_indptr_.back();
    const int64_t bits = (int64_t)s.mask.size();
    mask_bits_.resize((start + bits + 7) / 8 + 1, 0);
    for (int64_t k = 0; k < bits; ++k) {
      if (s.mask[k]) mask_bits_[(start + k) >> 3] |= (uint8_t)(1u << ((start + k) & 7));
    }
    mask_indptr_.push_back((int32_t)(start + bits));
  }

  // One random value, kept exactly as the cache holds it.
  void store(float& contig, float& f32, uint16_t& f16) {
    const float x = normal();
    f16 = fp32_to_fp16(x);
    f32 = x;
    contig = g_.dtype == KvDtype::kF16 ? fp16_to_fp32(f16) : x;
  }

  void reference_seq(int b, float* out) const {
    const SeqSpec& s = seqs_[b];
    const int kv_len = s.committed + s.num_new;
    std::vector<uint8_t> visible((size_t)s.num_new * kv_len);
    for (int i = 0; i < s.num_new; ++i) {
      // The row's position: committed + its depth (a tree row: the new tokens it sees, minus 1).
      int depth = i;
      if (!s.mask.empty()) {
        depth = -1;
        for (int j = 0; j < s.num_new; ++j) depth += s.mask[(size_t)i * s.num_new + j] != 0;
      }
      const int first = window_ > 0 ? s.committed + depth - window_ + 1 : 0;
      for (int k = 0; k < kv_len; ++k) {
        const int j = k - s.committed;
        const bool see = k < s.committed ||
                         (s.mask.empty() ? j <= i : s.mask[(size_t)i * s.num_new + j] != 0);
        // A tree row's window is over its path's logical keys: committed keys by index, its
        // ancestors by depth (an ancestor at depth d sits at committed + d).
        int logical = k;
        if (!s.mask.empty() && k >= s.committed) {
          logical = s.committed - 1;
          for (int a = 0; a <= j; ++a) logical += s.mask[(size_t)j * s.num_new + a] != 0;
        }
        visible[(size_t)i * kv_len + k] = see && logical >= first;
      }
    }
    const size_t qrow = (size_t)g_.num_q_heads * g_.head_dim;
    RefAttentionParams r;
    r.num_q = s.num_new;
    r.num_kv = kv_len;
    r.num_q_heads = g_.num_q_heads;
    r.num_kv_heads = g_.num_kv_heads;
    r.head_dim = g_.head_dim;
    r.scale = 1.0f / std::sqrt((float)g_.head_dim);
    r.softcap = softcap_;
    if (!sinks_.empty()) r.sinks = sinks_.data();
    r.q = q_.data() + qo_indptr_[b] * qrow;
    r.k = k_contig_[b].data();
    r.v = v_contig_[b].data();
    r.visible = visible.data();
    r.out = out + qo_indptr_[b] * qrow;
    attention_ref(r);
  }

  Geometry g_;
  std::vector<SeqSpec> seqs_;
  uint32_t seed_;
  int window_ = 0;
  float softcap_ = 0.0f;
  std::vector<float> sinks_;
  std::mt19937 rng_;  // block ids
  std::mt19937 value_rng_;  // K, V, q
  int num_blocks_ = 0;
  std::vector<float> k32_, v32_, q_;
  std::vector<uint16_t> k16_, v16_;
  std::vector<int32_t> qo_indptr_, kv_indptr_, pages_, kv_len_, mask_indptr_;
  std::vector<uint8_t> mask_bits_;
  std::vector<std::vector<float>> k_contig_, v_contig_;
};

std::vector<float> run_paged(const PagedFixture& f, int threads, bool use_masks = true) {
  std::vector<float> out(f.out_size(), std::nanf(""));
  ThreadPool pool(threads);
  PagedAttentionParams p = f.params(out.data(), use_masks);
  check_paged_attention_params(p);
  paged_attention(p, pool);
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

// A token tree among n new tokens: parent[i] < i (or -1 for a root); bit (i, j) = j is i or an
// ancestor of i.
std::vector<uint8_t> tree_mask(const std::vector<int>& parent) {
  const int n = (int)parent.size();
  std::vector<uint8_t> m((size_t)n * n, 0);
  for (int i = 0; i < n; ++i) {
    for (int j = i; j >= 0; j = parent[j]) m[(size_t)i * n + j] = 1;
  }
  return m;
}

std::vector<uint8_t> chain_mask(int n) {
  std::vector<int> parent(n);
  for (int i = 0; i < n; ++i) parent[i] = i - 1;
  return tree_mask(parent);
}

TEST(AttentionTest, DecodeMatchesReferenceForGqaRatios) {
  for (int ratio : {1, 2, 4, 8}) {
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
      Geometry g{.num_q_heads = 2 * ratio, .num_kv_heads = 2, .head_dim = 32, .block_size = 16,
                 .dtype = dtype};
      PagedFixture f(g, {{0, 1}, {5, 1}, {15, 1}, {16, 1}, {47, 1}, {300, 1}}, 100 + ratio);
      for (int threads : {1, 3}) {
        EXPECT_LT(max_abs_diff(run_paged(f, threads), f.reference()), kTol)
            << "ratio " << ratio << " dtype " << (int)dtype << " threads " << threads;
      }
    }
  }
}

TEST(AttentionTest, CausalPrefillSharingBlockWithCommitted) {
  // 21 committed tokens end mid-block; 40 new tokens fill it and more (3 query tiles).
  for (int ratio : {1, 2, 4, 8}) {
    Geometry g{.num_q_heads = 8, .num_kv_heads = 8 / ratio, .head_dim = 16, .block_size = 8};
    PagedFixture f(g, {{21, 40}, {0, 17}}, 7 + ratio);
    EXPECT_LT(max_abs_diff(run_paged(f, 2), f.reference()), kTol) << "ratio " << ratio;
  }
}

TEST(AttentionTest, ChainMaskEqualsCausalExactly) {
  Geometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = 16, .block_size = 4};
  std::vector<SeqSpec> seqs = {{6, 19, chain_mask(19)}, {0, 5, chain_mask(5)}, {3, 1, {1}}};
  PagedFixture f(g, seqs, 11);
  const std::vector<float> masked = run_paged(f, 2, /*use_masks=*/true);
  const std::vector<float> causal = run_paged(f, 2, /*use_masks=*/false);
  EXPECT_EQ(masked, causal);
  EXPECT_LT(max_abs_diff(masked, f.reference()), kTol);
}

TEST(AttentionTest, TreeMaskInsideBlockSharedWithCommitted) {
  // Block size 8, 5 committed tokens: the tree's first 3 tokens share block 0 with them.
  //        0
  //      /   \         parent: 0:-1 1:0 2:0 3:1 4:1 5:2 6:5 7:3
  //     1     2
  //    / \     \ .
  //   3   4     5
  //   |         |
  //   7         6
  const std::vector<int> parent = {-1, 0, 0, 1, 1, 2, 5, 3};
  Geometry g{.num_q_heads = 4, .num_kv_heads = 1, .head_dim = 8, .block_size = 8};
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
    g.dtype = dtype;
    PagedFixture f(g, {{5, 8, tree_mask(parent)}, {2, 3, {}}}, 21);
    const std::vector<float> got = run_paged(f, 2);
    EXPECT_LT(max_abs_diff(got, f.reference()), kTol);
    // The mask matters: causal attention gives different rows for the tree tokens.
    EXPECT_GT(max_abs_diff(got, run_paged(f, 2, /*use_masks=*/false)), 1e-3f);
  }
}

TEST(AttentionTest, RaggedBatchEqualsOneAtATime) {
  Geometry g{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 16, .block_size = 16};
  const std::vector<SeqSpec> seqs = {
      {0, 9}, {33, 1}, {17, 20, chain_mask(20)}, {64, 1}, {5, 4, tree_mask({-1, 0, 0, 1})}};
  const uint32_t seed = 5;
  PagedFixture all(g, seqs, seed);
  const std::vector<float> batched = run_paged(all, 3);
  EXPECT_LT(max_abs_diff(batched, all.reference()), kTol);
  const size_t qrow = (size_t)g.num_q_heads * g.head_dim;
  for (size_t b = 0; b < seqs.size(); ++b) {
    // Sequence b alone, with the values it has in the batch: pad with empty-valued sequences so
    // it keeps index b (the per-sequence random stream), then compare its rows.
    std::vector<SeqSpec> alone_specs(b, SeqSpec{0, 0});
    alone_specs.push_back(seqs[b]);
    PagedFixture alone(g, alone_specs, seed);
    const std::vector<float> out = run_paged(alone, 1);
    const size_t begin = all.qo_indptr()[b] * qrow, n = seqs[b].num_new * qrow;
    ASSERT_EQ(out.size(), n);
    const std::vector<float> rows(batched.begin() + begin, batched.begin() + begin + n);
    EXPECT_LT(max_abs_diff(rows, out), 1e-6f) << "sequence " << b;
  }
}

TEST(AttentionTest, PageSize1EqualsContiguous) {
  const std::vector<SeqSpec> seqs = {{40, 1}, {10, 12}, {3, 6, tree_mask({-1, 0, 1, 0, 3, 3})}};
  Geometry paged{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = 16, .block_size = 1};
  Geometry contiguous = paged;
  contiguous.block_size = 64;  // every sequence fits in one block
  PagedFixture a(paged, seqs, 9), b(contiguous, seqs, 9);
  ASSERT_EQ(a.q(), b.q());  // same random draws in the same order
  const std::vector<float> out_paged = run_paged(a, 2);
  EXPECT_LT(max_abs_diff(out_paged, run_paged(b, 2)), kTol);
  EXPECT_LT(max_abs_diff(out_paged, a.reference()), kTol);
}

TEST(AttentionTest, SplitKvMatchesUnsplit) {
  // One sequence and one kv head but 4 threads: the kernel splits the 2000 keys into ranges and
  // merges them (flash-decoding); the result must match the single-threaded unsplit run.
  Geometry g{.num_q_heads = 2, .num_kv_heads = 1, .head_dim = 64, .block_size = 16,
             .dtype = KvDtype::kF16};
  PagedFixture f(g, {{1999, 1}}, 3);
  const std::vector<float> split = run_paged(f, 4);
  EXPECT_LT(max_abs_diff(split, run_paged(f, 1)), kTol);
  EXPECT_LT(max_abs_diff(split, f.reference()), kTol);
  PagedFixture multi(g, {{1500, 3, tree_mask({-1, 0, 0})}}, 4);
  EXPECT_LT(max_abs_diff(run_paged(multi, 4), multi.reference()), kTol);
}

TEST(AttentionTest, LargeDecodeBatchMatchesReference) {
  // 9 decode sequences on 2 threads: each gets one item over all its kv heads (with GQA, F16
  // read directly or widened), beside a prefill tile that keeps per-head items.
  const Isa saved = active_isa();
  for (int ratio : {1, 4}) {
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
      Geometry g{.num_q_heads = 4 * ratio, .num_kv_heads = 4, .head_dim = 64, .block_size = 16,
                 .dtype = dtype};
      std::vector<SeqSpec> seqs = {{21, 9}};
      for (int c : {0, 1, 15, 16, 17, 40, 63, 100, 300}) seqs.push_back({c, 1});
      PagedFixture f(g, seqs, 31 + ratio);
      const std::vector<float> ref = f.reference();
      for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (isa > best_isa()) continue;
        set_active_isa(isa);
        EXPECT_LT(max_abs_diff(run_paged(f, 2), ref), kTol)
            << "isa " << isa_name(isa) << " ratio " << ratio << " dtype " << (int)dtype;
      }
    }
  }
  set_active_isa(saved);
}

TEST(AttentionTest, SmallHeadDimLongContextsAndSplits) {
  // head_dim 8 (keys in lanes on AVX-512): contexts over several 512-key chunks, one kv head (a
  // lone decode splits its chunks over the threads and merges them), GQA 8, draft rows after a
  // long context, a tree mask, and a block size that is not a multiple of 16.
  for (int bs : {16, 12}) {
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
      for (int kv_heads : {1, 4}) {
        Geometry g{.num_q_heads = 8 * kv_heads, .num_kv_heads = kv_heads, .head_dim = 8,
                   .block_size = bs, .dtype = dtype};
        const std::vector<int> parent = {-1, 0, 0, 1, 2};
        PagedFixture f(g, {{1100, 1}, {700, 5}, {511, 9}, {40, 5, tree_mask(parent)}, {0, 30}},
                       300 + bs + kv_heads);
        const std::vector<float> ref = f.reference();
        for (int threads : {1, 2, 3}) {
          EXPECT_LT(max_abs_diff(run_paged(f, threads), ref), kTol)
              << "bs " << bs << " dtype " << (int)dtype << " kv heads " << kv_heads
              << " threads " << threads;
        }
      }
    }
  }
}

// One sequence in a paged pool with sequential block ids: K/V rows [kv_len][kv_heads][hd]
// written at slot = index (through F16 when the pool is F16), masks as packed bits.
struct OneSeq {
  kernels::testing::AttnGeometry g;
  std::vector<float> k32, v32;
  std::vector<uint16_t> k16, v16;
  std::vector<int32_t> pages, qo{0, 0}, kv{0, 0}, len{0}, mask_indptr{0, 0};
  std::vector<uint8_t> bits;
  int window = 0;
  float softcap = 0.0f;
  OneSeq(const kernels::testing::AttnGeometry& geo, const std::vector<const float*>& k_rows,
         const std::vector<const float*>& v_rows, int num_new)
      : g(geo) {
    const int kv_len = (int)k_rows.size();
    const int nb = (kv_len + g.block_size - 1) / g.block_size;
    const size_t elems = (size_t)nb * g.num_kv_heads * g.block_size * g.head_dim;
    k32.assign(elems, 0.0f); v32.assign(elems, 0.0f); k16.assign(elems, 0); v16.assign(elems, 0);
    for (int b = 0; b < nb; ++b) pages.push_back(b);
    for (int t = 0; t < kv_len; ++t) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        for (int d = 0; d < g.head_dim; ++d) {
          const size_t at = (((size_t)(t / g.block_size) * g.num_kv_heads + h) * g.block_size +
                             t % g.block_size) * g.head_dim + d;
          const float kx = k_rows[t][h * g.head_dim + d], vx = v_rows[t][h * g.head_dim + d];
          k32[at] = kx; v32[at] = vx;
          k16[at] = fp32_to_fp16(kx); v16[at] = fp32_to_fp16(vx);
        }
      }
    }
    qo[1] = num_new;
    kv[1] = nb;
    len[0] = kv_len;
  }
  void set_mask(const std::vector<uint8_t>& m) {
    bits.assign((m.size() + 7) / 8 + 1, 0);
    for (size_t k = 0; k < m.size(); ++k) if (m[k]) bits[k >> 3] |= (uint8_t)(1u << (k & 7));
    mask_indptr[1] = (int32_t)m.size();
  }
  std::vector<float> run(const std::vector<float>& q, int threads) {
    std::vector<float> out(q.size(), std::nanf(""));
    PagedAttentionParams p = kernels::testing::attention_params(g, 1, k32.data(), v32.data(),
                                                                k16.data(), v16.data());
    p.q = q.data();
    p.out = out.data();
    p.qo_indptr = qo.data();
    p.kv_indptr = kv.data();
    p.kv_page_indices = pages.data();
    p.kv_len = len.data();
    p.window = window;
    p.softcap = softcap;
    if (mask_indptr[1] > 0) {
      p.mask_indptr = mask_indptr.data();
      p.mask_bits = bits.data();
    }
    check_paged_attention_params(p);
    ThreadPool pool(threads);
    paged_attention(p, pool);
    return out;
  }
};

// Token trees are verified in one pass, but each tree row must get exactly the bits a plain
// decode of its token after its path gets (greedy speculation with trees is token for token
// lossless only then): the kernel runs a masked row over its path's own key order. Every ISA,
// head dims 8 (keys in lanes), 24 and 64, block sizes 1, 4, 12 and 16, contexts inside one
// block and across 512-key chunks, F16 and F32, 1 and 3 threads.
TEST(AttentionTest, TreeRowsEqualTheirPathsDecodedBitForBit) {
  const Isa saved = active_isa();
  // 0 is the root (the last committed token); 9 nodes, depth up to 4, siblings at every level.
  const std::vector<int> parent = {-1, 0, 0, 0, 1, 1, 2, 4, 4, 7};
  const int n = (int)parent.size();
  int checked = 0;
  for (int hd : {8, 24, 64}) {
    for (int bs : {1, 4, 12, 16}) {
      for (int committed : {5, 37, 509, 1100}) {
        if (bs == 1 && committed > 600) continue;
        for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
          kernels::testing::AttnGeometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = hd,
                                           .block_size = bs, .dtype = dtype};
          std::mt19937 rng(hd * 100000 + bs * 1000 + committed + (int)dtype);
          std::normal_distribution<float> normal;
          const size_t kv_row = (size_t)g.num_kv_heads * hd, q_row = (size_t)g.num_q_heads * hd;
          std::vector<std::vector<float>> k(committed + n, std::vector<float>(kv_row));
          std::vector<std::vector<float>> v = k;
          for (auto& r : k) for (float& x : r) x = normal(rng);
          for (auto& r : v) for (float& x : r) x = normal(rng);
          std::vector<float> q((size_t)n * q_row);
          for (float& x : q) x = normal(rng);
          std::vector<const float*> kp, vp;
          for (int t = 0; t < committed + n; ++t) { kp.push_back(k[t].data()); vp.push_back(v[t].data()); }
          OneSeq tree(g, kp, vp, n);
          tree.set_mask(tree_mask(parent));
          for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (isa > best_isa()) continue;
            set_active_isa(isa);
            for (int threads : {1, 3}) {
              const std::vector<float> rows = tree.run(q, threads);
              for (int i = 0; i < n; ++i) {
                // The path: committed keys, then root .. i.
                std::vector<int> path;
                for (int j = i; j >= 0; j = parent[j]) path.insert(path.begin(), j);
                std::vector<const float*> pk(kp.begin(), kp.begin() + committed), pv(vp.begin(), vp.begin() + committed);
                for (int j : path) { pk.push_back(kp[committed + j]); pv.push_back(vp[committed + j]); }
                OneSeq decode(g, pk, pv, 1);
                const std::vector<float> qi(q.begin() + i * q_row, q.begin() + (i + 1) * q_row);
                const std::vector<float> want = decode.run(qi, threads);
                const std::vector<float> got(rows.begin() + i * q_row, rows.begin() + (i + 1) * q_row);
                ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * q_row))
                    << "isa " << isa_name(isa) << " hd " << hd << " bs " << bs << " committed "
                    << committed << " dtype " << (int)dtype << " threads " << threads
                    << " row " << i << ": max diff " << max_abs_diff(got, want);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  set_active_isa(saved);
  EXPECT_GT(checked, 1000);
}

// The many-row block ops against their one-row forms, bit for bit (the batch-invariance
// contract: a row's scores and accumulator never depend on the rows tiled beside it). Every ISA,
// head dims that take every chunk tail (16..80, 128, 256; AVX2 / scalar also 24), 1-11 rows
// (every row-group split up to two groups of five and a remainder), 1-20 keys (every key tail),
// both dtypes; accumulate sees rows of all-zero, some-zero and no-zero exponentials, and NaN /
// Inf in the V of keys that rows skip, with and without a rescaling by corr; softmax_rows sees
// first blocks, maxes that stay and grow, and rows with some or every key hidden.
TEST(AttentionBlockOps, ManyRowFormsEqualTheOneRowOpsBitForBit) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa > best_isa()) continue;
    const internal::AttnBlockOps ops = isa == Isa::kAvx512 ? internal::attn_block_ops_avx512()
                                       : isa == Isa::kAvx2 ? internal::attn_block_ops_avx2()
                                                           : internal::attn_block_ops_scalar();
    std::vector<int> dims = {16, 32, 48, 64, 80, 128, 256};
    if (isa != Isa::kAvx512) dims.push_back(24);
    for (int hd : dims) {
      for (bool f16 : {false, true}) {
        for (int rows = 1; rows <= 11; ++rows) {
          const int n = 1 + (rows * 7 + hd) % 20;  // 1..20 over the loop
          std::vector<float> q((size_t)rows * hd), kf((size_t)n * hd), vf((size_t)n * hd);
          for (float& x : q) x = dist(rng);
          for (float& x : kf) x = dist(rng);
          for (float& x : vf) x = dist(rng);
          std::vector<uint16_t> kh(kf.size()), vh(vf.size());
          for (size_t i = 0; i < kf.size(); ++i) {
            kh[i] = fp32_to_fp16(kf[i]);
            vh[i] = fp32_to_fp16(vf[i]);
          }
          const void* k = f16 ? static_cast<const void*>(kh.data()) : kf.data();
          std::vector<const float*> qp(rows);
          for (int r = 0; r < rows; ++r) qp[r] = q.data() + (size_t)r * hd;
          const int stride = n + 3;
          std::vector<float> s_many((size_t)rows * stride, -7.0f), s_one(n);
          ops.scores_rows(qp.data(), rows, k, f16, n, hd, 0.125f, s_many.data(), stride,
                          rows % 2 == 0 ? k : nullptr);
          for (int r = 0; r < rows; ++r) {
            ops.scores(qp[r], k, f16, n, hd, 0.125f, s_one.data());
            ASSERT_EQ(std::memcmp(s_one.data(), s_many.data() + (size_t)r * stride,
                                  sizeof(float) * n), 0)
                << isa_name(isa) << " hd " << hd << " f16 " << f16 << " rows " << rows << " n "
                << n << " row " << r;
            EXPECT_EQ(s_many[(size_t)r * stride + n], -7.0f) << "wrote past n";
          }
          // Exponentials: row 0 all zero, odd rows about a third zero, the rest none.
          std::vector<float> e((size_t)rows * stride);
          for (int r = 0; r < rows; ++r) {
            for (int j = 0; j < n; ++j) {
              const float x = std::exp(dist(rng));
              e[(size_t)r * stride + j] = r == 0 || (r % 2 == 1 && rng() % 3 == 0) ? 0.0f : x;
            }
          }
          // A key no row sees holds NaN in V (a masked slot can hold anything), and one some
          // rows skip an Inf in one column: a skipped key must leave the accumulator untouched,
          // not add 0 * V.
          std::vector<float> vfa = vf;
          std::vector<uint16_t> vha = vh;
          for (int j = 0; j < n; ++j) {
            int zeros = 0;
            for (int r = 0; r < rows; ++r) zeros += e[(size_t)r * stride + j] == 0.0f;
            if (zeros == 0) continue;
            const size_t at = (size_t)j * hd + (zeros == rows ? 0 : j % hd);
            const size_t len = zeros == rows ? hd : 1;
            for (size_t i = at; i < at + len; ++i) {
              vfa[i] = zeros == rows ? NAN : INFINITY;
              vha[i] = zeros == rows ? 0x7E00 : 0x7C00;
            }
          }
          const void* va = f16 ? static_cast<const void*>(vha.data()) : vfa.data();
          std::vector<float> acc_many((size_t)rows * hd);
          for (float& x : acc_many) x = dist(rng);
          std::vector<float> acc_one = acc_many;
          // Every other call rescales the rows first: by 0, exactly 1 and in between.
          std::vector<float> corr(rows);
          for (int r = 0; r < rows; ++r) corr[r] = r % 3 == 0 ? 0.0f : r % 3 == 1 ? 1.0f : 0.37f;
          const bool rescale = (rows + hd) % 2 == 0;
          ops.accumulate_rows(acc_many.data(), rows, e.data(), stride, va, f16, n, hd,
                              rows % 2 == 0 ? va : nullptr, rescale ? corr.data() : nullptr);
          for (int r = 0; r < rows; ++r) {
            float* one = acc_one.data() + (size_t)r * hd;
            if (rescale) {
              for (int c = 0; c < hd; ++c) one[c] *= corr[r];
            }
            ops.accumulate(one, e.data() + (size_t)r * stride, va, f16, n, hd);
            for (int c = 0; c < hd; ++c) {
              ASSERT_FALSE(std::isnan(one[c]))
                  << "a skipped key's NaN reached row " << r << " (" << isa_name(isa) << ")";
            }
          }
          ASSERT_EQ(std::memcmp(acc_one.data(), acc_many.data(), sizeof(float) * acc_one.size()),
                    0)
              << isa_name(isa) << " hd " << hd << " f16 " << f16 << " rows " << rows << " n "
              << n;
        }
      }
    }
    // softmax_rows: the rows at once equal each row alone, bit for bit, and each row is the
    // online-softmax step: max and corr exact where they must be, the exponentials to 1e-6.
    // 1-37 rows: row by row, one or two groups of 16 in lanes, a group and a few rows after it.
    for (int n = 1; n <= 40; ++n) {
      const int rows = 1 + n * 5 % 37, stride = n + 2;
      std::vector<float> s((size_t)rows * stride), m(rows), l(rows);
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < n; ++j) s[(size_t)r * stride + j] = 4.0f * dist(rng);
        // Row kinds: a first block (m = -inf), a max that stays, one that grows, all hidden,
        // some keys hidden, a first block of +0 and -0 only (which zero a max keeps).
        const int kind = (r + n) % 6;
        m[r] = kind == 0 || kind == 5 ? -INFINITY : kind == 1 ? 5.0f : -5.0f;
        l[r] = kind == 0 || kind == 5 ? 0.0f : 2.5f;
        if (kind == 3) std::fill(s.begin() + (size_t)r * stride, s.begin() + (size_t)r * stride + n, -INFINITY);
        if (kind == 4) s[(size_t)r * stride + (size_t)(r % n)] = -INFINITY;
        for (int j = 0; kind == 5 && j < n; ++j) s[(size_t)r * stride + j] = (j + r) % 3 ? -0.0f : 0.0f;
      }
      std::vector<float> s_many = s, m_many = m, l_many = l, corr_many(rows);
      ops.softmax_rows(s_many.data(), rows, stride, n, m_many.data(), l_many.data(),
                       corr_many.data());
      for (int r = 0; r < rows; ++r) {
        std::vector<float> s_one(s.begin() + (size_t)r * stride, s.begin() + (size_t)r * stride + n);
        float m_one = m[r], l_one = l[r], corr_one;
        ops.softmax_rows(s_one.data(), 1, n, n, &m_one, &l_one, &corr_one);
        ASSERT_EQ(std::memcmp(s_one.data(), s_many.data() + (size_t)r * stride, sizeof(float) * n), 0)
            << isa_name(isa) << " n " << n << " row " << r;
        ASSERT_EQ(std::memcmp(&m_one, &m_many[r], sizeof(float)), 0);
        ASSERT_EQ(std::memcmp(&l_one, &l_many[r], sizeof(float)), 0);
        ASSERT_EQ(std::memcmp(&corr_one, &corr_many[r], sizeof(float)), 0);
        // Against the plain step.
        const float* in = s.data() + (size_t)r * stride;
        const float bmax = *std::max_element(in, in + n);
        if (bmax == -INFINITY) {
          EXPECT_EQ(m_one, m[r]);
          EXPECT_EQ(l_one, l[r]);
          EXPECT_EQ(corr_one, 1.0f);
          for (float x : s_one) EXPECT_EQ(x, 0.0f);
          continue;
        }
        const float m_new = std::max(m[r], bmax);
        EXPECT_EQ(m_one, m_new) << isa_name(isa);
        const double want_corr = m[r] == -INFINITY ? 0.0 : std::exp((double)m[r] - m_new);
        if (m_new == m[r]) {
          EXPECT_EQ(corr_one, 1.0f) << "a max that stays rescales nothing";
        }
        EXPECT_NEAR(corr_one, want_corr, 1e-6 * want_corr) << isa_name(isa);
        double sum = 0.0;
        for (int j = 0; j < n; ++j) {
          const double want = in[j] == -INFINITY ? 0.0 : std::exp((double)in[j] - m_new);
          EXPECT_NEAR(s_one[j], want, 1e-6 * want + 1e-30) << isa_name(isa) << " key " << j;
          sum += want;
        }
        EXPECT_NEAR(l_one, l[r] * want_corr + sum, 1e-5 * (l[r] * want_corr + sum)) << isa_name(isa);
      }
    }
  }
}

TEST(AttentionTest, EveryIsaMatchesReference) {
  // head_dim 24 takes the AVX2 block ops even on AVX-512; 64 and 128 the 512-bit ones; 8 the
  // keys-in-lanes kernel on AVX-512. Decode rows (few per item: direct F16 reads) and a prefill
  // tile (widened once) on both dtypes.
  const Isa saved = active_isa();
  for (int hd : {8, 24, 64, 128}) {
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16}) {
      Geometry g{.num_q_heads = 8, .num_kv_heads = 4, .head_dim = hd, .block_size = 16,
                 .dtype = dtype};
      PagedFixture f(g, {{50, 7}, {0, 1}, {37, 1}, {3, 20}}, 13 + hd);
      const std::vector<float> ref = f.reference();
      for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (isa > best_isa()) continue;
        set_active_isa(isa);
        EXPECT_LT(max_abs_diff(run_paged(f, 2), ref), kTol)
            << "isa " << isa_name(isa) << " head_dim " << hd << " dtype " << (int)dtype;
      }
    }
  }
  set_active_isa(saved);
}

// Sliding windows (1 key up to longer than the context) and soft-caps against the reference:
// decode, prefill tiles that start before and after the window, token trees whose rows sit at
// different depths, long contexts split over threads (flash-decoding), every ISA and block sizes
// 1, 4, 12, 16.
TEST(AttentionTest, WindowAndSoftcapMatchReference) {
  const Isa saved = active_isa();
  const std::vector<int> parent = {-1, 0, 0, 1, 2, 4};
  for (int window : {1, 3, 16, 40, 700}) {
    for (float cap : {0.0f, 2.0f}) {
      for (int bs : {1, 4, 12, 16}) {
        for (int hd : {8, 32}) {
          Geometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = hd, .block_size = bs,
                     .dtype = KvDtype::kF16};
          PagedFixture f(g, {{0, 1}, {37, 1}, {5, 30}, {60, 9}, {50, 6, tree_mask(parent)},
                             {bs == 1 ? 300 : 1200, 1}},
                         window * 10 + bs + hd);
          f.set_window(window, cap);
          const std::vector<float> ref = f.reference();
          for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (isa > best_isa()) continue;
            set_active_isa(isa);
            for (int threads : {1, 3}) {
              EXPECT_LT(max_abs_diff(run_paged(f, threads), ref), kTol)
                  << "window " << window << " cap " << cap << " bs " << bs << " hd " << hd
                  << " isa " << isa_name(isa) << " threads " << threads;
            }
          }
        }
      }
    }
  }
  set_active_isa(saved);
}

// Attention sinks (gpt-oss) against the reference: sinks far below the scores (no effect), of
// their size, and far above them (the sink takes almost all the weight, where a sum formed in
// the scores' frame alone would overflow), on decode, prefill, a tree, a window and a long
// context split over threads (the merged partials), every ISA, the lanes kernel (head_dim 8).
// And sinks change the output: the same fixture without them is far from the reference.
TEST(AttentionTest, SinksMatchReference) {
  const Isa saved = active_isa();
  const std::vector<int> parent = {-1, 0, 0, 1, 2, 4};
  for (float level : {-30.0f, 0.5f, 80.0f}) {
    for (int hd : {8, 64}) {
      for (int window : {0, 16}) {
        Geometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = hd, .block_size = 16,
                   .dtype = KvDtype::kF16};
        PagedFixture f(g, {{0, 1}, {37, 1}, {5, 30}, {50, 6, tree_mask(parent)}, {1500, 1}},
                       hd + window);
        f.set_window(window, 0.0f);
        f.set_sinks({level, level + 1.0f, level - 2.0f, level + 0.25f});
        const std::vector<float> ref = f.reference();
        for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
          if (isa > best_isa()) continue;
          set_active_isa(isa);
          for (int threads : {1, 4}) {
            EXPECT_LT(max_abs_diff(run_paged(f, threads), ref), kTol)
                << "sink " << level << " hd " << hd << " window " << window << " isa "
                << isa_name(isa) << " threads " << threads;
          }
        }
        set_active_isa(saved);
        if (level == 0.5f) {  // a sink of the scores' size takes a visible share
          f.set_sinks({});
          EXPECT_GT(max_abs_diff(run_paged(f, 2), ref), 1e-2f) << "hd " << hd;
        }
      }
    }
  }
  set_active_isa(saved);
}

// Under a window every prefill row and every tree row gets exactly the bits of a plain decode of
// its token after its path (the item's reach back and the keys behind the window change nothing):
// windows 1, 5 and 40, with and without a soft-cap, block sizes 1, 4 and 16.
TEST(AttentionTest, WindowedRowsEqualTheirDecodesBitForBit) {
  const std::vector<int> parent = {-1, 0, 0, 1, 1, 3};
  const int n_tree = (int)parent.size(), n_fill = 24, committed = 45;
  int checked = 0;
  for (int window : {1, 5, 40}) {
    for (float cap : {0.0f, 3.0f}) {
      for (int bs : {1, 4, 16}) {
        kernels::testing::AttnGeometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = 32,
                                         .block_size = bs, .dtype = KvDtype::kF16};
        std::mt19937 rng(window * 100 + bs);
        std::normal_distribution<float> normal;
        const size_t kv_row = (size_t)g.num_kv_heads * 32, q_row = (size_t)g.num_q_heads * 32;
        const int total = committed + std::max(n_tree, n_fill);
        std::vector<std::vector<float>> k(total, std::vector<float>(kv_row)), v = k;
        for (auto& r : k) for (float& x : r) x = normal(rng);
        for (auto& r : v) for (float& x : r) x = normal(rng);
        std::vector<float> q((size_t)n_fill * q_row);
        for (float& x : q) x = normal(rng);
        std::vector<const float*> kp, vp;
        for (int t = 0; t < total; ++t) { kp.push_back(k[t].data()); vp.push_back(v[t].data()); }
        auto decode_row = [&](const std::vector<int>& keys, int i) {
          std::vector<const float*> pk, pv;
          for (int t : keys) { pk.push_back(kp[t]); pv.push_back(vp[t]); }
          OneSeq d(g, pk, pv, 1);
          d.window = window;
          d.softcap = cap;
          return d.run(std::vector<float>(q.begin() + i * q_row, q.begin() + (i + 1) * q_row), 2);
        };
        auto expect_row = [&](const std::vector<float>& rows, int i, const std::vector<int>& keys,
                              const char* what) {
          const std::vector<float> want = decode_row(keys, i);
          ASSERT_EQ(0, std::memcmp(rows.data() + i * q_row, want.data(), sizeof(float) * q_row))
              << what << " row " << i << " window " << window << " cap " << cap << " bs " << bs;
          ++checked;
        };
        // A prefill of n_fill tokens after `committed`.
        OneSeq fill(g, std::vector<const float*>(kp.begin(), kp.begin() + committed + n_fill),
                    std::vector<const float*>(vp.begin(), vp.begin() + committed + n_fill), n_fill);
        fill.window = window;
        fill.softcap = cap;
        const std::vector<float> rows = fill.run(q, 2);
        for (int i = 0; i < n_fill; ++i) {
          std::vector<int> keys(committed + i + 1);
          std::iota(keys.begin(), keys.end(), 0);
          expect_row(rows, i, keys, "prefill");
        }
        // A tree of n_tree nodes after `committed`.
        OneSeq tree(g, std::vector<const float*>(kp.begin(), kp.begin() + committed + n_tree),
                    std::vector<const float*>(vp.begin(), vp.begin() + committed + n_tree), n_tree);
        tree.set_mask(tree_mask(parent));
        tree.window = window;
        tree.softcap = cap;
        const std::vector<float> trows = tree.run(
            std::vector<float>(q.begin(), q.begin() + n_tree * q_row), 2);
        for (int i = 0; i < n_tree; ++i) {
          std::vector<int> keys(committed);
          std::iota(keys.begin(), keys.end(), 0);
          std::vector<int> path;
          for (int j = i; j >= 0; j = parent[j]) path.insert(path.begin(), committed + j);
          keys.insert(keys.end(), path.begin(), path.end());
          expect_row(trows, i, keys, "tree");
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 3 * (24 + 6));
}

// The forward plans once per step and layout (plan_paged_attention) and every layer runs with
// that plan: a second "layer" with other q, K/V pools and block tables (another KV cache group)
// but the same layout arrays gets, bit for bit, what planning inside its own call gives. Split
// key chunks (4 threads, long contexts), all-heads decode items (a large decode batch), tree
// masks, windows and every thread count the plan is made for.
TEST(AttentionTest, OnePlanServesEveryLayerOfItsLayout) {
  const std::vector<int> parent = {-1, 0, 0, 1, 2, 4};
  std::vector<SeqSpec> batch = {{1500, 1}, {60, 9}, {50, 6, tree_mask(parent)}};
  for (int c : {0, 17, 40, 100, 300, 33, 64, 90}) batch.push_back({c, 1});
  const std::vector<SeqSpec> lone = {{1500, 1}};  // few items: split over key chunks
  const std::vector<SeqSpec>* layouts[] = {&batch, &lone};
  int split_plans = 0, all_heads_plans = 0;
  for (const std::vector<SeqSpec>* seqs : layouts) {
    for (int window : {0, 16}) {
      for (int threads : {1, 2, 4}) {
        Geometry g{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 32, .block_size = 16,
                   .dtype = KvDtype::kF16};
        PagedFixture layer0(g, *seqs, 71), layer1(g, *seqs, 72);
        layer0.set_window(window, 0.0f);
        layer1.set_window(window, 0.0f);
        ThreadPool pool(threads);
        std::vector<float> planned[2], alone[2];
        PagedAttentionParams p[2];
        for (int l = 0; l < 2; ++l) {
          planned[l].assign(layer0.out_size(), std::nanf(""));
          alone[l].assign(layer0.out_size(), std::nanf(""));
          p[l] = (l == 0 ? layer0 : layer1).params(planned[l].data());
        }
        // Layer 1 reads layer 0's layout arrays (equal contents), as the forward's layers do.
        p[1].qo_indptr = p[0].qo_indptr;
        p[1].kv_len = p[0].kv_len;
        p[1].mask_indptr = p[0].mask_indptr;
        p[1].mask_bits = p[0].mask_bits;
        ASSERT_NE(p[0].kv_page_indices, p[1].kv_page_indices);
        PagedAttentionPlan plan;
        plan_paged_attention(p[0], threads, plan);
        split_plans += !plan.groups.empty();
        all_heads_plans += std::any_of(plan.items.begin(), plan.items.end(),
                                       [](const PagedAttentionPlan::Item& w) { return w.g1 - w.g0 > 1; });
        for (int l = 0; l < 2; ++l) {
          paged_attention(p[l], plan, pool);
          PagedAttentionParams q = p[l];
          q.out = alone[l].data();
          paged_attention(q, pool);
          EXPECT_EQ(0, std::memcmp(planned[l].data(), alone[l].data(),
                                   planned[l].size() * sizeof(float)))
              << "layer " << l << " window " << window << " threads " << threads;
          EXPECT_LT(max_abs_diff(planned[l], (l == 0 ? layer0 : layer1).reference()), kTol);
        }
        EXPECT_GT(max_abs_diff(planned[0], planned[1]), 1e-2f) << "the layers differ";
      }
    }
  }
  EXPECT_GT(split_plans, 0);
  EXPECT_GT(all_heads_plans, 0);
}

TEST(AttentionDeathTest, APlanOfAnotherLayoutIsRefused) {
  Geometry g{.num_q_heads = 4, .num_kv_heads = 2, .head_dim = 16, .block_size = 4};
  PagedFixture f(g, {{10, 3}, {5, 1}}, 3);
  std::vector<float> out(f.out_size());
  const PagedAttentionParams p = f.params(out.data());
  ThreadPool pool(2);
  PagedAttentionPlan plan;
  plan_paged_attention(p, 2, plan);
  PagedAttentionParams windowed = p;
  windowed.window = 4;
  EXPECT_DEATH(paged_attention(windowed, plan, pool), "another layout");
  ThreadPool three(3);
  EXPECT_DEATH(paged_attention(p, plan, three), "another layout");
  std::vector<int32_t> kv_len(p.kv_len, p.kv_len + 2);
  PagedAttentionParams copied = p;
  copied.kv_len = kv_len.data();
  EXPECT_DEATH(paged_attention(copied, plan, pool), "another layout");
}

}  // namespace
}  // namespace arbor::kernels
