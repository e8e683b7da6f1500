// Internal to the kernels module: how the AVX-512 kernels over packed weights (Q8_0/Q4_0 and
// the affine types) walk a range of 16-row groups and a call's tokens in register tiles.
// `K` is a kernel class with
//   using Act = <its activation record>;
//   template <int G, int T> static void tile(const WeightView& w, const Act* acts,
//                                            int64_t num_tokens, float* y, int64_t g0,
//                                            int64_t t0);
// computing y for groups g0 .. g0+G-1 and tokens t0 .. t0+T-1 (acts block-major:
// [cols / 32, num_tokens]). Every tile accumulates each (row, token) block by block in the same
// order, so the tiling below changes speed, never bits (batch invariance).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/avx512_target.h"
#include "kernels/matmul_internal.h"

namespace arbor::kernels::internal {

// How far ahead of the record it is reading a tile prefetches its weight stream, in records
// (Q4_0: 4.3 KB, Q4_K: 4.6 KB). Every tile does some work per record (unpacking, scales, one
// dot chain per token), which leaves the hardware prefetcher alone too far behind DRAM; 16
// read 3-15 % faster than 8 at 1..16 tokens and as fast as 24 or 32 (docs/benchmarks-history.md,
// "One stream per thread").
constexpr int64_t kPrefetchRecords = 16;

// Tokens per chunk of a record's dot products (dot_chains): two chains each, so a chunk keeps
// up to 10 vpdpbusd chains in flight (latency 5, two per cycle), and the 8 weight registers,
// the chunk's 10 dots and 9 accumulators still fit in the 32 zmm.
constexpr int kDotChunk = 5;

// The size of the next chunk for tokens kFrom .. T - 1: balanced chunks of <= kDotChunk.
template <int T, int kFrom>
constexpr int kNextChunk = [] {
  constexpr int left = T - kFrom, chunks = (left + kDotChunk - 1) / kDotChunk;
  return (left + chunks - 1) / chunks;
}();

// acc + the dword dots of z's unsigned bytes with the four int8 at p, broadcast. An inline
// vpdpbusd with an embedded {1to16} broadcast: for the intrinsic GCC emits a separate
// vpbroadcastd, one more uop per dot, and the front end limits the multi-token tiles.
ARBOR_AVX512_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i z, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(z), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// Adds to lo[t] the dots of z[0..3] with elements 0..15 of token t's block (ab[t].qs) and to
// hi[t] those of z[4..7] with elements 16..31 (z[j] lane i: row i's 4 bytes for elements
// 4j..4j+3), for t < C. Element dword j outer, tokens inner: the 2C chains interleave, where
// one token's 8 dependent vpdpbusd after another kept the scheduler on one chain at a time.
// Integer sums: the order changes no bit.
template <int C, class Act>
ARBOR_AVX512_INLINE void dot_chains(const Act* ab, const __m512i (&z)[8], __m512i (&lo)[C],
                                    __m512i (&hi)[C]) {
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 16
    for (int t = 0; t < C; ++t) {
      lo[t] = dpbusd_bcast(lo[t], z[j], ab[t].qs + 4 * j);
      hi[t] = dpbusd_bcast(hi[t], z[4 + j], ab[t].qs + 16 + 4 * j);
    }
  }
}

// A tile's accumulators: acc[g][t] lane i = row 16 (g0 + g) + i, token t0 + t.
template <int G, int T>
ARBOR_AVX512_INLINE void zero_tile(__m512 (&acc)[G][T]) {
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  }
}

// Writes the live rows of acc into y: [num_tokens, w.rows].
template <int G, int T>
ARBOR_AVX512_INLINE void store_tile(const WeightView& w, float* y, int64_t g0, int64_t t0,
                                    const __m512 (&acc)[G][T]) {
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const int64_t r0 = (g0 + g) * kPackRows;
    const int64_t live = std::min<int64_t>(kPackRows, w.rows - r0);
    const __mmask16 m = live == kPackRows ? 0xFFFF : static_cast<__mmask16>((1u << live) - 1);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * w.rows + r0, m, acc[g][t]);
  }
}

// Tokens [t0, t1) for groups g0 .. g0 + G - 1, T at a time, then one tile for the rest.
template <class K, int G, int T>
ARBOR_AVX512 void token_tiles(const WeightView& w, const typename K::Act* acts,
                              int64_t num_tokens, float* y, int64_t g0, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + T <= t1; t += T) K::template tile<G, T>(w, acts, num_tokens, y, g0, t);
  if constexpr (T > 1) {
    if (t < t1) token_tiles<K, G, T - 1>(w, acts, num_tokens, y, g0, t, t1);
  }
}

// Groups [gb, ge) x tokens [t0, t1): G groups at a time, then one at a time.
template <class K, int G, int T>
ARBOR_AVX512 void group_tiles(const WeightView& w, const typename K::Act* acts,
                              int64_t num_tokens, float* y, int64_t gb, int64_t ge, int64_t t0,
                              int64_t t1) {
  int64_t g = gb;
  for (; g + G <= ge; g += G) token_tiles<K, G, T>(w, acts, num_tokens, y, g, t0, t1);
  for (; g < ge; ++g) token_tiles<K, 1, T>(w, acts, num_tokens, y, g, t0, t1);
}

// One to three tokens (decode, small batches, short drafts): one group x every token, so each
// thread reads its rows as a single sequential stream (a group's records are contiguous and the
// next group's follow them). Four groups per tile (four streams 4.6 KB apart, 8 dot chains) read
// DRAM-resident weights 11-16 % slower on Zen 5 at two threads, and was no faster from L3
// (docs/benchmarks-history.md, "One stream per thread"). Up to kMaxStationaryTokens (a step that
// verifies drafts): one group x every token, so each weight record is read from memory once
// and used for all of them (T accumulators + 8 weight registers, no spills). More tokens
// (prefill): 1 group x 8 tokens per tile over token blocks whose activations stay in L2 while
// the group's weights stay in L1/L2 across the block's tiles.
template <class K>
ARBOR_AVX512 void packed_rows(const WeightView& w, const typename K::Act* acts,
                              int64_t num_tokens, float* y, int64_t gb, int64_t ge) {
  constexpr int64_t kTokenBlock = 64;
  if (num_tokens <= 3) {
    group_tiles<K, 1, 3>(w, acts, num_tokens, y, gb, ge, 0, num_tokens);
    return;
  }
  if (num_tokens <= 2 * kMaxStationaryTokens) {
    // Up to 32 tokens: one or two balanced tiles per group; the second finds the group's
    // records in cache.
    const int64_t split = num_tokens <= kMaxStationaryTokens ? num_tokens : (num_tokens + 1) / 2;
    for (int64_t g = gb; g < ge; ++g) {
      token_tiles<K, 1, kMaxStationaryTokens>(w, acts, num_tokens, y, g, 0, split);
      if (split < num_tokens) {
        token_tiles<K, 1, kMaxStationaryTokens>(w, acts, num_tokens, y, g, split, num_tokens);
      }
    }
    return;
  }
  for (int64_t tb = 0; tb < num_tokens; tb += kTokenBlock) {
    const int64_t te = std::min(num_tokens, tb + kTokenBlock);
    group_tiles<K, 1, 8>(w, acts, num_tokens, y, gb, ge, tb, te);
  }
}

}  // namespace arbor::kernels::internal
