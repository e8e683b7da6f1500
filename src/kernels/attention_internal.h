// Internal to the kernels module: the per-block vector operations of paged attention, one set
// per ISA (scalar and AVX2 in attention.cc, AVX-512 in attention_avx512.cc). attention.cc picks a
// set from active_isa() and calls the one-row ops once per (query row, KV block) and the
// many-row ops once per (kv head's rows, KV block).
#pragma once

#include <cstddef>
#include <cstdint>

namespace arbor::kernels::internal {

struct AttnBlockOps {
  // s[j] = scale * <q, k_j> for j in [0, n). q: [hd] f32; k: n rows of hd elements, F16 when
  // `f16`, else F32, row j at k + j * hd.
  void (*scores)(const float* q, const void* k, bool f16, int n, int hd, float scale, float* s);
  // acc[0, hd) += sum over j in [0, n) with e[j] != 0 of e[j] * v_j (rows laid out like k above).
  // The one-row form that accumulate_rows equals row by row (the block-ops test's reference);
  // paged attention itself, tree rows included, calls accumulate_rows.
  void (*accumulate)(float* acc, const float* e, const void* v, bool f16, int n, int hd);
  // dst[0, n) = src widened to f32.
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  // The online-softmax step of rows [0, rows) over one block: row r's scores at
  // s + r * s_stride, [0, n), already soft-capped and with the keys it does not see at -inf;
  // (m[r], l[r]) its running max and sum. A row whose scores are all -inf sees no key of the
  // block: (m, l) stay, its scores become 0 and corr[r] = 1. Any other row: m_new = max(m,
  // max_j s[j]), corr[r] = exp(m - m_new) (0 while m is -inf; exactly 1 when the max stays),
  // s[j] = exp(s[j] - m_new) (0 for -inf), l = l * corr[r] + sum_j s[j] (the product rounded
  // first), m = m_new. corr[r] is the factor the row's accumulator takes before this block's
  // keys are added (accumulate_rows). Rows are independent: a row's bits never depend on the
  // rows beside it, so the one-row step of a tree row is this op with rows = 1.
  void (*softmax_rows)(float* s, int rows, int s_stride, int n, float* m, float* l, float* corr);
  // The many-row forms: for every row r in [0, rows), bit for bit what the one-row op computes
  // for that row alone, so a row's result does not depend on the rows beside it (batch
  // invariance). AVX-512 loads each K/V row once per group of rows; the others loop the rows.
  // scores_rows: s + r * s_stride = scores(q[r], k, f16, n, hd, scale).
  // `prefetch` (null: none): n rows laid out like k (a later block's) that the op brings into L2
  // while it computes, a few lines per key (AVX-512) or all at its start; the results do not
  // depend on it. Lines fetched at once by the hundred left the core waiting on DRAM; spread
  // over the arithmetic, memory and arithmetic overlap (docs/kernels.md, "Attention").
  void (*scores_rows)(const float* const* q, int rows, const void* k, bool f16, int n, int hd,
                      float scale, float* s, int s_stride, const void* prefetch);
  // accumulate_rows: row r's acc (at acc + r * hd) times corr[r] (one rounded product per
  // element; corr null: no product), then accumulate(acc + r * hd, e + r * e_stride, v, f16, n,
  // hd); `prefetch` as for scores_rows. The product is the online softmax's rescaling, done
  // where the accumulator is in registers anyway.
  void (*accumulate_rows)(float* acc, int rows, const float* e, int e_stride, const void* v,
                          bool f16, int n, int hd, const void* prefetch, const float* corr);
  // True when the many-row ops widen an F16 row once per query row (the scalar and AVX2 loops):
  // items with many rows then widen each block into scratch first. The AVX-512 ops widen each
  // K/V row once per group of rows in registers, so they read the cache directly.
  bool widen_per_row;
};

// Keys in lanes, for head dims too small for a row-per-key dot to pay (hd 8: one FMA per key and
// a horizontal sum per key). One query row against a key chunk transposed to kt, vt:
// [hd][stride] f32, lane j of 16-key group g = key g * 16 + j of the chunk, zero-padded; vis[g] =
// the lanes of group g this row sees. Online softmax over the groups with a running max kept as
// a scalar and the sum and accumulator kept per lane (reduced once at the end): returns the
// chunk's (m, l) and acc: [hd] (m = -inf, l = 0, acc = 0 when no key is visible). The result
// depends only on q, the visible keys and their lanes (batch invariant).
// hd must be kLanesHeadDim.
inline constexpr int kLanesHeadDim = 8;
void lanes_chunk_row_avx512(const float* q, float scale, const float* kt, const float* vt,
                            int stride, int num_groups, const uint16_t* vis, float& m, float& l,
                            float* acc);

// Prefetches [p, p + bytes) into L2, one prefetcht1 per 64-byte line (p null: nothing).
inline void prefetch_l2(const void* p, size_t bytes) {
  if (p == nullptr) return;
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 2);
}

// dst[d * stride + j] = key j's element d, widened, for j in [0, n) and d in [0, kLanesHeadDim):
// n consecutive rows of a cache block (F16 when `f16`, else F32).
void lanes_transpose_avx512(const void* src, bool f16, int n, float* dst, int stride);

AttnBlockOps attn_block_ops_scalar();
AttnBlockOps attn_block_ops_avx2();
// Requires head_dim % 16 == 0 (attention.cc falls back to AVX2 otherwise).
AttnBlockOps attn_block_ops_avx512();

}  // namespace arbor::kernels::internal
