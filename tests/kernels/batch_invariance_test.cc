// Batch invariance, bit for bit (docs/kernels.md, "Batch invariance"): a token's matmul output
// and a query row's attention output must not depend on the other rows of the call, on how many
// there are, or on the thread count. Greedy speculative decoding relies on it: verifying k draft
// tokens in one step must give exactly the logits of k one-token decode steps.
//
// matmul: for every weight type with its own kernels (and the generic path), every ISA this CPU
// runs, plain and packed views, 1 and 2 threads: T = 1..17 and 64 tokens in one call give, row
// for row, the bits of each token alone (T = 1, one thread).
// attention: for a sequence with C committed keys (C on both sides of the fixed split chunk) and
// q = 1..9 new rows, alone or between other sequences (a long prefill chunk, decodes), every
// ISA, block sizes 1 and 16, F32/F16 KV, 1 and 2 threads: each row equals, bit for bit, that row
// computed as a lone decode row (C + i committed keys, one new token) on one thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels_test_util.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;
using testing::IsaScope;

// Index of the first differing element (bitwise), or -1.
int64_t first_bit_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  }
  return -1;
}

// ---- matmul ----------------------------------------------------------------------------------

struct MatmulCase {
  GgmlType type;
  int64_t rows, cols;
};

void check_matmul_invariance(const MatmulCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  constexpr int64_t kMaxTokens = 64;
  const std::vector<float> wf = testing::random_floats(rng, c.rows * c.cols);
  const std::vector<float> x = testing::random_floats(rng, kMaxTokens * c.cols);
  const std::vector<uint8_t> data = testing::encode_weights(c.type, wf, c.rows, c.cols);
  const WeightView plain = make_weight_view(c.type, data.data(), c.rows, c.cols);
  WeightView packed_view = plain;
  PackedWeights packed;
  if (packing_available(c.type)) {
    packed = pack_weights(plain);
    packed_view.packed = packed.data();
  }
  ThreadPool p1(1), p2(2);
  std::vector<int64_t> token_counts(34);  // 1..34: every stationary tile and the two-tile split
  std::iota(token_counts.begin(), token_counts.end(), 1);
  token_counts.push_back(kMaxTokens);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (const WeightView* w : {&plain, static_cast<const WeightView*>(&packed_view)}) {
      if (w == &packed_view && packed_view.packed == nullptr) continue;
      // Each token alone, one thread: the reference bits.
      std::vector<float> alone(static_cast<size_t>(kMaxTokens * c.rows));
      for (int64_t t = 0; t < kMaxTokens; ++t) {
        matmul(*w, x.data() + t * c.cols, alone.data() + t * c.rows, 1, p1);
      }
      for (ThreadPool* pool : {&p1, &p2}) {
        for (int64_t nt : token_counts) {
          SCOPED_TRACE(std::string(gguf::ggml_type_name(c.type)) + " rows=" +
                       std::to_string(c.rows) + " cols=" + std::to_string(c.cols) +
                       " isa=" + std::string(isa_name(isa)) +
                       (w == &packed_view ? " packed" : " plain") +
                       " threads=" + std::to_string(pool->num_threads()) +
                       " tokens=" + std::to_string(nt) + " seed=" + std::to_string(seed));
          std::vector<float> y(static_cast<size_t>(nt * c.rows), NAN);
          matmul(*w, x.data(), y.data(), nt, *pool);
          const int64_t at = first_bit_difference(y.data(), alone.data(), nt * c.rows);
          ASSERT_EQ(at, -1) << "token " << at / c.rows << " row " << at % c.rows << ": "
                            << y[at] << " batched vs " << alone[at] << " alone";
        }
      }
    }
  }
}

TEST(BatchInvariance, MatmulEveryTypeIsaTokenCountAndThreadCount) {
  uint32_t seed = 4100;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0}) {
    const bool quant = type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0;
    // 70 rows: partial 4-row tiles and 16-row groups; 262 rows: enough work that one token is
    // split over two threads (row quarters differ per chunk). Float cols leave tails.
    for (int64_t rows : {70, 262}) {
      check_matmul_invariance({type, rows, quant ? 320 : 100}, ++seed);
      if (::testing::Test::HasFatalFailure()) return;
    }
    check_matmul_invariance({type, 33, quant ? 2048 : 1000}, ++seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The affine packed types (the K-quants' rows are multiples of 256).
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,
                        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4}) {
    check_matmul_invariance({type, 70, 512}, ++seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
  check_matmul_invariance({GgmlType::kQ8_1, 70, 256}, ++seed);  // the generic path
}

// ---- attention -------------------------------------------------------------------------------

using kernels::testing::AttnGeometry;

// Random K/V for `len` positions and `q_rows` query rows, standard normal (scores of a few
// units: the softmax is far from uniform, so summation order shows in the low bits).
struct SeqValues {
  int len;
  std::vector<float> k, v;  // [len, num_kv_heads, head_dim]
  std::vector<float> q;     // [q_rows, num_q_heads, head_dim]
  SeqValues(const AttnGeometry& g, int len_, int q_rows, uint32_t seed) : len(len_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    k.resize((size_t)len * g.num_kv_heads * g.head_dim);
    v.resize(k.size());
    q.resize((size_t)q_rows * g.num_q_heads * g.head_dim);
    for (float& f : k) f = n(rng);
    for (float& f : v) f = n(rng);
    for (float& f : q) f = 2.0f * n(rng);
  }
};

// One sequence of a step: sequence `index` of the cache with `committed` keys before its
// `q_rows` new rows q: [q_rows, num_q_heads, head_dim].
struct AttnSeq {
  int index = 0;
  int committed = 0;
  int q_rows = 1;
  const float* q = nullptr;
};

// Every sequence's K/V (all of its `len` positions) in one paged cache on shuffled block ids.
class PagedKv {
 public:
  PagedKv(const AttnGeometry& g, const std::vector<const SeqValues*>& seqs, uint32_t seed)
      : g_(g) {
    const int bs = g.block_size, hd = g.head_dim;
    int total_blocks = 0;
    for (const SeqValues* s : seqs) total_blocks += (s->len + bs - 1) / bs;
    std::vector<int32_t> ids(total_blocks + 2);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    const size_t head_elems = (size_t)bs * hd;
    const size_t pool_elems = ids.size() * g.num_kv_heads * head_elems;
    const bool f16 = g.dtype == KvDtype::kF16;
    k32_.resize(f16 ? 0 : pool_elems);
    v32_.resize(k32_.size());
    k16_.resize(f16 ? pool_elems : 0);
    v16_.resize(k16_.size());
    int next = 0;
    for (const SeqValues* s : seqs) {
      std::vector<int32_t>& table = tables_.emplace_back();
      for (int i = 0; i < (s->len + bs - 1) / bs; ++i) table.push_back(ids[next++]);
      for (int t = 0; t < s->len; ++t) {
        for (int h = 0; h < g.num_kv_heads; ++h) {
          const size_t dst = ((size_t)table[t / bs] * g.num_kv_heads + h) * head_elems +
                             (size_t)(t % bs) * hd;
          const size_t src = ((size_t)t * g.num_kv_heads + h) * hd;
          for (int d = 0; d < hd; ++d) {
            if (f16) {
              k16_[dst + d] = fp32_to_fp16(s->k[src + d]);
              v16_[dst + d] = fp32_to_fp16(s->v[src + d]);
            } else {
              k32_[dst + d] = s->k[src + d];
              v32_[dst + d] = s->v[src + d];
            }
          }
        }
      }
    }
  }

  // paged_attention over `seqs`; out: [total q rows, num_q_heads, head_dim].
  std::vector<float> run(const std::vector<AttnSeq>& seqs, ThreadPool& pool) const {
    const size_t qrow = (size_t)g_.num_q_heads * g_.head_dim;
    std::vector<int32_t> qo{0}, kv_indptr{0}, pages, kv_len;
    std::vector<float> q;
    for (const AttnSeq& s : seqs) {
      const std::vector<int32_t>& table = tables_[s.index];
      pages.insert(pages.end(), table.begin(), table.end());
      kv_indptr.push_back((int32_t)pages.size());
      qo.push_back(qo.back() + s.q_rows);
      kv_len.push_back(s.committed + s.q_rows);
      q.insert(q.end(), s.q, s.q + s.q_rows * qrow);
    }
    std::vector<float> out(q.size(), NAN);
    PagedAttentionParams p = kernels::testing::attention_params(g_, (int)seqs.size(), k32_.data(),
                                                       v32_.data(), k16_.data(), v16_.data());
    p.q = q.data();
    p.out = out.data();
    p.qo_indptr = qo.data();
    p.kv_indptr = kv_indptr.data();
    p.kv_page_indices = pages.data();
    p.kv_len = kv_len.data();
    check_paged_attention_params(p);
    paged_attention(p, pool);
    return out;
  }

 private:
  AttnGeometry g_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<float> k32_, v32_;
  std::vector<uint16_t> k16_, v16_;
};

std::string describe(const AttnGeometry& g, Isa isa) {
  return "isa=" + std::string(isa_name(isa)) + " q_heads=" + std::to_string(g.num_q_heads) +
         " kv_heads=" + std::to_string(g.num_kv_heads) + " head_dim=" +
         std::to_string(g.head_dim) + " block_size=" + std::to_string(g.block_size) +
         (g.dtype == KvDtype::kF16 ? " f16" : " f32");
}

void expect_row_bits(const float* got, const std::vector<float>& want, const std::string& what) {
  const int64_t at = first_bit_difference(got, want.data(), (int64_t)want.size());
  EXPECT_EQ(at, -1) << what << ": element " << at << " is " << (at >= 0 ? got[at] : 0.0f)
                    << ", alone " << (at >= 0 ? want[at] : 0.0f);
}

void check_attention_invariance(const AttnGeometry& g, uint32_t seed) {
  constexpr int kMaxRows = 9;
  const int committed_values[] = {1, 7, 300, 1100};
  ThreadPool p1(1), p2(2);
  const size_t qrow = (size_t)g.num_q_heads * g.head_dim;
  // Sequences 0..3: the ones under test; 4: a prefill chunk of 17 rows (two query tiles) after
  // 520 keys; 5..7: decodes (enough that decode rows get all-heads work items).
  std::vector<SeqValues> values;
  for (int c : committed_values) values.emplace_back(g, c + kMaxRows, kMaxRows, seed + c);
  values.emplace_back(g, 537, 17, seed + 1);
  values.emplace_back(g, 601, 1, seed + 2);
  values.emplace_back(g, 6, 1, seed + 3);
  values.emplace_back(g, 17, 1, seed + 4);
  std::vector<const SeqValues*> ptrs;
  for (const SeqValues& v : values) ptrs.push_back(&v);
  const PagedKv kv(g, ptrs, seed);
  for (int si = 0; si < 4; ++si) {
    const int committed = committed_values[si];
    const float* q = values[si].q.data();
    // Row i computed as a lone decode row with committed + i keys before it, one thread.
    std::vector<std::vector<float>> lone(kMaxRows);
    for (int i = 0; i < kMaxRows; ++i) lone[i] = kv.run({{si, committed + i, 1, q + i * qrow}}, p1);
    for (int rows = 1; rows <= kMaxRows; ++rows) {
      const AttnSeq seq{si, committed, rows, q};
      for (ThreadPool* pool : {&p1, &p2}) {
        const std::string what = "committed=" + std::to_string(committed) + " rows=" +
                                 std::to_string(rows) +
                                 " threads=" + std::to_string(pool->num_threads());
        const std::vector<float> alone = kv.run({seq}, *pool);
        const std::vector<float> mixed = kv.run({{4, 520, 17, values[4].q.data()},
                                                 {5, 600, 1, values[5].q.data()},
                                                 seq,
                                                 {6, 5, 1, values[6].q.data()},
                                                 {7, 16, 1, values[7].q.data()}},
                                                *pool);
        for (int i = 0; i < rows; ++i) {
          const std::string row = ", row " + std::to_string(i);
          expect_row_bits(alone.data() + i * qrow, lone[i], what + " alone" + row);
          expect_row_bits(mixed.data() + (18 + i) * qrow, lone[i], what + " mixed" + row);
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(BatchInvariance, AttentionRowsEqualLoneDecodeRows) {
  uint32_t seed = 900;
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (int bs : {1, 16}) {
      // head_dim 64 takes the AVX-512 block ops where the CPU has them, 24 the AVX2 ones, 8 the
      // keys-in-lanes kernel; one kv head makes a lone sequence on 2 threads split its keys over
      // the threads.
      for (const AttnGeometry& g : {AttnGeometry{8, 2, 64, bs, KvDtype::kF16},
                                    AttnGeometry{4, 1, 24, bs, KvDtype::kF32},
                                    AttnGeometry{16, 2, 8, bs, KvDtype::kF16}}) {
        SCOPED_TRACE(describe(g, isa));
        check_attention_invariance(g, seed += 100);
        if (HasFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace arbor::kernels
