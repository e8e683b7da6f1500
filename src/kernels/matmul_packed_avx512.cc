// AVX-512 VNNI kernels over packed Q8_0/Q4_0 weights (layout: matmul_internal.h). Per block of
// 32 columns, a group of 16 rows is 8 zmm of unsigned weight bytes; for each token, 8 vpdpbusd
// against broadcast activation dwords leave the 16 rows' integer block dots in the 16 lanes,
// then one convert and one FMA (scale = d_w[16 lanes] * d_a) — 12 instructions for 512
// multiply-adds, no horizontal sums. The 8 vpdpbusd run as two chains per token, interleaved
// across up to 5 tokens (dot_chains, packed_tiles.h). Each output is accumulated block by
// block in the same order whatever the tile shape, so a token's result does not depend on the
// batch around it.
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx512_target.h"
#include "kernels/matmul_internal.h"
#include "kernels/packed_tiles.h"

namespace arbor::kernels::internal {
namespace {

using gguf::GgmlType;

template <GgmlType kType>
constexpr size_t kRecordBytes = kPackScaleBytes + (kType == GgmlType::kQ8_0 ? 512 : 256);

// The 8 weight registers of one record: z[j] lane i holds row i's unsigned weights for
// activation dword j (elements 4j..4j+3).
template <GgmlType kType>
ARBOR_AVX512_INLINE void load_record(const uint8_t* rec, __m512i (&z)[8]) {
  const uint8_t* q = rec + kPackScaleBytes;
  if constexpr (kType == GgmlType::kQ8_0) {
    for (int j = 0; j < 8; ++j) z[j] = _mm512_loadu_si512(q + 64 * j);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(q + 64 * j);
      z[j] = _mm512_and_si512(v, low);                              // elements 4j..4j+3
      z[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);  // elements 16+4j..
    }
  }
}

// A record into the cache level a tile of T tokens reads from (kWeightPrefetchLocality).
template <GgmlType kType, int T>
ARBOR_AVX512_INLINE void prefetch_record(const uint8_t* rec) {
  constexpr size_t kRec = kRecordBytes<kType>;
#pragma GCC unroll 16
  for (size_t off = 0; off < kRec; off += 64) {
    __builtin_prefetch(rec + off, 0, kWeightPrefetchLocality<T>);
  }
}

// One output tile: acc[g][t] += the block dots of rows of groups g0.. x tokens t0.., every
// block in order. Per (row, token) the arithmetic is fixed whatever G and T are: for each block
// b, acc = fma(float(integer dot - offset), d_w * d_a, acc), starting from 0 — so a token's
// result does not depend on the batch around it.
template <GgmlType kType>
struct Q0Kernel {
  using Act = ActBlockVnni;
  template <int G, int T>
  ARBOR_AVX512 static void tile(const WeightView& w, const ActBlockVnni* acts,
                                int64_t num_tokens, float* y, int64_t g0, int64_t t0);

  // One record (z, its 16 rows' scales wd) into the accumulators of tokens ab[kFrom .. T), in
  // balanced chunks of at most kDotChunk tokens (dot_chains, packed_tiles.h).
  template <int T, int kFrom = 0>
  ARBOR_AVX512_INLINE static void record_tokens(const ActBlockVnni* ab, const __m512i (&z)[8],
                                                __m512 wd, __m512 (&acc)[T]) {
    constexpr int C = kNextChunk<T, kFrom>;
    __m512i lo[C], hi[C];
#pragma GCC unroll 16
    for (int t = 0; t < C; ++t) {
      lo[t] = _mm512_set1_epi32(ab[kFrom + t].neg_sum);
      hi[t] = _mm512_setzero_si512();
    }
    dot_chains<C>(ab + kFrom, z, lo, hi);
#pragma GCC unroll 16
    for (int t = 0; t < C; ++t) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[t], hi[t]));
      acc[kFrom + t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(wd, _mm512_set1_ps(ab[kFrom + t].d)),
                                       acc[kFrom + t]);
    }
    if constexpr (kFrom + C < T) record_tokens<T, kFrom + C>(ab, z, wd, acc);
  }
};

template <GgmlType kType>
template <int G, int T>
ARBOR_AVX512 void Q0Kernel<kType>::tile(const WeightView& w, const ActBlockVnni* acts, int64_t num_tokens, float* y,
                     int64_t g0, int64_t t0) {
  constexpr size_t kRec = kRecordBytes<kType>;
  const int64_t nb = w.cols / kQBlock;
  const uint8_t* base[G];
  for (int g = 0; g < G; ++g) {
    base[g] = static_cast<const uint8_t*>(w.packed) + static_cast<size_t>((g0 + g) * nb) * kRec;
  }
  // Block b's activations for tokens t0.. are ab[0..T) (block-major: one pointer, immediate
  // offsets).
  const int64_t n = num_tokens;
  const ActBlockVnni* ab = acts + t0;
  __m512 acc[G][T];
  zero_tile(acc);
  for (int64_t b = 0; b < nb; ++b, ab += n) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const uint8_t* rec = base[g] + static_cast<size_t>(b) * kRec;
      // Several tokens per record: fetch ahead (the group's records are contiguous, and the
      // next group's follow them).
      prefetch_record<kType, T>(rec + kPrefetchRecords * kRec);
      const __m512 wd =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
      __m512i z[8];
      load_record<kType>(rec, z);
      record_tokens<T>(ab, z, wd, acc[g]);
    }
  }
  store_tile(w, y, g0, t0, acc);
}

}  // namespace

ARBOR_AVX512 void pack_act_row_vnni(const float* x, int64_t cols, int32_t k, ActBlockVnni* out,
                                   int64_t out_stride) {
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < cols / kQBlock; ++b) {
    ActBlockVnni& ab = out[b * out_stride];
    quantize_act_row_avx2(x + b * kQBlock, kQBlock, ab.qs, &ab.d);
    // sum(qs) via dpbusd(0, 1, qs) on 8 lanes, then a horizontal add.
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs));
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    ab.neg_sum = -k * _mm_cvtsi128_si32(h);
  }
}

void packed_rows_avx512(const WeightView& w, const ActBlockVnni* acts, int64_t num_tokens,
                        float* y, int64_t group_begin, int64_t group_end) {
  if (w.type == GgmlType::kQ8_0) {
    packed_rows<Q0Kernel<GgmlType::kQ8_0>>(w, acts, num_tokens, y, group_begin, group_end);
  } else {
    packed_rows<Q0Kernel<GgmlType::kQ4_0>>(w, acts, num_tokens, y, group_begin, group_end);
  }
}

}  // namespace arbor::kernels::internal
