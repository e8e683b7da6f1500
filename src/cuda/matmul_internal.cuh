// Internals of the GPU matmul (cuda/matmul.h): the K-slice plan every variant shares, the
// parameter blocks of the kernels and their launchers. Layouts and the batch-invariance
// argument: docs/cuda.md, "Matmul".
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/ggml_dequant.h"
#include "gguf/ggml_type.h"

namespace arbor::cuda::internal {

// Rows per MMA tile (the M of m16n8k16 / m16n8k32) and tokens per MMA (its N).
inline constexpr int kRowTile = 16;
inline constexpr int kTokTile = 8;
// Columns per K step of the tensor-core kernels: two f16/bf16 m16n8k16 MMAs, or one int8
// m16n8k32 MMA (one ggml block of 32).
inline constexpr int kChunk = 32;
// At most this many K slices per row (one warp each in a block of 32 * slices threads).
inline constexpr int kMaxSlices = 16;
// Chunks whose loads a warp issues before it computes on them; a slice's chunk count is a
// multiple of it.
inline constexpr int kUnroll = 4;

// Chunks per K-quant super-block (256 columns): the affine kernel's slices hold whole ones.
inline constexpr int kUnitChunks = 8;

// How a row's `cols` are cut into K slices. A function of cols and the weight type alone: every
// call on a matrix, whatever its token count, sums the same chunks in each slice and the slices
// in the same order (the batch invariance of the tensor-core kernels).
struct SlicePlan {
  int32_t chunks = 0;            // ceil(cols / kChunk)
  int32_t chunks_per_slice = 0;  // a multiple of `align`; the last slice may have fewer
  int32_t slices = 0;            // ceil(chunks / chunks_per_slice), 1..kMaxSlices
};
// align: a multiple of kUnroll (kUnitChunks for the K-quants, whose super-blocks a slice must
// not cut).
SlicePlan slice_plan(int64_t cols, int32_t align = kUnroll);

// Tokens per block of the tensor-core kernels: kTokTile * token_tiles(num_tokens), with
// token_tiles 1 (1..8 tokens, decode), 2 (9..16) or 4 (more).
int token_tiles(int32_t num_tokens);

// The tensor-core kernels' arguments.
struct MmaArgs {
  const uint8_t* w = nullptr;  // [rows] rows of row_stride bytes, ggml encoding
  size_t row_stride = 0;
  int32_t rows = 0;
  int32_t cols = 0;
  // Activations: F16/BF16: [num_tokens, cols] halves (launch_round_acts); Q8_0/Q4_0 and the
  // affine types: [num_tokens, cols] int8 (launch_quantize_acts).
  const void* acts = nullptr;
  const float* act_scales = nullptr;          // Q8_0/Q4_0: [num_tokens, cols / 32]
  const ggml::ActSums* act_sums = nullptr;    // affine types: [num_tokens, cols / 32]
  int32_t num_tokens = 0;
  float* y = nullptr;  // [num_tokens, rows]
  SlicePlan plan;
};

// Rounds x [num_tokens, cols] to f16 (bf16 = false) or bf16, nearest even: out [num_tokens, cols].
void launch_round_acts(const float* x, int64_t n, bool bf16, uint16_t* out, cudaStream_t stream);
// Quantises x [num_tokens, cols] per block of 32 exactly as the CPU does
// (kernels::internal::quantize_act_row_scalar): qs [num_tokens, cols], and either the scales
// d [num_tokens, cols / 32] (sums null) or, for the affine types, sums [num_tokens, cols / 32]
// (d null) as kernels::internal::pack_act_row_affine forms them. per_unit (the K-quants; cols a
// multiple of 256): one scale per 256 columns, and the sums without it (ggml::ActSums).
void launch_quantize_acts(const float* x, int32_t num_tokens, int32_t cols, int8_t* qs, float* d,
                          ggml::ActSums* sums, bool per_unit, cudaStream_t stream);

// y = x W^T on tensor cores for F16/BF16 (args.acts rounded by launch_round_acts) and Q8_0/Q4_0
// (args.acts quantised by launch_quantize_acts).
void launch_mma(gguf::GgmlType type, const MmaArgs& args, cudaStream_t stream);

// The affine types (ggml::is_affine) on int8 tensor cores: args.acts and args.act_sums from
// launch_quantize_acts; per block the CPU's f32 step (ggml::affine_step).
void launch_affine(gguf::GgmlType type, const MmaArgs& args, cudaStream_t stream);

// F32 weights: fixed-order f32 FMA chains on CUDA cores (no TF32). x: [num_tokens, cols].
void launch_f32(const uint8_t* w, size_t row_stride, int32_t rows, int32_t cols, const float* x,
                int32_t num_tokens, float* y, cudaStream_t stream);

// Naive kernels: one thread per output (double accumulation) and one block per gathered row.
void launch_ref(gguf::GgmlType type, const uint8_t* w, size_t row_stride, int32_t rows,
                int32_t cols, const float* x, int32_t num_tokens, float* y, cudaStream_t stream);
void launch_get_rows(gguf::GgmlType type, const uint8_t* w, size_t row_stride, int32_t rows,
                     int32_t cols, const int32_t* ids, int32_t n, float* out, cudaStream_t stream);

// CHECKs that the last launch was accepted, naming it.
void check_launch(const char* what);

}  // namespace arbor::cuda::internal
