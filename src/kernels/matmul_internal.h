// Internal to the kernels module: the layout of quantised activations and the per-ISA kernel
// entry points that matmul() dispatches to. Not for use outside src/kernels and its tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace arbor::kernels::internal {

inline constexpr int64_t kQBlock = 32;  // activation (and Q8_0/Q4_0 weight) block size

// ggml block layouts.
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // element j = (qs[j] & 0xF) - 8, element j + 16 = (qs[j] >> 4) - 8
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18);

// Activations quantised to int8 blocks of 32, one f32 scale per block.
//   qs: [num_tokens, cols] int8, d: [num_tokens, cols / 32] f32.
struct QuantizedActs {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  int64_t cols = 0;
  // Q4_0 on AVX2 only (else null): [num_tokens, cols / 32, 8] int16, entry i of a block =
  // 8 * (q[2i] + q[2i+1] + q[16+2i] + q[17+2i]); see act_q4_sums_avx2.
  const int16_t* q4_sums = nullptr;
};

// Quantises one row x: [cols] (cols % 32 == 0) into qs: [cols], d: [cols / 32].
// d = max|x| / 127, q = round-half-even(x * (1 / d)); a zero block gets d = 0 and q = 0.
void quantize_act_row_scalar(const float* x, int64_t cols, int8_t* qs, float* d);
void quantize_act_row_avx2(const float* x, int64_t cols, int8_t* qs, float* d);
// The pieces of those, for a scale shared by several blocks (the affine super-block types
// share one per 256): max|x| over n (a multiple of 8), and q = round-half-even(x * id) for one
// block of 32, where d = amax / 127 and id = 1 / d (or 0). The twins give the same values.
float act_absmax_scalar(const float* x, int64_t n);
float act_absmax_avx2(const float* x, int64_t n);
void quantize_act_block_scalar(const float* x, float id, int8_t* qs);
void quantize_act_block_avx2(const float* x, float id, int8_t* qs);
// The q4_sums entries of one token row: qs: [cols], out: [cols / 32, 8].
void act_q4_sums_avx2(const int8_t* qs, int64_t cols, int16_t* out);
// sums[0] = qs[0] + .. + qs[15], sums[1] = qs[16] + .. + qs[31] (one block of 32).
void act_half_sums_avx2(const int8_t* qs, int32_t* sums);

// Everything a kernel needs for one matmul call. `act` is x (float types) or QuantizedActs.
struct MatmulArgs {
  const WeightView* w = nullptr;
  const float* x = nullptr;               // [num_tokens, cols], float weight types
  // Float weight types on AVX-512 with 2..2 * kMaxStationaryTokens tokens (else null): x regrouped
  // as [ceil(cols / 16), num_tokens, 16], zero past cols, so a tile reads the tokens' 16
  // columns at one pointer plus fixed offsets (see pack_x_blocked).
  const float* xb = nullptr;
  // BF16 weights where bf16_dot_kernels(): x rounded to bf16 (round to nearest even) as
  // [num_tokens, xh_stride] uint16, zero from cols to xh_stride (a multiple of 32).
  const uint16_t* xh = nullptr;
  int64_t xh_stride = 0;
  QuantizedActs q;                        // Q8_0 / Q4_0 weight types
  int64_t num_tokens = 0;
  float* y = nullptr;  // [num_tokens, w->rows]
};

// Computes y[t, r] for rows [row_begin, row_end) and all tokens. Row ranges of different calls
// may run concurrently (they write disjoint y entries).
using RowKernel = void (*)(const MatmulArgs& a, int64_t row_begin, int64_t row_end);

RowKernel scalar_kernel(gguf::GgmlType type);
RowKernel avx2_kernel(gguf::GgmlType type);
// F32 / F16 / BF16, GEMV and GEMM. Every token count goes through it on AVX-512: the AVX2 GEMV
// sums in 8 lanes, this kernel in 16, so mixing them would make a token's bits depend on the
// batch size.
RowKernel avx512_float_kernel(gguf::GgmlType type);

// BF16 weights on AVX-512 BF16 (MatmulArgs::xh): vdpbf16ps, 16 lanes of f32 sums over column
// pairs, one masked step for the tail, one reduce_add per output, at every token count (the
// same bits for a token in any batch).
void bf16_rows_avx512(const MatmulArgs& a, int64_t row_begin, int64_t row_end);
// x: [num_tokens, cols] -> out: [num_tokens, stride] bf16 (stride >= cols, multiple of 32,
// zeros after cols), each value rounded to nearest even like vcvtneps2bf16.
void round_acts_bf16_avx512(const float* x, int64_t num_tokens, int64_t cols, int64_t stride,
                            uint16_t* out);
// The row stride of the bf16 activations for `cols` columns: a multiple of 32 elements that is
// not a multiple of 4 KiB, so the token rows of a tile do not share L1 sets.
inline int64_t bf16_act_stride(int64_t cols) { return (cols + 31) / 32 * 32 + 32; }

// ---- Packed weights (pack_weights) and their AVX-512 VNNI kernels ----
// Rows are taken 16 at a time (a group; the last one padded with scale-0 rows). Group g, block b
// (32 columns) is one record at (g * num_blocks + b) * packed_block_bytes(type):
//   [0, 32)   the 16 rows' fp16 scales, in row order;
//   then      Q4_0: 4 x 64 bytes, record j holding row i's original qs bytes 4j..4j+3 at 4i..4i+3
//                   (low nibbles: elements 4j..4j+3 + 8; high: elements 16+4j..16+4j+3 + 8);
//             Q8_0: 8 x 64 bytes, record j holding row i's elements 4j..4j+3 + 128 at 4i..4i+3.
// So a 64-byte record is one zmm whose int32 lane i belongs to row i: vpdpbusd against an
// activation dword broadcast to all lanes adds 4 products to each of the 16 rows at once.
// The cache level a packed tile of T tokens prefetches its weight stream into, as
// __builtin_prefetch's locality: L1 (prefetcht0) at one token, L2 (prefetcht1) for several. A
// tile of several tokens spends long enough per record that 16 records ahead in L1 were evicted
// before they were read: on the Qwen3-0.6B shape Q4_K_M (Zen 4, 2 threads, 2026-11-30, medians
// of 8 interleaved rounds) L2 took the 5-token step from 18.65 to 17.64 ms, and BM_StepQ4_K/5
// from 9.2-9.7 to 7.8-8.6 ms. A decode tile keeps L1: L2 was no faster there (2026-11-28), and
// slower in one of two runs today (11.0-11.6 -> 12.4-12.8 ms a step).
template <int T>
inline constexpr int kWeightPrefetchLocality = T == 1 ? 3 : 2;

inline constexpr int64_t kPackRows = 16;
inline constexpr size_t kPackScaleBytes = 32;
inline size_t packed_block_bytes(gguf::GgmlType type) {
  return kPackScaleBytes + (type == gguf::GgmlType::kQ8_0 ? 512 : 256);
}

// One activation block for the packed kernels: the int8 values (quantised exactly like
// quantize_act_row_avx2), their scale, and -k * sum(qs) (k = 8 for Q4_0, 128 for Q8_0), which
// removes the weights' unsigned offset.
struct ActBlockVnni {
  int8_t qs[32];
  float d;
  int32_t neg_sum;
};
static_assert(sizeof(ActBlockVnni) == 40);

// x: [cols] -> out[b * out_stride] for b in [0, cols / 32) (out_stride = the call's token
// count: activations are block-major, so the tokens of one block sit side by side).
void pack_act_row_vnni(const float* x, int64_t cols, int32_t k, ActBlockVnni* out,
                       int64_t out_stride = 1);

// Computes y for row groups [group_begin, group_end) and all tokens from w->packed and
// acts: [cols / 32, num_tokens] (block-major).
void packed_rows_avx512(const WeightView& w, const ActBlockVnni* acts, int64_t num_tokens,
                        float* y, int64_t group_begin, int64_t group_end);

// Token counts up to which the AVX-512 kernels keep a weight tile in registers for every token of
// the call (a verification step: 1 + up to 15 drafts), so each weight is read from DRAM once.
inline constexpr int64_t kMaxStationaryTokens = 16;

// The float GEMMs' loop order (prefill): rows [row_begin, row_end) in blocks of kGemmRowBlock
// whose weights (48 rows: 192 KiB of F16 at 2048 columns) stay in L2 while every token of the
// call passes through them, kTokens at a time, each token tile's activations staying in L1
// across the block's row tiles. Calls tiles.template operator()<R>(r, t0, t1) for the R-row tile
// at row r (R = kRows, or 1 for a block's last rows) and tokens [t0, t1), t1 - t0 <= kTokens.
// Each weight row is read from memory once per call. Token blocks over all rows instead read
// every row again per 32 tokens: 17-24 % slower on 5632-row F16 matrices at 64-512 tokens (one
// thread, kernels_bench BM_GemmF16).
inline constexpr int64_t kGemmRowBlock = 48;

template <int kRows, int kTokens, class Tiles>
void row_blocked_gemm(int64_t row_begin, int64_t row_end, int64_t num_tokens, const Tiles& tiles) {
  static_assert(kGemmRowBlock % kRows == 0);
  for (int64_t rb = row_begin; rb < row_end; rb += kGemmRowBlock) {
    const int64_t re = std::min(row_end, rb + kGemmRowBlock);
    for (int64_t t = 0; t < num_tokens; t += kTokens) {
      const int64_t te = std::min(num_tokens, t + kTokens);
      int64_t r = rb;
      for (; r + kRows <= re; r += kRows) tiles.template operator()<kRows>(r, t, te);
      for (; r < re; ++r) tiles.template operator()<1>(r, t, te);
    }
  }
}

// x: [num_tokens, cols] -> out: [ceil(cols / 16), num_tokens, 16] (see MatmulArgs::xb).
void pack_x_blocked(const float* x, int64_t num_tokens, int64_t cols, float* out);

// Rows per tile of the AVX2 kernels; matmul() splits rows across threads in multiples of it.
inline constexpr int64_t kRowTile = 4;

// Below this many multiply-adds a matmul runs on the calling thread: waking workers costs more.
inline constexpr int64_t kMinParallelMacs = 1 << 15;
// Work chunks per thread of a parallel matmul, claimed dynamically (a preempted thread's chunks
// go to the others).
inline constexpr int64_t kChunksPerThread = 4;

// Whether `isa` has a packed kernel for w and w has its packed copy: Q8_0/Q4_0 on AVX-512, the
// affine types on AVX2 and AVX-512.
bool uses_packed(const WeightView& w, Isa isa);
// uses_packed, and not diverted to the scalar twin by set_affine_reference_path: the packed
// kernels are what matmul() runs for w.
bool takes_packed_path(const WeightView& w, Isa isa);

}  // namespace arbor::kernels::internal
