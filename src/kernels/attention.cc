// Paged attention: block-wise online softmax over a paged KV cache. See attention.h.
#include "kernels/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/attention_internal.h"
#include "kernels/cpu_features.h"
#include "kernels/ops.h"

namespace arbor::kernels {
namespace {

// Query tokens per work item. A tile re-reads its sequence's K/V once, so larger tiles read
// less; smaller tiles give more work items for parallelism.
constexpr int kQueryTile = 16;
// Keys are cut into chunks at fixed absolute positions: [0, C), [C, 2C), ... with
// C = split_chunk_keys(block_size). Each chunk gets its own online softmax, and the chunks'
// (max, sum, acc) are folded in key order by fold_partial(), whether one work item runs them
// one after another or several items run them in parallel (flash-decoding) and merge_group()
// folds them afterwards. So a query row's summation order depends only on its own keys: not on
// the batch, the thread count, or how many rows of its sequence run in the step (batch
// invariance, docs/kernels.md).
constexpr int kSplitChunkKeys = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- Vector helpers: AVX2 (+FMA, F16C) and portable scalar twins. ----

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int n) {
  // Two accumulators hide the FMA latency on head_dim 64..128.
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

float dot_scalar(const float* a, const float* b, int n) {
  float r = 0.0f;
  for (int i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

// y += p * x
__attribute__((target("avx2,fma"))) void axpy_avx2(float* y, float p, const float* x, int n) {
  const __m256 vp = _mm256_set1_ps(p);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += p * x[i];
}

void axpy_scalar(float* y, float p, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += p * x[i];
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const uint16_t* src, float* dst,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

void f16_to_f32_scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

// Block operations (attention_internal.h) on top of the row helpers above: F16 rows are widened
// eight elements at a time into a stack buffer, so no path needs the scratch copy.
template <float (*kDot)(const float*, const float*, int), void (*kWiden)(const uint16_t*, float*,
                                                                       int64_t)>
void scores_one(const float* q, const void* k, bool f16, int n, int hd, float scale, float* s) {
  float row[512];
  for (int j = 0; j < n; ++j) {
    const float* kr;
    if (f16 && hd <= 512) {
      kWiden(static_cast<const uint16_t*>(k) + (size_t)j * hd, row, hd);
      kr = row;
    } else if (f16) {
      float acc = 0.0f;
      for (int d = 0; d < hd; ++d) {
        acc += q[d] * fp16_to_fp32(static_cast<const uint16_t*>(k)[(size_t)j * hd + d]);
      }
      s[j] = acc * scale;
      continue;
    } else {
      kr = static_cast<const float*>(k) + (size_t)j * hd;
    }
    s[j] = kDot(q, kr, hd) * scale;
  }
}

template <void (*kAxpy)(float*, float, const float*, int), void (*kWiden)(const uint16_t*, float*,
                                                                        int64_t)>
void accumulate_one(float* acc, const float* e, const void* v, bool f16, int n, int hd) {
  float row[512];
  for (int j = 0; j < n; ++j) {
    if (e[j] == 0.0f) continue;
    if (f16 && hd <= 512) {
      kWiden(static_cast<const uint16_t*>(v) + (size_t)j * hd, row, hd);
      kAxpy(acc, e[j], row, hd);
    } else if (f16) {
      for (int d = 0; d < hd; ++d) {
        acc[d] += e[j] * fp16_to_fp32(static_cast<const uint16_t*>(v)[(size_t)j * hd + d]);
      }
    } else {
      kAxpy(acc, e[j], static_cast<const float*>(v) + (size_t)j * hd, hd);
    }
  }
}

// The many-row ops of the scalar and AVX2 sets: the one-row op, row after row.
// The prefetch hint all at once (these loops are not the ones bound by memory).
template <void (*kScores)(const float*, const void*, bool, int, int, float, float*)>
void scores_each(const float* const* q, int rows, const void* k, bool f16, int n, int hd,
                 float scale, float* s, int s_stride, const void* prefetch) {
  internal::prefetch_l2(prefetch, (size_t)n * hd * (f16 ? 2 : 4));
  for (int r = 0; r < rows; ++r) kScores(q[r], k, f16, n, hd, scale, s + (size_t)r * s_stride);
}

void scale_row(float* x, int n, float c) {
  for (int j = 0; j < n; ++j) x[j] *= c;
}

template <void (*kAccumulate)(float*, const float*, const void*, bool, int, int)>
void accumulate_each(float* acc, int rows, const float* e, int e_stride, const void* v, bool f16,
                     int n, int hd, const void* prefetch, const float* corr) {
  internal::prefetch_l2(prefetch, (size_t)n * hd * (f16 ? 2 : 4));
  for (int r = 0; r < rows; ++r) {
    if (corr != nullptr && corr[r] != 1.0f) scale_row(acc + (size_t)r * hd, hd, corr[r]);
    kAccumulate(acc + (size_t)r * hd, e + (size_t)r * e_stride, v, f16, n, hd);
  }
}

// AttnBlockOps::softmax_rows of the scalar and AVX2 sets: std::exp per element, baseline code
// (no FMA contraction).
void softmax_rows_scalar(float* s, int rows, int s_stride, int n, float* m, float* l, float* corr) {
  for (int r = 0; r < rows; ++r) {
    float* sr = s + (size_t)r * s_stride;
    float bmax = kNegInf;
    for (int j = 0; j < n; ++j) bmax = std::max(bmax, sr[j]);
    if (bmax == kNegInf) {
      std::fill(sr, sr + n, 0.0f);
      corr[r] = 1.0f;
      continue;
    }
    const float m_new = std::max(m[r], bmax);
    corr[r] = m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      sr[j] = sr[j] == kNegInf ? 0.0f : std::exp(sr[j] - m_new);
      sum += sr[j];
    }
    l[r] = l[r] * corr[r] + sum;
    m[r] = m_new;
  }
}

}  // namespace

namespace internal {

AttnBlockOps attn_block_ops_scalar() {
  constexpr auto scores = scores_one<dot_scalar, f16_to_f32_scalar>;
  constexpr auto accumulate = accumulate_one<axpy_scalar, f16_to_f32_scalar>;
  return {scores,       accumulate,           f16_to_f32_scalar, softmax_rows_scalar,
          scores_each<scores>, accumulate_each<accumulate>, /*widen_per_row=*/true};
}

AttnBlockOps attn_block_ops_avx2() {
  constexpr auto scores = scores_one<dot_avx2, f16_to_f32_avx2>;
  constexpr auto accumulate = accumulate_one<axpy_avx2, f16_to_f32_avx2>;
  return {scores,       accumulate,           f16_to_f32_avx2, softmax_rows_scalar,
          scores_each<scores>, accumulate_each<accumulate>, /*widen_per_row=*/true};
}

}  // namespace internal

namespace {

using internal::AttnBlockOps;

AttnBlockOps block_ops(int head_dim) {
  const Isa isa = active_isa();
  if (isa >= Isa::kAvx512 && head_dim % 16 == 0) return internal::attn_block_ops_avx512();
  if (isa >= Isa::kAvx2) return internal::attn_block_ops_avx2();
  return internal::attn_block_ops_scalar();
}

// With block ops that widen F16 per row (AttnBlockOps::widen_per_row), a work item with at least
// this many query rows per kv head (tile tokens x query heads per kv head) widens each F16 block
// once into scratch; smaller items, and the AVX-512 ops, read the cache directly.
constexpr int kWidenRows = 4;

// The chunk length: kSplitChunkKeys rounded down to whole blocks (at least one block), so chunk
// boundaries are block boundaries.
int32_t split_chunk_keys(int block_size) {
  return std::max(1, kSplitChunkKeys / block_size) * block_size;
}

// ---- Work decomposition. ----

// One unit of work (PagedAttentionPlan::Item): query rows [i0, i1) of sequence b against kv
// heads [g0, g1), keys [k0, k1). partial < 0: the item covers all keys its rows can see and
// writes p.out directly; otherwise it covers exactly one key chunk and writes (m, l, acc) per row
// at partial * stride floats of the shared partial buffer (only single-head items are split).
// Decode items of a large batch take every kv head: a block's K (and V) rows of all heads are
// one contiguous run, so the item reads it front to back instead of jumping between 2 KiB pieces
// of many blocks.
using WorkItem = PagedAttentionPlan::Item;
// A query tile split over several KV ranges: items [first_item, first_item + num_splits).
using SplitGroup = PagedAttentionPlan::SplitGroup;
using Plan = PagedAttentionPlan;

int32_t seq_len_q(const PagedAttentionParams& p, int b) {
  return p.qo_indptr[b + 1] - p.qo_indptr[b];
}

// Last key (exclusive) any row of tile [i0, i1) can see.
int32_t tile_key_end(const PagedAttentionParams& p, int b, int32_t i1) {
  const int32_t committed = p.kv_len[b] - seq_len_q(p, b);
  const bool masked = p.mask_indptr != nullptr && p.mask_indptr[b + 1] > p.mask_indptr[b];
  return masked ? p.kv_len[b] : committed + i1;
}

// The first key (block-aligned) any row of tile [i0, i1) of sequence b can see under the sliding
// window; 0 without one. Rows of a masked sequence sit at positions >= committed.
int32_t tile_key_begin(const PagedAttentionParams& p, int b, int32_t i0) {
  if (p.window <= 0) return 0;
  const int32_t committed = p.kv_len[b] - seq_len_q(p, b);
  const bool masked = p.mask_indptr != nullptr && p.mask_indptr[b + 1] > p.mask_indptr[b];
  const int32_t first = (masked ? committed : committed + i0) - p.window + 1;
  return first <= 0 ? 0 : first - first % p.block_size;
}

// Whether decode sequences (one query) get one all-heads item each: only when they alone keep
// every thread busy, so a small batch still spreads its heads over the threads.
bool all_heads_decode(const PagedAttentionParams& p, int num_threads) {
  int64_t decode_seqs = 0;
  for (int b = 0; b < p.num_seqs; ++b) decode_seqs += seq_len_q(p, b) == 1;
  return decode_seqs >= 2 * (int64_t)num_threads && p.num_kv_heads > 1;
}

void build_plan(const PagedAttentionParams& p, int num_threads, Plan& plan) {
  plan.items.clear();
  plan.groups.clear();
  plan.num_partials = 0;
  const bool all_heads = all_heads_decode(p, num_threads);
  const int32_t chunk = split_chunk_keys(p.block_size);
  int64_t base_items = 0;
  for (int b = 0; b < p.num_seqs; ++b) {
    const int32_t n = seq_len_q(p, b);
    base_items += all_heads && n == 1
                      ? 1
                      : (int64_t)p.num_kv_heads * ((n + kQueryTile - 1) / kQueryTile);
  }
  // Split KV only when there are fewer tiles than threads.
  const int64_t want = base_items > 0 && base_items < num_threads
                           ? (num_threads + base_items - 1) / base_items : 1;
  for (int b = 0; b < p.num_seqs; ++b) {
    const int32_t n = seq_len_q(p, b);
    if (all_heads && n == 1) {
      plan.items.push_back(
          {b, 0, p.num_kv_heads, 0, 1, tile_key_begin(p, b, 0), tile_key_end(p, b, 1), -1});
      continue;
    }
    for (int32_t i0 = 0; i0 < n; i0 += kQueryTile) {
      const int32_t i1 = std::min(n, i0 + kQueryTile);
      const int32_t kbegin = tile_key_begin(p, b, i0);
      const int32_t kend = tile_key_end(p, b, i1);
      // Split only at the fixed chunk boundaries, one chunk per item, or not at all: either
      // way the chunks are folded in the same order (see kSplitChunkKeys). Chunks before the
      // window's first block hold no key the tile sees and are left out.
      const int32_t first_chunk = kbegin / chunk;
      const int32_t splits = want > 1 ? (kend + chunk - 1) / chunk - first_chunk : 1;
      for (int g = 0; g < p.num_kv_heads; ++g) {
        if (splits > 1) plan.groups.push_back({(int32_t)plan.items.size(), splits});
        for (int32_t s = 0; s < splits; ++s) {
          const int32_t k0 = splits > 1 ? std::max(kbegin, (first_chunk + s) * chunk) : kbegin;
          const int32_t k1 = splits > 1 ? std::min(kend, (first_chunk + s + 1) * chunk) : kend;
          const int32_t partial = splits > 1 ? plan.num_partials++ : -1;
          plan.items.push_back({b, g, g + 1, i0, i1, k0, k1, partial});
        }
      }
    }
  }
}

// ---- Per-item compute. ----

// Per-thread scratch for one work item.
struct Scratch {
  float* m;      // [rows] this key chunk's running max, sum and accumulator
  float* l;      // [rows]
  float* acc;    // [rows, head_dim]
  float* fm;     // [rows] the earlier chunks folded (fold_partial), items over several chunks
  float* fl;     // [rows]
  float* facc;   // [rows, head_dim]
  float* s;      // [rows, block_size] one block's scores, then exponentials, per row
  float* corr;   // [rows] one block's rescaling of each row's accumulator (softmax_rows)
  float* kbuf;   // [block_size, head_dim]
  float* vbuf;   // [block_size, head_dim]
  // Keys-in-lanes path only (uses_lanes): one key chunk of one head transposed, and the rows'
  // visible lanes per 16-key group.
  float* kt;       // [head_dim, lanes_stride]
  float* vt;       // [head_dim, lanes_stride]
  uint16_t* vis;   // [lanes_stride / 16]
};

// Query rows an item can have: a tile of one kv head's query heads, or one decode token of all.
size_t max_item_rows(const PagedAttentionParams& p) {
  return std::max((size_t)kQueryTile * (p.num_q_heads / p.num_kv_heads), (size_t)p.num_q_heads);
}

// Whether paged_attention() runs the keys-in-lanes kernel (attention_internal.h) for this call.
bool uses_lanes(const PagedAttentionParams& p) {
  return p.head_dim == internal::kLanesHeadDim && active_isa() >= Isa::kAvx512 &&
         p.window <= 0 && p.softcap <= 0.0f;
}

// Floats per transposed row of a key chunk: the chunk rounded up to 16-key groups.
size_t lanes_stride(const PagedAttentionParams& p) {
  return ((size_t)split_chunk_keys(p.block_size) + 15) / 16 * 16;
}

size_t scratch_floats(const PagedAttentionParams& p) {
  const size_t rows = max_item_rows(p);
  const size_t lanes = uses_lanes(p) ? lanes_stride(p) * (2 * (size_t)p.head_dim + 1) : 0;
  return 2 * rows * (2 + p.head_dim) + p.block_size * (rows + 2 * (size_t)p.head_dim) + rows +
         lanes + 64;
}

Scratch carve_scratch(float* base, const PagedAttentionParams& p) {
  const size_t rows = max_item_rows(p);
  Scratch s;
  s.m = base;
  s.l = s.m + rows;
  s.acc = s.l + rows;
  s.fm = s.acc + rows * p.head_dim;
  s.fl = s.fm + rows;
  s.facc = s.fl + rows;
  s.s = s.facc + rows * p.head_dim;
  s.corr = s.s + rows * p.block_size;
  s.kbuf = s.corr + rows;
  s.vbuf = s.kbuf + (size_t)p.block_size * p.head_dim;
  s.kt = s.vbuf + (size_t)p.block_size * p.head_dim;
  s.vt = s.kt;
  s.vis = nullptr;
  if (uses_lanes(p)) {
    const size_t stride = lanes_stride(p);
    s.vt = s.kt + stride * p.head_dim;
    s.vis = reinterpret_cast<uint16_t*>(s.vt + stride * p.head_dim);
  }
  return s;
}

// Rows [block_size, head_dim] of (block_id, kv head g) in `cache`, in the cache's element type.
const void* block_rows(const PagedAttentionParams& p, const void* cache, int32_t block_id, int g) {
  const size_t off = ((size_t)block_id * p.num_kv_heads + g) * p.block_size * p.head_dim;
  return static_cast<const uint8_t*>(cache) + off * kv_dtype_size(p.kv_dtype);
}

constexpr int32_t kPrefetchBlocks = 4;

// Brings `heads` consecutive kv heads' rows [block_size, head_dim] at `rows` into L2
// (prefetcht1): kPrefetchBlocks blocks of K and V would not fit in L1 beside the rows in use.
void prefetch_block(const PagedAttentionParams& p, const void* rows, int heads) {
  internal::prefetch_l2(rows,
                        (size_t)heads * p.block_size * p.head_dim * kv_dtype_size(p.kv_dtype));
}

// Whether new token i sees key k (a logical index of sequence b).
struct Visibility {
  int32_t committed;
  int32_t n;  // new tokens
  const uint8_t* bits;  // null: causal
  int64_t offset;
  bool operator()(int32_t i, int32_t k) const {
    if (k < committed) return true;
    const int32_t j = k - committed;
    return bits == nullptr ? j <= i : mask_bit(bits, offset, n, i, j);
  }
};

Visibility visibility(const PagedAttentionParams& p, int b) {
  Visibility v{p.kv_len[b] - seq_len_q(p, b), seq_len_q(p, b), nullptr, 0};
  if (p.mask_indptr != nullptr && p.mask_indptr[b + 1] > p.mask_indptr[b]) {
    v.bits = p.mask_bits;
    v.offset = p.mask_indptr[b];
  }
  return v;
}

// ---- Token trees: each row in its path's own key order. ----
//
// A row of a sequence with a custom mask sees the committed keys and some new tokens (a token
// tree's ancestors-or-self), which sit in the slots of the whole tree. Attention runs every such
// row over its *logical* keys instead: the committed keys, then the new tokens it sees in slot
// order (for a tree: root, ancestors by depth, itself) at logical indices committed, committed
// + 1, ... So blocks, key chunks and lanes hold exactly the keys a plain decode of that token
// after its path would hold, and the row's bits equal that decode's (greedy speculation with
// trees stays token for token lossless; tests/kernels/attention_test.cc compares them).

// The new tokens row i sees, in order: [count] into `out`; returns count.
int32_t visible_new(const Visibility& vis, int32_t i, int32_t* out) {
  int32_t count = 0;
  for (int32_t j = 0; j < vis.n; ++j) {
    if (mask_bit(vis.bits, vis.offset, vis.n, i, j)) out[count++] = j;
  }
  return count;
}

// The physical key index of logical key k of a row whose visible new tokens are `seen`.
inline int32_t physical_key(const Visibility& vis, const int32_t* seen, int32_t k) {
  return k < vis.committed ? k : vis.committed + seen[k - vis.committed];
}

// Row pointer of physical key k of head g in `cache` (the cache's element type).
const uint8_t* key_row(const PagedAttentionParams& p, const int32_t* table, const void* cache,
                       int g, int32_t k) {
  const auto* block = static_cast<const uint8_t*>(block_rows(p, cache, table[k / p.block_size], g));
  return block + (size_t)(k % p.block_size) * p.head_dim * kv_dtype_size(p.kv_dtype);
}

// Per-row visible-new-token lists of an item's rows [i0, i1): the thread's grow-only scratch.
struct RowLists {
  std::vector<int32_t> seen;   // [(i1 - i0) * n]
  std::vector<int32_t> count;  // [i1 - i0]
  void build(const Visibility& vis, int32_t i0, int32_t i1) {
    seen.resize((size_t)(i1 - i0) * std::max(vis.n, 1));
    count.resize((size_t)(i1 - i0));
    for (int32_t i = i0; i < i1; ++i) {
      count[i - i0] = visible_new(vis, i, seen.data() + (size_t)(i - i0) * vis.n);
    }
  }
  const int32_t* of(int32_t i, int32_t i0, int32_t n) const { return seen.data() + (size_t)(i - i0) * n; }
};

RowLists& row_lists() {
  thread_local RowLists lists;
  return lists;
}

// The first key row i (new token i of its sequence) sees under the sliding window, for a row
// at logical position `pos`; INT32_MIN without a window.
int32_t window_begin(const PagedAttentionParams& p, int32_t pos) {
  return p.window > 0 ? pos - p.window + 1 : std::numeric_limits<int32_t>::min();
}

// Readies one query row's scores s[0, n) of keys [kb0, kb1) of one block for the online-softmax
// step (AttnBlockOps::softmax_rows): soft-caps them and hides keys below win_lo (the row's
// window) and, at or past full_end, the keys `vis` hides. Hidden keys keep their place in the
// block (their scores become -inf), so a row's bits do not depend on where the window starts.
void mask_row(const PagedAttentionParams& p, int32_t kb0, int32_t kb1, int32_t win_lo,
              int32_t full_end, int32_t i, const Visibility& vis, float* s) {
  const int n = kb1 - kb0;
  if (p.softcap > 0.0f) softcap(s, n, p.softcap);
  if (kb0 < win_lo || kb1 > full_end) {
    for (int j = 0; j < n; ++j) {
      if (kb0 + j < win_lo || (kb0 + j >= full_end && !vis(i, kb0 + j))) s[j] = kNegInf;
    }
  }
}

// Online-softmax update of one query row with keys [kb0, kb1) of one block: the many-row ops
// with one row, so a tree row's arithmetic is a plain row's. k and v point at key kb0's row (F16
// when `f16`); see mask_row for the window and visibility.
void update_row(const PagedAttentionParams& p, const float* q, const void* k, const void* v,
                bool f16, int32_t kb0, int32_t kb1, int32_t win_lo, int32_t full_end, int32_t i,
                const Visibility& vis, float& m, float& l, float* acc, float* s,
                const AttnBlockOps& ops) {
  const int n = kb1 - kb0;
  ops.scores(q, k, f16, n, p.head_dim, p.scale, s);
  mask_row(p, kb0, kb1, win_lo, full_end, i, vis, s);
  float corr;
  ops.softmax_rows(s, 1, n, n, &m, &l, &corr);
  ops.accumulate_rows(acc, 1, s, n, v, f16, n, p.head_dim, nullptr, &corr);
}

// Folds a key chunk's partial (m, l, acc) into (fm, fl, facc), the fold of the chunks before it
// (fm = -inf: none yet). Both the chunks of one item and merge_group() go through here, in key
// order, so a split and an unsplit row give the same bits. Baseline code (no FMA contraction).
void fold_partial(float m, float l, const float* acc, int hd, float& fm, float& fl, float* facc) {
  if (m == kNegInf) return;  // the chunk had no key this row sees
  if (fm == kNegInf) {
    fm = m;
    fl = l;
    std::memcpy(facc, acc, sizeof(float) * hd);
    return;
  }
  const float m_new = std::max(fm, m);
  const float a = std::exp(fm - m_new), c = std::exp(m - m_new);
  fl = fl * a + l * c;
  for (int d = 0; d < hd; ++d) facc[d] = facc[d] * a + acc[d] * c;
  fm = m_new;
}

// o = acc / l (zeros for a row that saw no key), where (m, l, acc) is the row's fold over its
// keys; with a sink logit (sink != null) the denominator gains exp(*sink - m), counted in the
// frame of max(m, *sink) so that a large sink cannot overflow.
void write_row(float m, float l, const float* acc, int hd, const float* sink, float* o) {
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (sink != nullptr && l > 0.0f) {
    const float m_all = std::max(m, *sink);
    const float a = std::exp(m - m_all);
    inv = a / (l * a + std::exp(*sink - m_all));
  }
  for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
}

// Starts a key chunk: every row's (m, l, acc) empty.
void reset_rows(const Scratch& sc, int32_t rows, int hd) {
  std::fill(sc.m, sc.m + rows, kNegInf);
  std::fill(sc.l, sc.l + rows, 0.0f);
  std::fill(sc.acc, sc.acc + (size_t)rows * hd, 0.0f);
}

// Ends a key chunk of an item that spans several: folds each row's chunk into (fm, fl, facc).
void fold_rows(const Scratch& sc, int32_t rows, int hd) {
  for (int32_t row = 0; row < rows; ++row) {
    fold_partial(sc.m[row], sc.l[row], sc.acc + (size_t)row * hd, hd, sc.fm[row], sc.fl[row],
                 sc.facc + (size_t)row * hd);
  }
}

// Writes an item's rows: (m, l, acc) into the partial buffer for a split item, else acc / l into
// p.out. The rows' results are in sc.m/l/acc (one chunk) or sc.fl/facc (folded chunks).
void finish_item(const PagedAttentionParams& p, const WorkItem& w, const Scratch& sc,
                 bool multi_chunk, float* partials) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int32_t per_head = (w.i1 - w.i0) * r;
  const int32_t rows = per_head * (w.g1 - w.g0);
  const int64_t q_row0 = p.qo_indptr[w.b] + w.i0;
  // One chunk: (m, l, acc) is the whole result (fold_partial of one chunk is a copy).
  const float* ms = multi_chunk ? sc.fm : sc.m;
  const float* ls = multi_chunk ? sc.fl : sc.l;
  const float* accs = multi_chunk ? sc.facc : sc.acc;
  for (int32_t row = 0; row < rows; ++row) {
    const float* a = accs + (size_t)row * hd;
    if (w.partial >= 0) {  // single-head, single-chunk items only (heads == 1, row < per_head)
      float* dst = partials + ((size_t)w.partial * kQueryTile * r + row) * (hd + 2);
      dst[0] = sc.m[row];
      dst[1] = sc.l[row];
      std::memcpy(dst + 2, a, sizeof(float) * hd);
      continue;
    }
    const int32_t in_head = row % per_head;
    const int32_t i = w.i0 + in_head / r, h = (w.g0 + row / per_head) * r + in_head % r;
    write_row(ms[row], ls[row], a, hd, p.sinks != nullptr ? p.sinks + h : nullptr,
              p.out + ((q_row0 + i - w.i0) * p.num_q_heads + h) * hd);
  }
}

// A block holding new tokens of a masked sequence: each row over its own logical keys
// [kb0, min(block end, item end, its end)), gathered (widened to f32) into kbuf / vbuf.
void run_tree_block(const PagedAttentionParams& p, const WorkItem& w, const Scratch& sc,
                    const Visibility& vis, const RowLists& lists, const int32_t* table,
                    int32_t kbase, int32_t kb0, const AttnBlockOps& ops) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int32_t per_head = (w.i1 - w.i0) * r;
  const int64_t q_row0 = p.qo_indptr[w.b] + w.i0;
  const bool f16 = p.kv_dtype == KvDtype::kF16;
  for (int gi = 0; gi < w.g1 - w.g0; ++gi) {
    const int g = w.g0 + gi;
    for (int32_t i = w.i0; i < w.i1; ++i) {
      const int32_t* seen = lists.of(i, w.i0, vis.n);
      const int32_t end = vis.committed + lists.count[i - w.i0];
      const int32_t kb1 = std::min({kbase + p.block_size, w.k1, end});
      if (kb1 <= kb0) continue;
      for (int32_t k = kb0; k < kb1; ++k) {
        const int32_t phys = physical_key(vis, seen, k);
        float* kd = sc.kbuf + (size_t)(k - kb0) * hd;
        float* vd = sc.vbuf + (size_t)(k - kb0) * hd;
        const uint8_t* ks = key_row(p, table, p.k_cache, g, phys);
        const uint8_t* vs = key_row(p, table, p.v_cache, g, phys);
        if (f16) {
          ops.f16_to_f32(reinterpret_cast<const uint16_t*>(ks), kd, hd);
          ops.f16_to_f32(reinterpret_cast<const uint16_t*>(vs), vd, hd);
        } else {
          std::memcpy(kd, ks, sizeof(float) * hd);
          std::memcpy(vd, vs, sizeof(float) * hd);
        }
      }
      // The row's own position on its path is its last logical key.
      const int32_t win_lo = window_begin(p, end - 1);
      for (int hh = 0; hh < r; ++hh) {
        const int32_t row = gi * per_head + (i - w.i0) * r + hh;
        const float* q = p.q + ((q_row0 + i - w.i0) * p.num_q_heads + g * r + hh) * hd;
        update_row(p, q, sc.kbuf, sc.vbuf, false, kb0, kb1, win_lo, kb1, i, vis, sc.m[row],
                   sc.l[row], sc.acc + (size_t)row * hd, sc.s, ops);
      }
    }
  }
}

// Rows of an item: head gi (of g0..g1), token i, query head hh at
// gi * per_head + (i - i0) * r + hh, per_head = (i1 - i0) * r.
void run_item(const PagedAttentionParams& p, const WorkItem& w, const Scratch& sc, float* partials,
              const AttnBlockOps& ops) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int heads = w.g1 - w.g0;
  const int32_t per_head = (w.i1 - w.i0) * r;
  const int32_t rows = per_head * heads;
  reset_rows(sc, rows, hd);
  // An item over several key chunks folds each into (fm, fl, facc) when the next one starts.
  const int32_t chunk = split_chunk_keys(p.block_size);
  const bool multi_chunk = w.k0 / chunk != (w.k1 - 1) / chunk;
  if (multi_chunk) {  // a row that sees no key at all keeps l = 0 and writes zeros
    std::fill(sc.fm, sc.fm + rows, kNegInf);
    std::fill(sc.fl, sc.fl + rows, 0.0f);
    std::fill(sc.facc, sc.facc + (size_t)rows * hd, 0.0f);
  }
  const Visibility vis = visibility(p, w.b);
  // Keys below full_end are visible to every row of the tile: no per-key mask test.
  const int32_t full_end = vis.bits ? vis.committed : vis.committed + w.i0 + 1;
  const int32_t* table = p.kv_page_indices + p.kv_indptr[w.b];
  const int64_t q_row0 = p.qo_indptr[w.b] + w.i0;
  const bool f16 = p.kv_dtype == KvDtype::kF16;
  RowLists& lists = row_lists();
  if (vis.bits) lists.build(vis, w.i0, w.i1);
  // q of row gi * per_head + (i - i0) * r + hh: token i, query head (g0 + gi) * r + hh.
  thread_local std::vector<const float*> q_rows;
  q_rows.resize(rows);
  for (int32_t row = 0; row < rows; ++row) {
    const int32_t in_head = row % per_head, h = (w.g0 + row / per_head) * r + in_head % r;
    q_rows[row] = p.q + ((q_row0 + in_head / r) * p.num_q_heads + h) * hd;
  }
  // Widen each block once, then read f32 (the block ops' direct F16 reads stop at hd 512).
  const bool widen = f16 && ((ops.widen_per_row && per_head >= kWidenRows) || hd > 512);
  const size_t elem = widen ? sizeof(float) : kv_dtype_size(p.kv_dtype);
  const int32_t first_kbase = w.k0 - w.k0 % p.block_size;
  for (int32_t kbase = first_kbase; kbase < w.k1; kbase += p.block_size) {
    const int32_t kb0 = std::max(kbase, w.k0), kb1 = std::min(kbase + p.block_size, w.k1);
    if (multi_chunk && kbase > first_kbase && kbase % chunk == 0) {
      fold_rows(sc, rows, hd);
      reset_rows(sc, rows, hd);
    }
    if (vis.bits && kbase + p.block_size > vis.committed) {
      run_tree_block(p, w, sc, vis, lists, table, kbase, kb0, ops);
      continue;
    }
    const int32_t block_id = table[kbase / p.block_size];
    // Blocks are scattered, so the hardware prefetcher cannot run ahead: fetch the K and V rows
    // kPrefetchBlocks ahead (the first block also fetches the ones before that). One block's
    // compute is shorter than a DRAM miss, so one block ahead was not enough. The block
    // kPrefetchBlocks ahead goes to the block ops, which spread its lines over their keys (the
    // widening path fetches it here, at once).
    const int32_t bi = kbase / p.block_size;
    const int32_t last = (w.k1 - 1) / p.block_size;
    const int32_t far = bi + kPrefetchBlocks <= last ? table[bi + kPrefetchBlocks] : -1;
    for (int32_t ahead = kbase == first_kbase ? 1 : kPrefetchBlocks; ahead <= kPrefetchBlocks;
         ++ahead) {
      if (bi + ahead > last || (ahead == kPrefetchBlocks && !widen)) break;
      const int32_t next = table[bi + ahead];
      prefetch_block(p, block_rows(p, p.k_cache, next, w.g0), heads);
      prefetch_block(p, block_rows(p, p.v_cache, next, w.g0), heads);
    }
    for (int gi = 0; gi < heads; ++gi) {
      const int g = w.g0 + gi;
      const void* k = block_rows(p, p.k_cache, block_id, g);
      const void* v = block_rows(p, p.v_cache, block_id, g);
      if (widen) {
        const int64_t count = (int64_t)(kb1 - kbase) * hd;
        ops.f16_to_f32(static_cast<const uint16_t*>(k), sc.kbuf, count);
        ops.f16_to_f32(static_cast<const uint16_t*>(v), sc.vbuf, count);
        k = sc.kbuf;
        v = sc.vbuf;
      }
      // Key kb0's row.
      const size_t skip = (size_t)(kb0 - kbase) * hd * elem;
      const void* k0 = static_cast<const uint8_t*>(k) + skip;
      const void* v0 = static_cast<const uint8_t*>(v) + skip;
      // The head's rows together: scores, each row's softmax step, then the accumulation.
      const int32_t head_row = gi * per_head;
      const bool f16_rows = f16 && !widen;
      const bool spread = !widen && far >= 0;
      ops.scores_rows(q_rows.data() + head_row, per_head, k0, f16_rows, kb1 - kb0, hd, p.scale,
                      sc.s, p.block_size, spread ? block_rows(p, p.k_cache, far, g) : nullptr);
      for (int32_t i = w.i0; i < w.i1; ++i) {
        // A tree row's position is its depth on its path; a plain row's is committed + i.
        const int32_t pos = vis.bits ? vis.committed + lists.count[i - w.i0] - 1 : vis.committed + i;
        const int32_t win_lo = window_begin(p, pos);
        for (int hh = 0; hh < r; ++hh) {
          const int32_t in_head = (i - w.i0) * r + hh;
          mask_row(p, kb0, kb1, win_lo, full_end, i, vis, sc.s + (size_t)in_head * p.block_size);
        }
      }
      ops.softmax_rows(sc.s, per_head, p.block_size, kb1 - kb0, sc.m + head_row, sc.l + head_row,
                       sc.corr);
      ops.accumulate_rows(sc.acc + (size_t)head_row * hd, per_head, sc.s, p.block_size, v0,
                          f16_rows, kb1 - kb0, hd,
                          spread ? block_rows(p, p.v_cache, far, g) : nullptr, sc.corr);
    }
  }
  if (multi_chunk) fold_rows(sc, rows, hd);
  finish_item(p, w, sc, multi_chunk, partials);
}

// ---- Keys in lanes (head_dim kLanesHeadDim on AVX-512; attention_internal.h). ----

// Transposes keys [kf, kl) of head g (chunk starting at c0) into sc.kt / sc.vt, lane = key - c0;
// lanes of the chunk's groups outside [kf, kl) are zero.
void lanes_transpose_chunk(const PagedAttentionParams& p, const int32_t* table, int g, int32_t c0,
                           int32_t kf, int32_t kl, int stride, const Scratch& sc) {
  const int hd = p.head_dim;
  const int32_t lanes = (kl - c0 + 15) / 16 * 16;
  for (int d = 0; d < hd; ++d) {
    std::fill(sc.kt + (size_t)d * stride, sc.kt + (size_t)d * stride + (kf - c0), 0.0f);
    std::fill(sc.vt + (size_t)d * stride, sc.vt + (size_t)d * stride + (kf - c0), 0.0f);
    std::fill(sc.kt + (size_t)d * stride + (kl - c0), sc.kt + (size_t)d * stride + lanes, 0.0f);
    std::fill(sc.vt + (size_t)d * stride + (kl - c0), sc.vt + (size_t)d * stride + lanes, 0.0f);
  }
  const bool f16 = p.kv_dtype == KvDtype::kF16;
  const size_t elem = kv_dtype_size(p.kv_dtype);
  for (int32_t kbase = kf - kf % p.block_size; kbase < kl; kbase += p.block_size) {
    const int32_t kb0 = std::max(kbase, kf), kb1 = std::min(kbase + p.block_size, kl);
    const int32_t block_id = table[kbase / p.block_size];
    const size_t skip = (size_t)(kb0 - kbase) * hd * elem;
    const auto* k = static_cast<const uint8_t*>(block_rows(p, p.k_cache, block_id, g)) + skip;
    const auto* v = static_cast<const uint8_t*>(block_rows(p, p.v_cache, block_id, g)) + skip;
    internal::lanes_transpose_avx512(k, f16, kb1 - kb0, sc.kt + (kb0 - c0), stride);
    internal::lanes_transpose_avx512(v, f16, kb1 - kb0, sc.vt + (kb0 - c0), stride);
  }
}

// vis[gr] = the lanes of 16-key group gr (keys c0 + 16 gr + j) that new token i sees among keys
// [kf, kl); keys below full_end are visible to every row.
void lanes_visibility(const Visibility& vis, int32_t i, int32_t c0, int32_t kf, int32_t kl,
                      int32_t full_end, int num_groups, uint16_t* out) {
  for (int gr = 0; gr < num_groups; ++gr) {
    const int32_t g0 = c0 + 16 * gr, g1 = g0 + 16;
    if (g0 >= kf && g1 <= std::min(kl, full_end)) {
      out[gr] = 0xFFFF;
      continue;
    }
    uint16_t bits = 0;
    for (int j = 0; j < 16; ++j) {
      const int32_t k = g0 + j;
      if (k >= kf && k < kl && (k < full_end || vis(i, k))) bits |= (uint16_t)(1u << j);
    }
    out[gr] = bits;
  }
}

// A row of a masked sequence in a chunk holding new tokens: writes the new tokens it sees at
// their logical lanes (after the committed keys lanes_transpose_chunk put in), zeroes the lanes
// after them up to the 16-key group, sets sc.vis to its keys [kf, end) and returns its number of
// groups (0: it sees no key of this chunk). The lanes then hold what a plain decode of the row's
// token after its path would hold.
int lanes_tree_row(const PagedAttentionParams& p, const int32_t* table, int g, int32_t c0,
                   int32_t kf, int32_t kl, const Visibility& vis, const int32_t* seen,
                   int32_t count, int stride, const Scratch& sc) {
  const int32_t end = std::min(kl, vis.committed + count);
  if (end <= kf) return 0;
  const bool f16 = p.kv_dtype == KvDtype::kF16;
  for (int32_t k = std::max(kf, vis.committed); k < end; ++k) {
    const int32_t phys = physical_key(vis, seen, k);
    internal::lanes_transpose_avx512(key_row(p, table, p.k_cache, g, phys), f16, 1,
                                     sc.kt + (k - c0), stride);
    internal::lanes_transpose_avx512(key_row(p, table, p.v_cache, g, phys), f16, 1,
                                     sc.vt + (k - c0), stride);
  }
  const int groups = (end - c0 + 15) / 16;
  for (int d = 0; d < p.head_dim; ++d) {
    std::fill(sc.kt + (size_t)d * stride + (end - c0), sc.kt + (size_t)d * stride + groups * 16,
              0.0f);
    std::fill(sc.vt + (size_t)d * stride + (end - c0), sc.vt + (size_t)d * stride + groups * 16,
              0.0f);
  }
  for (int gr = 0; gr < groups; ++gr) {
    uint16_t bits = 0;
    for (int j = 0; j < 16; ++j) {
      const int32_t k = c0 + 16 * gr + j;
      if (k >= kf && k < end) bits |= (uint16_t)(1u << j);
    }
    sc.vis[gr] = bits;
  }
  return groups;
}

// run_item's twin for the keys-in-lanes kernel: per head of the item and key chunk, the chunk's
// K and V are transposed once, then every row of that head runs over them; chunks fold in key
// order exactly as in run_item.
void run_item_lanes(const PagedAttentionParams& p, const WorkItem& w, const Scratch& sc,
                    float* partials) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int heads = w.g1 - w.g0;
  const int32_t per_head = (w.i1 - w.i0) * r;
  const int32_t rows = per_head * heads;
  const int32_t chunk = split_chunk_keys(p.block_size);
  const bool multi_chunk = w.k0 / chunk != (w.k1 - 1) / chunk;
  if (multi_chunk) {
    std::fill(sc.fm, sc.fm + rows, kNegInf);
    std::fill(sc.fl, sc.fl + rows, 0.0f);
    std::fill(sc.facc, sc.facc + (size_t)rows * hd, 0.0f);
  }
  const Visibility vis = visibility(p, w.b);
  const int32_t full_end = vis.bits ? vis.committed : vis.committed + w.i0 + 1;
  const int32_t* table = p.kv_page_indices + p.kv_indptr[w.b];
  const int64_t q_row0 = p.qo_indptr[w.b] + w.i0;
  const int stride = (int)lanes_stride(p);
  RowLists& lists = row_lists();
  if (vis.bits) lists.build(vis, w.i0, w.i1);
  for (int gi = 0; gi < heads; ++gi) {
    const int g = w.g0 + gi;
    for (int32_t c0 = w.k0 - w.k0 % chunk; c0 < w.k1; c0 += chunk) {
      const int32_t kf = std::max(c0, w.k0), kl = std::min(c0 + chunk, w.k1);
      const bool tree_chunk = vis.bits && kl > vis.committed;
      // A chunk holding new tokens of a masked sequence: the committed keys are shared, each
      // row adds the new tokens it sees at their logical lanes (lanes_tree_row).
      lanes_transpose_chunk(p, table, g, c0, kf, tree_chunk ? std::max(kf, vis.committed) : kl,
                            stride, sc);
      const int num_groups = (kl - c0 + 15) / 16;
      for (int32_t i = w.i0; i < w.i1; ++i) {
        int row_groups = num_groups;
        if (tree_chunk) {
          row_groups = lanes_tree_row(p, table, g, c0, kf, kl, vis, lists.of(i, w.i0, vis.n),
                                      lists.count[i - w.i0], stride, sc);
        } else {
          lanes_visibility(vis, i, c0, kf, kl, full_end, num_groups, sc.vis);
        }
        for (int hh = 0; hh < r; ++hh) {
          const int32_t row = gi * per_head + (i - w.i0) * r + hh;
          const float* q = p.q + ((q_row0 + i - w.i0) * p.num_q_heads + g * r + hh) * hd;
          float* acc = sc.acc + (size_t)row * hd;
          if (row_groups == 0) {  // the row sees no key of this chunk
            sc.m[row] = kNegInf;
            sc.l[row] = 0.0f;
            std::fill(acc, acc + hd, 0.0f);
          } else {
            internal::lanes_chunk_row_avx512(q, p.scale, sc.kt, sc.vt, stride, row_groups, sc.vis,
                                             sc.m[row], sc.l[row], acc);
          }
          if (multi_chunk) {
            fold_partial(sc.m[row], sc.l[row], acc, hd, sc.fm[row], sc.fl[row],
                         sc.facc + (size_t)row * hd);
          }
        }
      }
    }
  }
  finish_item(p, w, sc, multi_chunk, partials);
}

// Folds the partials (m, l, acc) of a split group, one key chunk each, in key order into p.out
// (the output row holds the running accumulator).
void merge_group(const PagedAttentionParams& p, const Plan& plan, const SplitGroup& grp,
                 const float* partials) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const WorkItem& w0 = plan.items[grp.first_item];
  const int32_t rows = (w0.i1 - w0.i0) * r;
  const int64_t q_row0 = p.qo_indptr[w0.b] + w0.i0;
  for (int32_t row = 0; row < rows; ++row) {
    const int32_t i = w0.i0 + row / r, h = w0.g0 * r + row % r;
    float* o = p.out + ((q_row0 + i - w0.i0) * p.num_q_heads + h) * hd;
    float m = kNegInf, l = 0.0f;
    for (int32_t s = 0; s < grp.num_splits; ++s) {
      const int32_t part = plan.items[grp.first_item + s].partial;
      const float* src = partials + ((size_t)part * kQueryTile * r + row) * (hd + 2);
      fold_partial(src[0], src[1], src + 2, hd, m, l, o);
    }
    if (m == kNegInf) std::fill(o, o + hd, 0.0f);
    write_row(m, l, o, hd, p.sinks != nullptr ? p.sinks + h : nullptr, o);
  }
}

}  // namespace

void check_paged_attention_params(const PagedAttentionParams& p) {
  ARBOR_CHECK(p.num_seqs >= 0 && p.head_dim > 0 && p.block_size > 0);
  ARBOR_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0)
      << p.num_q_heads << " query heads, " << p.num_kv_heads << " kv heads";
  ARBOR_CHECK(p.q && p.out && p.k_cache && p.v_cache && p.qo_indptr && p.kv_indptr &&
              p.kv_page_indices && p.kv_len);
  ARBOR_CHECK_EQ(p.qo_indptr[0], 0);
  for (int b = 0; b < p.num_seqs; ++b) {
    const int32_t n = p.qo_indptr[b + 1] - p.qo_indptr[b];
    ARBOR_CHECK(n >= 0 && p.kv_len[b] >= n)
        << "sequence " << b << ": " << n << " new tokens, kv_len " << p.kv_len[b];
    const int64_t blocks = p.kv_indptr[b + 1] - p.kv_indptr[b];
    ARBOR_CHECK(blocks * p.block_size >= p.kv_len[b])
        << "sequence " << b << ": " << blocks << " blocks of " << p.block_size << " for kv_len "
        << p.kv_len[b];
    if (p.mask_indptr != nullptr) {
      const int64_t bits = p.mask_indptr[b + 1] - p.mask_indptr[b];
      ARBOR_CHECK(bits == 0 || bits == (int64_t)n * n)
          << "sequence " << b << ": mask has " << bits << " bits for " << n << " new tokens";
    }
  }
}

void plan_paged_attention(const PagedAttentionParams& p, int num_threads,
                          PagedAttentionPlan& plan) {
  ARBOR_DCHECK((check_paged_attention_params(p), true));
  ARBOR_CHECK_GE(num_threads, 1);
  build_plan(p, num_threads, plan);
  plan.num_threads = num_threads;
  plan.num_seqs = p.num_seqs;
  plan.num_kv_heads = p.num_kv_heads;
  plan.block_size = p.block_size;
  plan.window = p.window;
  plan.qo_indptr = p.qo_indptr;
  plan.kv_len = p.kv_len;
  plan.mask_indptr = p.mask_indptr;
}

void paged_attention(const PagedAttentionParams& p, const PagedAttentionPlan& plan,
                     ThreadPool& pool) {
  // The items index sequences, kv heads and rows of the layout they were made for.
  ARBOR_CHECK(plan.num_threads == pool.num_threads() && plan.num_seqs == p.num_seqs &&
              plan.num_kv_heads == p.num_kv_heads && plan.block_size == p.block_size &&
              plan.window == p.window && plan.qo_indptr == p.qo_indptr &&
              plan.kv_len == p.kv_len && plan.mask_indptr == p.mask_indptr)
      << "an attention plan made for another layout (" << plan.num_seqs << " sequences, window "
      << plan.window << ", " << plan.num_threads << " threads) used for " << p.num_seqs
      << " sequences, window " << p.window << ", " << pool.num_threads() << " threads";
  if (p.num_seqs == 0) return;
  // Grow-only partials of the calling thread. Workers see them through this pointer (naming a
  // thread_local inside the lambda would name the worker's own instance).
  thread_local std::vector<float> tl_partials;
  const int r = p.num_q_heads / p.num_kv_heads;
  const size_t partial_floats = (size_t)plan.num_partials * kQueryTile * r * (p.head_dim + 2);
  if (tl_partials.size() < partial_floats) tl_partials.resize(partial_floats);
  float* partials = tl_partials.data();
  const AttnBlockOps ops = block_ops(p.head_dim);
  const bool lanes = uses_lanes(p);
  const size_t scratch_bytes = scratch_floats(p) * sizeof(float);
  pool.parallel_for(
      (int64_t)plan.items.size(),
      [&](int64_t begin, int64_t end, int thread) {
        float* base = static_cast<float*>(pool.workspace(1 + thread, scratch_bytes));
        const Scratch sc = carve_scratch(base, p);
        for (int64_t it = begin; it < end; ++it) {
          if (lanes) {
            run_item_lanes(p, plan.items[it], sc, partials);
          } else {
            run_item(p, plan.items[it], sc, partials, ops);
          }
        }
      },
      1);
  if (plan.groups.empty()) return;
  pool.parallel_for(
      (int64_t)plan.groups.size(),
      [&](int64_t begin, int64_t end, int) {
        for (int64_t gi = begin; gi < end; ++gi) merge_group(p, plan, plan.groups[gi], partials);
      },
      1);
}

void paged_attention(const PagedAttentionParams& p, ThreadPool& pool) {
  thread_local PagedAttentionPlan tl_plan;
  plan_paged_attention(p, pool.num_threads(), tl_plan);
  paged_attention(p, tl_plan, pool);
}

void attention_ref(const RefAttentionParams& p) {
  const int r = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  std::vector<double> s(p.num_kv);
  for (int i = 0; i < p.num_q; ++i) {
    for (int h = 0; h < p.num_q_heads; ++h) {
      const float* q = p.q + ((size_t)i * p.num_q_heads + h) * hd;
      const int g = h / r;
      double mmax = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < p.num_kv; ++j) {
        if (!p.visible[(size_t)i * p.num_kv + j]) continue;
        const float* k = p.k + ((size_t)j * p.num_kv_heads + g) * hd;
        double d = 0.0;
        for (int c = 0; c < hd; ++c) d += (double)q[c] * k[c];
        s[j] = d * p.scale;
        if (p.softcap > 0.0f) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
        mmax = std::max(mmax, s[j]);
      }
      std::vector<double> o(hd, 0.0);
      double sum = 0.0;
      if (p.sinks != nullptr && mmax > -std::numeric_limits<double>::infinity()) {
        const double sink = p.sinks[h];
        mmax = std::max(mmax, sink);
        sum = std::exp(sink - mmax);
      }
      for (int j = 0; j < p.num_kv; ++j) {
        if (!p.visible[(size_t)i * p.num_kv + j]) continue;
        const double e = std::exp(s[j] - mmax);
        sum += e;
        const float* v = p.v + ((size_t)j * p.num_kv_heads + g) * hd;
        for (int c = 0; c < hd; ++c) o[c] += e * v[c];
      }
      float* out = p.out + ((size_t)i * p.num_q_heads + h) * hd;
      for (int c = 0; c < hd; ++c) out[c] = sum > 0.0 ? (float)(o[c] / sum) : 0.0f;
    }
  }
}

}  // namespace arbor::kernels
