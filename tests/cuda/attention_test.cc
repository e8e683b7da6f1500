// CudaForwardOps::attention against kernels::paged_attention (CPU, real ThreadPool) over random
// paged caches (shuffled block ids), and its invariances checked bit for bit: a row alone equals
// the row in a batch (split and unsplit launches), a token tree's row equals a decode of that
// token after its path, a chain mask equals causal. Label gpu.
// Tolerance against the CPU: 3e-5 absolute on outputs of magnitude <= 1 (both f32 online
// softmax; the kernels' own test holds the CPU to 2e-5 of a double reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/thread_pool.h"

namespace arbor::cuda {
namespace {

using kernels::KvDtype;
using testing::all_close;
using testing::bitwise_equal;
using testing::CudaOpsTest;

struct Geometry {
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int block_size = 16;
  KvDtype dtype = KvDtype::kF16;
};

// A sequence: the content id of each of its kv_ids.size() tokens (committed then new), the new
// tokens' query ids, and an optional mask among the new tokens (n * n, row-major).
struct Seq {
  std::vector<int> kv_ids;
  std::vector<int> q_ids;
  std::vector<uint8_t> mask;
};

// Content ids 0..: K/V rows and query rows drawn once per id from `seed`, so equal ids in
// different batches are equal values.
class Contents {
 public:
  Contents(const Geometry& g, uint32_t seed) : g_(g), seed_(seed) {}
  const std::vector<float>& kv(int id, bool value) {
    auto& tbl = value ? v_ : k_;
    return row(tbl, id * 2 + value, (size_t)g_.num_kv_heads * g_.head_dim, g_.dtype == KvDtype::kF16);
  }
  const std::vector<float>& q(int id) {
    return row(q_, 1000003 + id, (size_t)g_.num_q_heads * g_.head_dim, false);
  }

 private:
  const std::vector<float>& row(std::vector<std::vector<float>>& tbl, int key, size_t n,
                                bool f16) {
    const size_t idx = (size_t)(key >= 1000003 ? key - 1000003 : key / 2);
    if (tbl.size() <= idx) tbl.resize(idx + 1);
    if (tbl[idx].empty()) {
      std::mt19937 rng(seed_ * 7919u + (uint32_t)key);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      tbl[idx].resize(n);
      // Queries scaled up so the softmax is far from uniform.
      for (float& x : tbl[idx]) {
        x = dist(rng) * (key >= 1000003 ? 3.0f : 1.0f);
        if (f16) x = fp16_to_fp32(fp32_to_fp16(x));
      }
    }
    return tbl[idx];
  }
  Geometry g_;
  uint32_t seed_;
  std::vector<std::vector<float>> k_, v_, q_;
};

// The batch on the host, ready for both devices.
struct HostBatch {
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<float> q;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, pages, kv_len, mask_indptr{0};
  std::vector<uint8_t> mask_bits;
  bool masked = false;
  int num_tokens = 0;
};

HostBatch build(const Geometry& g, const std::vector<Seq>& seqs, Contents& c, uint32_t seed) {
  HostBatch h;
  int total_blocks = 0;
  for (const Seq& s : seqs) total_blocks += ((int)s.kv_ids.size() + g.block_size - 1) / g.block_size;
  std::vector<int32_t> ids(total_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  const size_t esize = kernels::kv_dtype_size(g.dtype);
  const size_t head_elems = (size_t)g.block_size * g.head_dim;
  h.k_pool.assign(ids.size() * g.num_kv_heads * head_elems * esize, 0);
  h.v_pool = h.k_pool;
  int next = 0;
  size_t mask_bits = 0;
  for (const Seq& s : seqs) h.masked |= !s.mask.empty();
  for (const Seq& s : seqs) {
    const int len = (int)s.kv_ids.size(), n = (int)s.q_ids.size();
    const int blocks = (len + g.block_size - 1) / g.block_size;
    for (int b = 0; b < blocks; ++b) h.pages.push_back(ids[next++]);
    for (int pos = 0; pos < len; ++pos) {
      const int32_t block = h.pages[h.kv_indptr.back() + pos / g.block_size];
      for (int which = 0; which < 2; ++which) {
        const std::vector<float>& row = c.kv(s.kv_ids[pos], which == 1);
        auto& pool = which == 0 ? h.k_pool : h.v_pool;
        for (int hh = 0; hh < g.num_kv_heads; ++hh) {
          for (int d = 0; d < g.head_dim; ++d) {
            const size_t e = ((size_t)block * g.num_kv_heads + hh) * head_elems +
                             (size_t)(pos % g.block_size) * g.head_dim + d;
            const float x = row[hh * g.head_dim + d];
            if (g.dtype == KvDtype::kF16) {
              const uint16_t bits = fp32_to_fp16(x);
              std::memcpy(&pool[e * 2], &bits, 2);
            } else {
              std::memcpy(&pool[e * 4], &x, 4);
            }
          }
        }
      }
    }
    for (int id : s.q_ids) h.q.insert(h.q.end(), c.q(id).begin(), c.q(id).end());
    h.qo_indptr.push_back(h.qo_indptr.back() + n);
    h.kv_indptr.push_back((int32_t)h.pages.size());
    h.kv_len.push_back(len);
    if (!s.mask.empty()) {
      h.mask_bits.resize((mask_bits + s.mask.size() + 7) / 8 + 1, 0);
      for (size_t k = 0; k < s.mask.size(); ++k) {
        if (s.mask[k]) h.mask_bits[(mask_bits + k) / 8] |= (uint8_t)(1u << ((mask_bits + k) % 8));
      }
      mask_bits += s.mask.size();
    }
    h.mask_indptr.push_back((int32_t)mask_bits);
  }
  if (h.mask_bits.empty()) h.mask_bits.push_back(0);
  h.num_tokens = h.qo_indptr.back();
  return h;
}

kernels::PagedAttentionParams params(const Geometry& g, const HostBatch& h) {
  kernels::PagedAttentionParams p;
  p.num_seqs = (int)h.kv_len.size();
  p.num_q_heads = g.num_q_heads;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.block_size = g.block_size;
  p.scale = 1.0f / std::sqrt((float)g.head_dim);
  p.kv_dtype = g.dtype;
  return p;
}

class CudaAttentionTest : public CudaOpsTest {
 protected:
  std::vector<float> run_cpu(const Geometry& g, const HostBatch& h) {
    kernels::PagedAttentionParams p = params(g, h);
    std::vector<float> out(h.q.size());
    p.q = h.q.data();
    p.out = out.data();
    p.k_cache = h.k_pool.data();
    p.v_cache = h.v_pool.data();
    p.qo_indptr = h.qo_indptr.data();
    p.kv_indptr = h.kv_indptr.data();
    p.kv_page_indices = h.pages.data();
    p.kv_len = h.kv_len.data();
    if (h.masked) {
      p.mask_indptr = h.mask_indptr.data();
      p.mask_bits = h.mask_bits.data();
    }
    kernels::ThreadPool pool(4);
    kernels::paged_attention(p, pool);
    return out;
  }
  std::vector<float> run_gpu(const Geometry& g, const HostBatch& h) {
    kernels::PagedAttentionParams p = params(g, h);
    float* out = static_cast<float*>(alloc(h.q.size() * sizeof(float)));
    p.q = upload(h.q);
    p.out = out;
    p.k_cache = upload(h.k_pool);
    p.v_cache = upload(h.v_pool);
    p.qo_indptr = upload(h.qo_indptr);
    p.kv_indptr = upload(h.kv_indptr);
    p.kv_page_indices = upload(h.pages);
    p.kv_len = upload(h.kv_len);
    if (h.masked) {
      p.mask_indptr = upload(h.mask_indptr);
      p.mask_bits = upload(h.mask_bits);
    }
    ops().attention(p);
    return download(out, h.q.size());
  }
  // Rows [first, first + count) of one output ([T, Hq, D]).
  static std::vector<float> rows(const Geometry& g, const std::vector<float>& out, int first,
                                 int count) {
    const size_t row = (size_t)g.num_q_heads * g.head_dim;
    return std::vector<float>(out.begin() + first * row, out.begin() + (first + count) * row);
  }
};

std::vector<int> range_ids(int first, int count) {
  std::vector<int> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A token tree over 6 new tokens: parent of each (root 0); mask(i, j) = j is i or an ancestor.
const int kParent[6] = {-1, 0, 0, 1, 3, 2};
std::vector<uint8_t> tree_mask() {
  std::vector<uint8_t> m(36, 0);
  for (int i = 0; i < 6; ++i) {
    for (int j = i; j >= 0; j = kParent[j]) m[i * 6 + j] = 1;
  }
  return m;
}
std::vector<int> path_of(int i) {
  std::vector<int> p;
  for (int j = i; j >= 0; j = kParent[j]) p.push_back(j);
  std::reverse(p.begin(), p.end());
  return p;
}

// Decode over 3 key chunks, a causal chunk after 700 committed, a token tree, a short decode, a
// sequence with no new token, a prefill from empty: per geometry and KV dtype.
TEST_F(CudaAttentionTest, MatchesTheCpu) {
  // The last: head_dim 18 takes the one-element-per-load path (no 16-byte vectors per row).
  const Geometry geometries[] = {{8, 2, 64, 16, KvDtype::kF16}, {4, 4, 80, 32, KvDtype::kF16},
                                 {16, 2, 128, 16, KvDtype::kF16}, {6, 3, 18, 8, KvDtype::kF16}};
  uint32_t seed = 77;
  for (Geometry g : geometries) {
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kF32}) {
      g.dtype = dt;
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", hq " << g.num_q_heads << ", hkv "
                                        << g.num_kv_heads << ", hd " << g.head_dim << ", f16 "
                                        << (dt == KvDtype::kF16));
      Contents c(g, seed);
      std::vector<Seq> seqs;
      seqs.push_back({range_ids(0, 1300), {0}, {}});
      seqs.push_back({range_ids(2000, 720), range_ids(1, 20), {}});
      seqs.push_back({range_ids(3000, 46), range_ids(30, 6), tree_mask()});
      seqs.push_back({range_ids(4000, 5), {40}, {}});
      seqs.push_back({range_ids(5000, 10), {}, {}});
      seqs.push_back({range_ids(6000, 33), range_ids(50, 33), {}});
      const HostBatch h = build(g, seqs, c, seed);
      EXPECT_TRUE(all_close(run_gpu(g, h), run_cpu(g, h), 3e-5f));
      ++seed;
    }
  }
}

// Each sequence's rows alone (a small launch: split over key chunks) equal its rows in a batch
// with a 300-token prefill (enough blocks that the launch is not split), bit for bit.
TEST_F(CudaAttentionTest, RowsAreBatchInvariant) {
  const Geometry g{8, 2, 64, 16, KvDtype::kF16};
  const uint32_t seed = 91;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Contents c(g, seed);
  const Seq decode{range_ids(0, 1500), {0}, {}};
  const Seq chunk{range_ids(2000, 600), range_ids(1, 9), {}};
  const Seq tree{range_ids(3000, 530), range_ids(20, 6), tree_mask()};
  const Seq prefill{range_ids(4000, 300), range_ids(100, 300), {}};
  const HostBatch big = build(g, {prefill, decode, chunk, tree}, c, seed);
  const std::vector<float> all = run_gpu(g, big);
  const int starts[] = {300, 301, 310};
  const Seq* alone[] = {&decode, &chunk, &tree};
  for (int s = 0; s < 3; ++s) {
    const HostBatch h = build(g, {*alone[s]}, c, seed + 1 + s);  // other block ids too
    const int n = (int)alone[s]->q_ids.size();
    EXPECT_TRUE(bitwise_equal(run_gpu(g, h), rows(g, all, starts[s], n))) << "sequence " << s;
  }
}

// Row i of a token tree after 509 committed tokens (so paths cross the 512-key chunk boundary)
// equals a decode of token i after the committed tokens and its ancestors, bit for bit; and a
// chain mask equals causal.
TEST_F(CudaAttentionTest, TreeRowsEqualDecodesOfTheirPaths) {
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kF32}) {
    const Geometry g{8, 2, 64, 16, dt};
    const uint32_t seed = 123;
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", f16 " << (dt == KvDtype::kF16));
    Contents c(g, seed);
    constexpr int kCommitted = 509;  // tree tokens at logical keys 509.. cross 512
    std::vector<int> kv = range_ids(0, kCommitted);
    const std::vector<int> tree_kv = range_ids(9000, 6), tree_q = range_ids(60, 6);
    kv.insert(kv.end(), tree_kv.begin(), tree_kv.end());
    const HostBatch tree = build(g, {{kv, tree_q, tree_mask()}}, c, seed);
    const std::vector<float> tree_out = run_gpu(g, tree);
    EXPECT_TRUE(all_close(tree_out, run_cpu(g, tree), 3e-5f));
    for (int i = 0; i < 6; ++i) {
      std::vector<int> path_kv = range_ids(0, kCommitted);
      for (int j : path_of(i)) path_kv.push_back(tree_kv[j]);
      const HostBatch dec = build(g, {{path_kv, {tree_q[i]}, {}}}, c, seed + 10 + i);
      EXPECT_TRUE(bitwise_equal(run_gpu(g, dec), rows(g, tree_out, i, 1))) << "tree row " << i;
    }
    // A chain (every new token sees all before it) written as a mask is causal.
    std::vector<uint8_t> chain(36, 0);
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j <= i; ++j) chain[i * 6 + j] = 1;
    }
    const HostBatch masked = build(g, {{kv, tree_q, chain}}, c, seed);
    const HostBatch causal = build(g, {{kv, tree_q, {}}}, c, seed);
    EXPECT_TRUE(bitwise_equal(run_gpu(g, masked), run_gpu(g, causal)));
  }
}

// attention() over the arrays of the last stage() takes its geometry from the host copy; the
// result is the same as through the read-back path of the other tests.
TEST_F(CudaAttentionTest, StagedArraysGiveTheSameResult) {
  const Geometry g{8, 2, 64, 16, KvDtype::kF16};
  const uint32_t seed = 5;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Contents c(g, seed);
  const HostBatch h = build(g, {{range_ids(0, 700), range_ids(1, 3), {}},
                                {range_ids(1000, 40), {9}, {}}}, c, seed);
  const std::vector<float> want = run_gpu(g, h);
  std::vector<int32_t> tokens(h.num_tokens, 1), positions(h.num_tokens, 0),
      slots(h.num_tokens, 0), logits = {0};
  model::ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.qo_indptr = h.qo_indptr;
  b.kv_indptr = h.kv_indptr;
  b.kv_page_indices = h.pages;
  b.kv_len = h.kv_len;
  b.slot_mapping = slots;
  b.logits_indices = logits;
  const model::ForwardBatch s = ops().stage(b);
  kernels::PagedAttentionParams p = params(g, h);
  float* out = static_cast<float*>(alloc(h.q.size() * sizeof(float)));
  p.q = upload(h.q);
  p.out = out;
  p.k_cache = upload(h.k_pool);
  p.v_cache = upload(h.v_pool);
  p.qo_indptr = s.qo_indptr.data();
  p.kv_indptr = s.kv_indptr.data();
  p.kv_page_indices = s.kv_page_indices.data();
  p.kv_len = s.kv_len.data();
  ops().attention(p);
  EXPECT_TRUE(bitwise_equal(download(out, h.q.size()), want));
}

}  // namespace
}  // namespace arbor::cuda
