// The GPU matmul's tensor-core kernels (F16, BF16, Q8_0, Q4_0) and the activation preparation
// they read. Layouts, launch shapes and why every output is batch invariant: docs/cuda.md,
// "Matmul".
//
// One kernel per type serves every token count. A block computes one tile of 16 rows
// (blockIdx.y) for NT * 8 tokens (blockIdx.x, fastest, so the blocks that share a weight tile
// run together and the tile comes from DRAM once); warp s of the block walks K slice s of the
// slice plan (a function of cols alone), keeping NT tiles of 16 x 8 f32 accumulators; the
// slice sums meet in shared memory and are added in slice order 0, 1, ...
//
// Lane l = 4 g + q (g = l / 4, q = l % 4) holds rows g and g + 8 of the tile and reads the B
// column (token) g, as mma.sync's fragments place them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"
#include "cuda/matmul_device.cuh"
#include "cuda/matmul_internal.cuh"

namespace arbor::cuda::internal {
namespace {

constexpr int kMaxThreads = kMaxSlices * 32;
// Two blocks per SM (64 registers) where that does not spill: the decode instances and the
// F16/BF16 9..16-token one (speculative verification steps); the others take up to 128.

// Chunks whose weight loads a warp of the F16/BF16 kernel issues before computing on them: with
// 2, 64 bytes per thread are in flight and the decode kernel fits 64 registers (2 blocks of 512
// threads per SM); kUnroll's 4 spilled. Divides kUnroll, so slices hold whole groups.
constexpr int kFloatUnroll = 2;
static_assert(kUnroll % kFloatUnroll == 0);

// Eight halves of a row from element `col` on; zeros for a missing row or past `cols`.
// kVec: 16-byte aligned and col + 7 < cols. kStream: the weights (read once, not kept in L1).
template <bool kVec, bool kStream>
__device__ __forceinline__ uint4 load_halves8(const uint16_t* row, bool ok, int col, int cols) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!ok) return v;
  if constexpr (kVec) {
    if constexpr (kStream) return load_u128(reinterpret_cast<const uint8_t*>(row + col));
    return __ldg(reinterpret_cast<const uint4*>(row + col));
  } else {
    uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = col + e < cols ? __ldg(row + col + e) : 0u;
    v.x = h[0] | (h[1] << 16);
    v.y = h[2] | (h[3] << 16);
    v.z = h[4] | (h[5] << 16);
    v.w = h[6] | (h[7] << 16);
    return v;
  }
}

// F16 / BF16. Chunk c (32 columns) is two m16n8k16 MMAs. Lane (g, q) loads the 8 halves at
// columns 32c + 8q .. 32c + 8q + 7 of rows g and g + 8 and of token g's activations: one 16-byte
// load each. MMA 0 takes halves 0-3, MMA 1 halves 4-7, as the fragment elements of logical k
// {2q, 2q + 1, 2q + 8, 2q + 9}; A and B use the same column-to-k map, so each MMA sums the
// products of 16 distinct columns and the chunk covers all 32 exactly once.
template <bool kBf16, int NT, bool kVec>
__global__ void __launch_bounds__(kMaxThreads, NT <= 2 ? 2 : 1) mma_float_kernel(MmaArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31, slice = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.y) * kRowTile;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * NT * kTokTile;
  const bool ok0 = tile_row0 + g < a.rows, ok1 = tile_row0 + g + 8 < a.rows;
  const auto* w0 = reinterpret_cast<const uint16_t*>(a.w + (ok0 ? tile_row0 + g : 0) * a.row_stride);
  const auto* w1 =
      reinterpret_cast<const uint16_t*>(a.w + (ok1 ? tile_row0 + g + 8 : 0) * a.row_stride);
  // B column g of token tile j: token tok0 + 8 j + g, valid for j < tok_tiles_g.
  const int tok_tiles_g = static_cast<int>(
      min64(NT, (a.num_tokens - tok0 - g + kTokTile - 1) / kTokTile));
  const uint16_t* xrow0 =
      static_cast<const uint16_t*>(a.acts) + (tok0 + min64(g, a.num_tokens - 1 - tok0)) * a.cols;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const int c_begin = slice * a.plan.chunks_per_slice;
  const int c_end = min(c_begin + a.plan.chunks_per_slice, a.plan.chunks);
  for (int c = c_begin; c < c_end; c += kFloatUnroll) {
    uint4 wa[kFloatUnroll], wb[kFloatUnroll];
#pragma unroll
    for (int u = 0; u < kFloatUnroll; ++u) {  // all loads first: kFloatUnroll chunks in flight
      const int col = (c + u) * kChunk + q * 8;
      const bool in = c + u < c_end;
      wa[u] = load_halves8<kVec, true>(w0, ok0 && in, col, a.cols);
      wb[u] = load_halves8<kVec, true>(w1, ok1 && in, col, a.cols);
    }
#pragma unroll
    for (int u = 0; u < kFloatUnroll; ++u) {
      if (c + u >= c_end) break;
      const int col = (c + u) * kChunk + q * 8;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 b = load_halves8<kVec, false>(xrow0 + j * kTokTile * a.cols, j < tok_tiles_g,
                                                  col, a.cols);
        mma_16816<kBf16>(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, b.x, b.y);
        mma_16816<kBf16>(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, b.z, b.w);
      }
    }
  }
  reduce_and_store<NT>(acc, a, tile_row0, tok0);
}

// One Q8_0 / Q4_0 block of a weight row as int8 A-fragment registers: lo = elements
// 4q .. 4q + 3 (logical k 4q..), hi = elements 16 + 4q .. 16 + 4q + 3 (logical k 16 + 4q..),
// d = the block's scale. Zeros for a missing row.
struct QuantFrag {
  uint32_t lo = 0, hi = 0;
  float d = 0.0f;
};

template <bool kQ4>
__device__ __forceinline__ QuantFrag load_quant_frag(const uint8_t* blk, bool ok, int q) {
  QuantFrag f;
  if (!ok) return f;
  f.d = f16_bits_to_float(load_u16(blk));
  if constexpr (kQ4) {
    // Byte i of qs holds element i (low nibble) and element i + 16 (high nibble).
    const uint32_t v = load_u32_a2(blk + 2 + 4 * q);
    f.lo = __vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
    f.hi = __vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
  } else {
    f.lo = load_u32_a2(blk + 2 + 4 * q);
    f.hi = load_u32_a2(blk + 2 + 16 + 4 * q);
  }
  return f;
}

// The same fragment from a block staged in shared memory (2-byte aligned).
template <bool kQ4>
__device__ __forceinline__ QuantFrag shared_quant_frag(const uint8_t* blk, bool ok, int q) {
  QuantFrag f;
  if (!ok) return f;
  const auto* h = reinterpret_cast<const uint16_t*>(blk);
  f.d = f16_bits_to_float(h[0]);
  if constexpr (kQ4) {
    const uint32_t v = static_cast<uint32_t>(h[1 + 2 * q]) | (static_cast<uint32_t>(h[2 + 2 * q]) << 16);
    f.lo = __vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
    f.hi = __vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
  } else {
    f.lo = static_cast<uint32_t>(h[1 + 2 * q]) | (static_cast<uint32_t>(h[2 + 2 * q]) << 16);
    f.hi = static_cast<uint32_t>(h[9 + 2 * q]) | (static_cast<uint32_t>(h[10 + 2 * q]) << 16);
  }
  return f;
}

// Copies 4 bytes global -> shared without passing through registers (cp.async, L1-allocating:
// the only form for 4 bytes).
__device__ __forceinline__ void cp_async4(void* dst_shared, const void* src) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst_shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Chunks of a slice staged per phase by the staged decode kernel: 16 rows of them per warp in
// shared memory (Q4_0: 16 x 8 x 18 B; Q8_0: 16 x 4 x 34 B), so 16 warps stay under 48 KB with
// reduce_and_store's partial sums. Multiples of kUnroll.
template <bool kQ4>
inline constexpr int kStagePhase = kQ4 ? 8 : 4;
static_assert(kStagePhase<true> % kUnroll == 0 && kStagePhase<false> % kUnroll == 0);

// The arithmetic of kUnroll consecutive blocks c, c + 1, ... (those below c_end) of rows g and
// g + 8 (fragments fa, fb) for the NT token tiles: one m16n8k32 int8 MMA per (block, tile) gives
// the exact integer dots, then acc = fma(dot, d_w * d_x, acc) in block order.
template <int NT>
__device__ __forceinline__ void quant_mma_group(float (&acc)[NT][4], const QuantFrag (&fa)[kUnroll],
                                                const QuantFrag (&fb)[kUnroll], int c, int c_end,
                                                const MmaArgs& a, const int8_t* xrow0,
                                                const float* xd, int nb, int q, int tok_tiles_g,
                                                int tok_left) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int b = c + u;
    if (b >= c_end) break;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int8_t* xb = xrow0 + j * kTokTile * a.cols + b * kChunk + 4 * q;
      const bool tok_ok = j < tok_tiles_g;
      const uint32_t b0 = tok_ok ? __ldg(reinterpret_cast<const uint32_t*>(xb)) : 0u;
      const uint32_t b1 = tok_ok ? __ldg(reinterpret_cast<const uint32_t*>(xb + 16)) : 0u;
      int32_t dot[4];
      mma_16832_s8(dot, fa[u].lo, fb[u].lo, fa[u].hi, fb[u].hi, b0, b1);
      const float* xdj = xd + j * kTokTile * nb + b;
      const float dx0 = j * kTokTile < tok_left ? __ldg(xdj) : 0.0f;
      const float dx1 = j * kTokTile + 1 < tok_left ? __ldg(xdj + nb) : 0.0f;
      // |dot| <= 32 * 127 * 127 < 2^24: exact in f32.
      acc[j][0] = __fmaf_rn(static_cast<float>(dot[0]), __fmul_rn(fa[u].d, dx0), acc[j][0]);
      acc[j][1] = __fmaf_rn(static_cast<float>(dot[1]), __fmul_rn(fa[u].d, dx1), acc[j][1]);
      acc[j][2] = __fmaf_rn(static_cast<float>(dot[2]), __fmul_rn(fb[u].d, dx0), acc[j][2]);
      acc[j][3] = __fmaf_rn(static_cast<float>(dot[3]), __fmul_rn(fb[u].d, dx1), acc[j][3]);
    }
  }
}

// Q8_0 / Q4_0. Chunk b is ggml block b (quant_mma_group).
//
// kStaged (one token tile, decode and short verification steps; rows 4-byte aligned): each warp
// first copies its slice of the tile's 16 rows to shared memory, kStagePhase chunks at a time,
// with coalesced 4-byte cp.async (consecutive lanes, consecutive words of a row), and forms the
// fragments from there. The direct form reads each 18- or 34-byte block with 2-byte loads from
// 8 rows per instruction, several times per sector. Staging changes where the bytes come from,
// not the arithmetic: the same dots, the same FMAs in the same block order, so the same bits.
template <bool kQ4, int NT, bool kStaged = false>
__global__ void __launch_bounds__(kMaxThreads, NT == 1 ? 2 : 1) mma_quant_kernel(MmaArgs a) {
  constexpr int kBlockBytes = kQ4 ? kQ4Bytes : kQ8Bytes;
  const int lane = static_cast<int>(threadIdx.x) & 31, slice = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.y) * kRowTile;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * NT * kTokTile;
  const int nb = a.cols / kChunk;
  const bool ok0 = tile_row0 + g < a.rows, ok1 = tile_row0 + g + 8 < a.rows;
  const uint8_t* w0 = a.w + (ok0 ? tile_row0 + g : 0) * a.row_stride;
  const uint8_t* w1 = a.w + (ok1 ? tile_row0 + g + 8 : 0) * a.row_stride;
  // B column g of token tile j: token tok0 + 8 j + g, valid for j < tok_tiles_g. C columns
  // 2q, 2q + 1: tokens tc + 8 j and tc + 8 j + 1, tc = tok0 + 2q.
  const int tok_tiles_g = static_cast<int>(
      min64(NT, (a.num_tokens - tok0 - g + kTokTile - 1) / kTokTile));
  const int8_t* xrow0 =
      static_cast<const int8_t*>(a.acts) + (tok0 + min64(g, a.num_tokens - 1 - tok0)) * a.cols;
  const int64_t tc = tok0 + 2 * q;
  const int tok_left = static_cast<int>(min64(a.num_tokens - tc, NT * kTokTile));
  const float* xd = a.act_scales + min64(tc, a.num_tokens - 1) * nb;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  const int c_begin = slice * a.plan.chunks_per_slice;
  const int c_end = min(c_begin + a.plan.chunks_per_slice, a.plan.chunks);
  if constexpr (!kStaged) {
    for (int c = c_begin; c < c_end; c += kUnroll) {
      QuantFrag fa[kUnroll], fb[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const bool in = c + u < c_end;
        const int64_t off = static_cast<int64_t>(c + u) * kBlockBytes;
        fa[u] = load_quant_frag<kQ4>(w0 + off, ok0 && in, q);
        fb[u] = load_quant_frag<kQ4>(w1 + off, ok1 && in, q);
      }
      quant_mma_group<NT>(acc, fa, fb, c, c_end, a, xrow0, xd, nb, q, tok_tiles_g, tok_left);
    }
  } else {
    constexpr int kPhase = kStagePhase<kQ4>, kRowBytes = kPhase * kBlockBytes;
    __shared__ __align__(16) uint8_t stage[kMaxSlices][kRowTile * kRowBytes];
    uint8_t* st = stage[slice];
    const int valid_rows = static_cast<int>(min64(kRowTile, a.rows - tile_row0));
    for (int p0 = c_begin; p0 < c_end; p0 += kPhase) {
      const int p1 = min(p0 + kPhase, c_end);
      const int len = (p1 - p0) * kBlockBytes, words = len / 4;
      const uint8_t* src0 = a.w + tile_row0 * a.row_stride + static_cast<int64_t>(p0) * kBlockBytes;
      for (int i = lane; i < valid_rows * words; i += 32) {
        const int r = i / words, wd = i - r * words;
        cp_async4(st + r * kRowBytes + 4 * wd, src0 + r * a.row_stride + 4 * wd);
      }
      if (len % 4 != 0 && lane < valid_rows) {  // an odd chunk count of 18-byte blocks
        *reinterpret_cast<uint16_t*>(st + lane * kRowBytes + len - 2) =
            load_u16(src0 + lane * a.row_stride + len - 2);
      }
      cp_async_wait_all();
      __syncwarp();
      for (int c = p0; c < p1; c += kUnroll) {
        QuantFrag fa[kUnroll], fb[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const bool in = c + u < p1;
          const uint8_t* blk = st + (c + u - p0) * kBlockBytes;
          fa[u] = shared_quant_frag<kQ4>(blk + g * kRowBytes, ok0 && in, q);
          fb[u] = shared_quant_frag<kQ4>(blk + (g + 8) * kRowBytes, ok1 && in, q);
        }
        quant_mma_group<NT>(acc, fa, fb, c, p1, a, xrow0, xd, nb, q, tok_tiles_g, tok_left);
      }
      __syncwarp();  // every lane has read the phase before the next one overwrites it
    }
  }
  reduce_and_store<NT>(acc, a, tile_row0, tok0);
}

template <bool kBf16>
__global__ void round_acts_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = kBf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i]))
                   : __half_as_ushort(__float2half_rn(x[i]));
  }
}

// The warp's max of a, in every lane.
__device__ __forceinline__ float warp_max(float a) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

// The sums of q over lanes 0..15 (x) and 16..31 (y), in lane 0.
__device__ __forceinline__ int2 warp_half_sums(int q) {
  int half = q;  // lanes 0..15 end with the sum of the first half, 16..31 of the second
#pragma unroll
  for (int off = 8; off > 0; off /= 2) half += __shfl_xor_sync(0xffffffffu, half, off);
  return make_int2(half, __shfl_sync(0xffffffffu, half, 16));
}

// A block's ActSums: its scale d and its sums times m (d, or 1 for the K-quants, whose scale
// multiplies a super-block's sum at its end), each product rounded once.
__device__ __forceinline__ ggml::ActSums block_sums(float d, float m, int2 sums) {
  ggml::ActSums s;
  s.d = d;
  s.msum0 = __fmul_rn(m, static_cast<float>(sums.x));
  s.msum1 = __fmul_rn(m, static_cast<float>(sums.y));
  s.msum = __fmul_rn(m, static_cast<float>(sums.x + sums.y));
  return s;
}

// One warp per block of 32 activations: d = max|x| / 127, q = round_half_even(x * (1 / d)),
// each step rounded as the CPU's scalar quantiser rounds it. kSums (the affine types): instead of
// d, out gets ggml::ActSums {d, d * sum(q[0..15]), d * sum(q[16..31]), d * sum(q)}.
template <bool kSums>
__global__ void quantize_acts_kernel(const float* x, int64_t num_blocks, int8_t* qs, void* out) {
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (blk >= num_blocks) return;
  const float v = x[blk * kChunk + lane];
  const float db = __fdiv_rn(warp_max(fabsf(v)), 127.0f);
  const float id = db != 0.0f ? __frcp_rn(db) : 0.0f;
  const int q = __float2int_rn(__fmul_rn(v, id));
  qs[blk * kChunk + lane] = static_cast<int8_t>(q);
  if constexpr (kSums) {
    const int2 sums = warp_half_sums(q);
    if (lane == 0) static_cast<ggml::ActSums*>(out)[blk] = block_sums(db, db, sums);
  } else {
    if (lane == 0) static_cast<float*>(out)[blk] = db;
  }
}

// The K-quants' activations: one warp per super-block of 256 (kUnitChunks blocks of 32, lane l
// holding column 32 j + l of block j): d = max|x| over the 256 / 127, q as above, and per block
// ActSums {d, f32(sum(q[0..15])), f32(sum(q[16..31])), f32(sum(q))} (kernels::internal::
// pack_act_row_affine with per-unit scales).
__global__ void quantize_acts_unit_kernel(const float* x, int64_t num_units, int8_t* qs,
                                          ggml::ActSums* out) {
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (unit >= num_units) return;
  const int64_t base = unit * kUnitChunks * kChunk;
  float v[kUnitChunks];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kUnitChunks; ++j) {
    v[j] = x[base + j * kChunk + lane];
    amax = fmaxf(amax, fabsf(v[j]));
  }
  const float db = __fdiv_rn(warp_max(amax), 127.0f);
  const float id = db != 0.0f ? __frcp_rn(db) : 0.0f;
#pragma unroll
  for (int j = 0; j < kUnitChunks; ++j) {
    const int q = __float2int_rn(__fmul_rn(v[j], id));
    qs[base + j * kChunk + lane] = static_cast<int8_t>(q);
    const int2 sums = warp_half_sums(q);
    if (lane == 0) out[unit * kUnitChunks + j] = block_sums(db, 1.0f, sums);
  }
}

template <int NT>
void launch_tiles(gguf::GgmlType type, const MmaArgs& a, cudaStream_t stream) {
  const dim3 grid((a.num_tokens + NT * kTokTile - 1) / (NT * kTokTile),
                  (a.rows + kRowTile - 1) / kRowTile);
  const dim3 block(32 * a.plan.slices);
  const bool vec = a.cols % kChunk == 0 && a.row_stride % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.acts) % 16 == 0;
  // The staged decode kernel copies rows in 4-byte words.
  const bool staged = NT == 1 && a.row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.w) % 4 == 0;
  switch (type) {
    case gguf::GgmlType::kF16:
      if (vec) mma_float_kernel<false, NT, true><<<grid, block, 0, stream>>>(a);
      else mma_float_kernel<false, NT, false><<<grid, block, 0, stream>>>(a);
      break;
    case gguf::GgmlType::kBF16:
      if (vec) mma_float_kernel<true, NT, true><<<grid, block, 0, stream>>>(a);
      else mma_float_kernel<true, NT, false><<<grid, block, 0, stream>>>(a);
      break;
    case gguf::GgmlType::kQ8_0:
      if (staged) mma_quant_kernel<false, 1, true><<<grid, block, 0, stream>>>(a);
      else mma_quant_kernel<false, NT><<<grid, block, 0, stream>>>(a);
      break;
    case gguf::GgmlType::kQ4_0:
      if (staged) mma_quant_kernel<true, 1, true><<<grid, block, 0, stream>>>(a);
      else mma_quant_kernel<true, NT><<<grid, block, 0, stream>>>(a);
      break;
    default:
      ARBOR_CHECK(false) << "no tensor-core kernel for " << gguf::ggml_type_name(type);
  }
  check_launch("mma kernel");
}

}  // namespace

SlicePlan slice_plan(int64_t cols, int32_t align) {
  ARBOR_CHECK(align > 0 && align % kUnroll == 0) << "slice alignment " << align;
  SlicePlan p;
  p.chunks = static_cast<int32_t>((cols + kChunk - 1) / kChunk);
  const int32_t per = (p.chunks + kMaxSlices - 1) / kMaxSlices;
  p.chunks_per_slice = std::max(align, (per + align - 1) / align * align);
  p.slices = (p.chunks + p.chunks_per_slice - 1) / p.chunks_per_slice;
  return p;
}

int token_tiles(int32_t num_tokens) {
  return num_tokens <= kTokTile ? 1 : num_tokens <= 2 * kTokTile ? 2 : 4;
}

void launch_round_acts(const float* x, int64_t n, bool bf16, uint16_t* out, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
  if (bf16) {
    round_acts_kernel<true><<<blocks, kThreads, 0, stream>>>(x, n, out);
  } else {
    round_acts_kernel<false><<<blocks, kThreads, 0, stream>>>(x, n, out);
  }
  check_launch("round_acts_kernel");
}

void launch_quantize_acts(const float* x, int32_t num_tokens, int32_t cols, int8_t* qs, float* d,
                          ggml::ActSums* sums, bool per_unit, cudaStream_t stream) {
  constexpr int kWarps = 8;
  if (per_unit) {
    ARBOR_CHECK(sums != nullptr && cols % (kUnitChunks * kChunk) == 0) << cols << " columns";
    const int64_t num_units = static_cast<int64_t>(num_tokens) * (cols / (kUnitChunks * kChunk));
    const auto grid = static_cast<unsigned>((num_units + kWarps - 1) / kWarps);
    quantize_acts_unit_kernel<<<grid, kWarps * 32, 0, stream>>>(x, num_units, qs, sums);
    check_launch("quantize_acts_unit_kernel");
    return;
  }
  const int64_t num_blocks = static_cast<int64_t>(num_tokens) * (cols / kChunk);
  const auto grid = static_cast<unsigned>((num_blocks + kWarps - 1) / kWarps);
  if (sums != nullptr) {
    quantize_acts_kernel<true><<<grid, kWarps * 32, 0, stream>>>(x, num_blocks, qs, sums);
  } else {
    quantize_acts_kernel<false><<<grid, kWarps * 32, 0, stream>>>(x, num_blocks, qs, d);
  }
  check_launch("quantize_acts_kernel");
}

void launch_mma(gguf::GgmlType type, const MmaArgs& a, cudaStream_t stream) {
  switch (token_tiles(a.num_tokens)) {
    case 1:
      launch_tiles<1>(type, a, stream);
      return;
    case 2:
      launch_tiles<2>(type, a, stream);
      return;
    default:
      launch_tiles<4>(type, a, stream);
  }
}

}  // namespace arbor::cuda::internal
