// AVX-512 VNNI kernel over the affine packed types (layout: packed_affine.h). Per block of 32
// columns and group of 16 rows, a record unpacks to 8 zmm of unsigned u bytes (nibble plane:
// two ops per pair; each bit plane: one masked byte add per zmm from a 64-bit mask), the
// scales S (and offsets M) of the 16 rows come from the int8 sub-block scales times the unit's
// fp16 d; then per token 8 vpdpbusd against broadcast activation dwords (two chains of 4,
// interleaved across up to 5 tokens so 10 chains are in flight) and one or two FMAs; the
// super-block types add a unit's blocks without the activation scale, which multiplies once per
// unit.
// Unpacking is shared by every token of a tile, so multi-token steps pay it once per weight.
// The f32 operations per (row, token, block) are affine_block_step's, in its order.
#include <immintrin.h>

#include <cstring>

#include "kernels/avx512_target.h"
#include "kernels/packed_affine.h"
#include "kernels/packed_tiles.h"

namespace arbor::kernels::internal {
namespace {

using gguf::GgmlType;

ARBOR_AVX512_INLINE __mmask64 load_mask(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return _cvtu64_mask64(v);
}

// a | b as its own vpord: GCC folds an OR of an AND into one vpternlogd, which Zen 4 issues to
// the pipes that run vpdpbusd and FMA (measured: 8 vpternlogd beside 8 vpdpbusd take 16 cycles,
// 8 vpandd + 8 vpord take none extra), and the multi-token tiles are bound by those pipes.
ARBOR_AVX512_INLINE __m512i or_unfused(__m512i a, __m512i b) {
  __m512i r;
  asm("vpord %2, %1, %0" : "=v"(r) : "v"(a), "v"(b));
  return r;
}

// 16 int8 at p -> 16 f32.
ARBOR_AVX512_INLINE __m512 load_i8_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

ARBOR_AVX512_INLINE __m512 load_ph(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 E8M0 bytes at p -> 2^(e - 128) in f32 (gguf::e8m0_to_fp32_half): (e - 1) << 23, or the
// denormals 0x00200000 << e for e < 2.
ARBOR_AVX512_INLINE __m512 load_e8m0_half(const uint8_t* p) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
  const __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
  const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, denormal));
}

// Bytes ahead of the record being read that the tiles prefetch (packed_tiles.h).
template <size_t kRec>
constexpr size_t kPrefetchBytes = kPrefetchRecords * kRec;

template <GgmlType kType>
struct AffineKernel {
  using Act = ActBlockAffine;
  static constexpr AffineFormat kF = affine_format_of(kType);
  static constexpr int kSubs = kF.sub_blocks();
  static constexpr bool kPerUnit = scales_per_unit(kF);
  // 4-bit types at one token: the high nibbles stay in place (16 u, still a byte), their chain
  // is shifted right by 4 once per token instead of every register once per record (exact).
  template <int T>
  static constexpr bool kHighInPlace = T == 1 && kF.nibbles && !kF.crumbs && kF.bit_planes == 0 &&
                                       kF.codebook == Codebook::kNone;

  // z[j] lane i = row i's u for elements 4j .. 4j+3 (z[4..7]: 16 u with kHighInPlace).
  template <bool kHigh16>
  ARBOR_AVX512_INLINE static void unpack(const uint8_t* rec, __m512i (&z)[8]) {
    if constexpr (kF.nibbles) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(rec + 64 * j);
        z[j] = _mm512_and_si512(v, low);
        z[4 + j] = kHigh16 ? _mm512_andnot_si512(low, v)
                           : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
    if constexpr (kF.crumbs) {
      // Crumb q of word k holds u's bits c, c+1 for z[4k+q]: one shift moves them to bit c
      // (never across a byte for the bits kept), then a mask or a merge under a mask.
      constexpr int c = kF.crumb_bit();
      const __m512i keep = _mm512_set1_epi8(static_cast<char>(3 << c));
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const __m512i v = _mm512_loadu_si512(rec + kF.crumb_offset() + 64 * k);
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          const int shift = c - 2 * q;
          const __m512i moved = shift > 0   ? _mm512_slli_epi16(v, shift)
                                : shift < 0 ? _mm512_srli_epi16(v, -shift)
                                            : v;
          if constexpr (kF.nibbles) {
            z[4 * k + q] = or_unfused(z[4 * k + q], _mm512_and_si512(moved, keep));
          } else {
            z[4 * k + q] = _mm512_and_si512(moved, keep);
          }
        }
      }
    }
    const uint8_t* planes = rec + kF.plane_offset();
#pragma GCC unroll 3
    for (int p = 0; p < kF.bit_planes; ++p) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << (kF.first_plane_bit() + p)));
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        z[j] = _mm512_mask_add_epi8(z[j], load_mask(planes + 64 * p + 8 * j), z[j], bit);
      }
    }
    if constexpr (kF.codebook != Codebook::kNone) {
      // Each index byte (0..15) becomes its codebook value plus zero: one vpshufb per zmm.
      const __m512i table = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook_bytes(kF.codebook))));
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) z[j] = _mm512_shuffle_epi8(table, z[j]);
    }
  }

  // S[h] (and M[h]) of the 16 rows for the record's sub-blocks, from the unit's d (and dm).
  ARBOR_AVX512_INLINE static void scales(__m512 d, __m512 dm, const uint8_t* rec, __m512 (&s)[2],
                                         __m512 (&m)[2]) {
    if constexpr (kF.int_scales) {
      const uint8_t* sc = rec + kF.scale_offset();
      for (int h = 0; h < kSubs; ++h) s[h] = _mm512_mul_ps(d, load_i8_ps(sc + 16 * h));
      if constexpr (kF.has_min) {
        for (int h = 0; h < kSubs; ++h) {
          m[h] = _mm512_mul_ps(dm, load_i8_ps(sc + 16 * kSubs + 16 * h));
        }
      }
    } else {
      s[0] = d;
      m[0] = dm;
    }
  }

  template <int G, int T>
  ARBOR_AVX512 static void tile(const WeightView& w, const Act* acts, int64_t num_tokens,
                                float* y, int64_t g0, int64_t t0) {
    constexpr size_t kUnit = kF.unit_bytes(), kHdr = kF.header_bytes(), kRec = kF.record_bytes();
    constexpr int64_t kBpu = kF.blocks_per_unit;
    const int64_t nb = w.cols / kQBlock;
    const size_t group_bytes = static_cast<size_t>(nb / kBpu) * kUnit;
    const uint8_t* base[G];
    for (int g = 0; g < G; ++g) {
      base[g] = static_cast<const uint8_t*>(w.packed) + static_cast<size_t>(g0 + g) * group_bytes;
    }
    const int64_t n = num_tokens;
    const Act* ab = acts + t0;
    __m512 acc[G][T];
    zero_tile(acc);
    const int64_t units = nb / kBpu;
    for (int64_t u = 0; u < units; ++u) {
      // The unit's d (and dm) once for its blocks.
      __m512 d[G], dm[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const uint8_t* unit = base[g] + static_cast<size_t>(u) * kUnit;
        d[g] = kF.e8m0 ? load_e8m0_half(unit) : load_ph(unit);
        dm[g] = kF.has_min ? load_ph(unit + 32) : _mm512_setzero_ps();
      }
      // Per-unit activation scales: the unit's blocks sum into `part`, which the activation
      // scale multiplies once at the unit's end; else every block adds to acc itself.
      __m512 part[G][T];
      if constexpr (kPerUnit) zero_tile(part);
      __m512 (&sum)[G][T] = kPerUnit ? part : acc;
      for (int64_t jb = 0; jb < kBpu; ++jb, ab += n) {
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const uint8_t* rec = base[g] + static_cast<size_t>(u) * kUnit + kHdr + jb * kRec;
          // Fetch ahead even for one token: unpacking and scales keep the core busy long
          // enough per record that the hardware prefetcher alone leaves it waiting on DRAM.
          const uint8_t* ahead = rec + kPrefetchBytes<kRec>;
#pragma GCC unroll 8
          for (size_t off = 0; off < kRec + 64; off += 64) {
            __builtin_prefetch(ahead + off, 0, kWeightPrefetchLocality<T>);
          }
          __m512 s[2], m[2];
          scales(d[g], dm[g], rec, s, m);
          __m512i z[8];
          unpack<kHighInPlace<T>>(rec, z);
          record_tokens<T>(ab, z, s, m, sum[g]);
        }
      }
      if constexpr (kPerUnit) {
        const Act* last = ab - n;  // the unit's last block: every block of it has the same d
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            acc[g][t] = _mm512_fmadd_ps(part[g][t], _mm512_set1_ps(last[t].d), acc[g][t]);
          }
        }
      }
    }
    store_tile(w, y, g0, t0, acc);
  }

  // The initial dots of tokens ab[0 .. C): -zero * sum per half (0 with mins); the non-split
  // types sum both halves into lo.
  template <int C>
  ARBOR_AVX512_INLINE static void init_dots(const Act* ab, __m512i (&lo)[C], __m512i (&hi)[C]) {
#pragma GCC unroll 16
    for (int t = 0; t < C; ++t) {
      if constexpr (kF.has_min) {
        lo[t] = hi[t] = _mm512_setzero_si512();
      } else if constexpr (kF.split) {
        lo[t] = _mm512_set1_epi32(ab[t].init[0]);
        hi[t] = _mm512_set1_epi32(ab[t].init[1]);
      } else {
        lo[t] = _mm512_set1_epi32(ab[t].init[0] + ab[t].init[1]);
        hi[t] = _mm512_setzero_si512();
      }
    }
  }

  // affine_block_step's f32 operations for 16 rows and one token, from its two dots (acc: the
  // unit's partial sum with per-unit scales).
  template <int T>
  ARBOR_AVX512_INLINE static __m512 finish(const Act& at, __m512i lo, __m512i hi,
                                           const __m512 (&s)[2], const __m512 (&m)[2],
                                           __m512 acc) {
    if constexpr (kF.split) {
      if constexpr (kPerUnit) {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s[0], acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s[1], acc);
      } else {
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s[0],
                                         _mm512_mul_ps(_mm512_cvtepi32_ps(hi), s[1]));
        acc = _mm512_fmadd_ps(t, _mm512_set1_ps(at.d), acc);
      }
      if constexpr (kF.has_min) {
        acc = _mm512_fmadd_ps(m[0], _mm512_set1_ps(at.msum_half[0]), acc);
        acc = _mm512_fmadd_ps(m[1], _mm512_set1_ps(at.msum_half[1]), acc);
      }
      return acc;
    } else {
      if constexpr (kHighInPlace<T>) hi = _mm512_srai_epi32(hi, 4);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      if constexpr (kPerUnit) {
        acc = _mm512_fmadd_ps(dot, s[0], acc);
      } else {
        acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(s[0], _mm512_set1_ps(at.d)), acc);
      }
      if constexpr (kF.has_min) acc = _mm512_fmadd_ps(m[0], _mm512_set1_ps(at.msum), acc);
      return acc;
    }
  }

  // One record (z, s, m) into the accumulators of tokens ab[kFrom .. T), in balanced chunks of
  // at most kDotChunk tokens.
  template <int T, int kFrom = 0>
  ARBOR_AVX512_INLINE static void record_tokens(const Act* ab, const __m512i (&z)[8],
                                                const __m512 (&s)[2], const __m512 (&m)[2],
                                                __m512 (&acc)[T]) {
    constexpr int C = kNextChunk<T, kFrom>;
    __m512i lo[C], hi[C];
    init_dots<C>(ab + kFrom, lo, hi);
    dot_chains<C>(ab + kFrom, z, lo, hi);
#pragma GCC unroll 16
    for (int t = 0; t < C; ++t) {
      acc[kFrom + t] = finish<T>(ab[kFrom + t], lo[t], hi[t], s, m, acc[kFrom + t]);
    }
    if constexpr (kFrom + C < T) record_tokens<T, kFrom + C>(ab, z, s, m, acc);
  }
};

}  // namespace

void affine_rows_avx512(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                        float* y, int64_t group_begin, int64_t group_end) {
  switch (w.type) {
#define ARBOR_AFFINE_CASE(T)                                                                   \
  case GgmlType::T:                                                                            \
    return packed_rows<AffineKernel<GgmlType::T>>(w, acts, num_tokens, y, group_begin,         \
                                                  group_end);
    ARBOR_AFFINE_CASE(kQ4_1)
    ARBOR_AFFINE_CASE(kQ5_0)
    ARBOR_AFFINE_CASE(kQ5_1)
    ARBOR_AFFINE_CASE(kQ2_K)
    ARBOR_AFFINE_CASE(kQ3_K)
    ARBOR_AFFINE_CASE(kQ4_K)
    ARBOR_AFFINE_CASE(kQ5_K)
    ARBOR_AFFINE_CASE(kQ6_K)
    ARBOR_AFFINE_CASE(kIQ4_NL)
    ARBOR_AFFINE_CASE(kIQ4_XS)
    ARBOR_AFFINE_CASE(kMXFP4)
#undef ARBOR_AFFINE_CASE
    default:
      return;
  }
}

}  // namespace arbor::kernels::internal
