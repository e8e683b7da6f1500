// Matrix multiplication of a (possibly quantised) weight matrix with f32 activations.
//
//   y[t, r] = sum_c W[r, c] * x[t, c]
//   W: [rows, cols] in ggml block encoding (WeightView), x: [num_tokens, cols] f32 row-major,
//   y: [num_tokens, rows] f32 row-major.
//
// Weight types with their own kernels: F32, F16, BF16, Q8_0, Q4_0 and the affine types (Q4_1,
// Q5_0, Q5_1, Q2_K..Q6_K, MXFP4, IQ4_NL, IQ4_XS: packed AVX2 / AVX-VNNI / AVX-512 VNNI kernels,
// kernels/packed_affine.h).
// Every other type that gguf::dequantize_row decodes (Q8_1, Q8_K) takes a generic path: each row
// is dequantised to f32 once per call and dotted with every token.
// For the quantised types the activations are quantised
// to int8 blocks of 32 with one f32 scale per block (d = max|x| / 127, q = round_even(x / d)),
// once per call and token, and the dot products run in int8 -> int32 with one float multiply
// per block pair; see docs/kernels.md. F16/BF16 weights are widened to f32 and use FMA.
// Kernels: scalar, AVX2 (F32/F16/BF16/Q8_0/Q4_0; the affine types on packed weights), AVX-512
// (F32/F16/BF16 GEMM; Q8_0/Q4_0 and the affine types on packed weights, see PackedWeights),
// chosen by active_isa().
// matmul() picks a GEMV kernel (few tokens: streams each weight row once, several rows at a
// time) or a tiled GEMM (many tokens: each weight block is loaded once per tile of tokens), and
// splits rows across the pool's threads. Scratch comes from the pool's workspace, so a
// steady-state call does not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "gguf/ggml_type.h"
#include "kernels/thread_pool.h"

namespace arbor::kernels {

struct WeightView {
  gguf::GgmlType type = gguf::GgmlType::kF32;  // see matmul_supported()
  const void* data = nullptr;  // `rows` rows of `cols` elements each, ggml block encoding
  int64_t rows = 0;            // output features
  int64_t cols = 0;            // input features (a multiple of the type's block size)
  size_t row_stride = 0;       // bytes between rows (weight_row_bytes(type, cols) when dense)
  // Optional: the same matrix as pack_weights() laid it out (owned elsewhere, e.g. by the model).
  // matmul() reads it instead of `data` when the active ISA has the packed kernel.
  const void* packed = nullptr;
};

// Weights repacked once (at model load) into the layout of the fastest kernel for this CPU:
// today Q8_0, Q4_0 and the affine types on AVX-512 VNNI, 16 rows interleaved per block so one
// vpdpbusd serves 16 rows (layout: docs/kernels.md, "Packed weights" and "Affine packed
// types"). About the size of the original tensor (docs/kernels.md has the table), padded to 16
// rows. Move-only owner of a 64-byte-aligned buffer.
class PackedWeights {
 public:
  const void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend PackedWeights pack_weights(const WeightView& w);
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t bytes_ = 0;
};

// True when this CPU has a packed kernel for `type` (independent of ARBOR_ISA, so a model packed
// once still runs when a test switches ISAs: the other kernels read `data`).
bool packing_available(gguf::GgmlType type);
// Repacks w (any row_stride). CHECKs packing_available(w.type).
PackedWeights pack_weights(const WeightView& w);
// The bytes of w's packed layout, and the same repacking into memory the caller owns (dst:
// packed_weight_bytes(w) bytes, 64-byte aligned; a model packs all its matrices into one
// huge-page buffer this way). CHECK packing_available(w.type).
size_t packed_weight_bytes(const WeightView& w);
void pack_weights_into(const WeightView& w, uint8_t* dst);

// True for the weight types matmul() and get_row() accept (see above).
bool matmul_supported(gguf::GgmlType type);
// True when matmul() multiplies `type` with activations rounded to bf16 on the active ISA: BF16
// weights on CPUs with AVX-512 BF16 (vdpbf16ps, twice the multiply-adds of widening to f32).
// matmul_ref_quantized_act then rounds them the same way.
bool rounds_acts_to_bf16(gguf::GgmlType type);
// v rounded to bf16 (nearest even; denormals to signed zero) and widened back, exactly as the
// kernels round activations.
float round_to_bf16(float v);
// True for the types whose kernels quantise activations to int8 and multiply in integers (Q8_0,
// Q4_0, the affine types): their compute-bound figures are stated against the int8 peak.
bool int8_kernels(gguf::GgmlType type);

// Elements per block (1 for float types) and bytes per block; CHECKs matmul_supported(type).
int64_t weight_block_size(gguf::GgmlType type);
size_t weight_block_bytes(gguf::GgmlType type);
// Bytes of one dense row of `cols` elements; CHECKs that cols is a multiple of the block size.
size_t weight_row_bytes(gguf::GgmlType type, int64_t cols);
// A dense view (row_stride = weight_row_bytes(type, cols)).
WeightView make_weight_view(gguf::GgmlType type, const void* data, int64_t rows, int64_t cols);

// y = x W^T as above. x: [num_tokens, cols], y: [num_tokens, rows]; y must not alias x.
// Called from one thread (the pool's caller); uses all of the pool's threads.
// Batch invariant: y[t, r] depends, bit for bit, only on x[t], row r of w (and whether it is
// packed) and active_isa(); not on num_tokens, the other tokens or the pool's size
// (docs/kernels.md, "Batch invariance").
void matmul(const WeightView& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool);

// Several matrices applied to the same x: ys[i] = x ws[i]^T, each [num_tokens, ws[i]->rows].
// Equal to calling matmul() per matrix (bit for bit); when every matrix has the packed kernel
// with one type and cols, the activations are quantised once and all rows share one
// parallel_for (the Q/K/V and gate/up projections: fewer thread wake-ups per layer).
void matmul_multi(std::span<const WeightView* const> ws, const float* x, std::span<float* const> ys,
                  int64_t num_tokens, ThreadPool& pool);

// The canonical K segments of one matrix (docs/tensor_parallel.md): segs[i] is the column slice
// [i * cols, (i + 1) * cols) of it (every segment the same type, rows and cols, a multiple of the
// type's block size), x: [num_tokens, segs.size() * cols], ys[i]: [num_tokens, rows] = x's
// columns of segment i times segs[i]^T. Equal, bit for bit, to matmul() of each segment with its
// columns of x copied out: a segment's products do not depend on the other segments, on which
// process computes them or on the thread count. When every segment has the packed kernel the
// activations are quantised once and all segments share one parallel_for (the row-parallel
// attn_output and ffn_down of every layer).
void matmul_segments(std::span<const WeightView* const> segs, const float* x,
                     std::span<float* const> ys, int64_t num_tokens, ThreadPool& pool);

// Naive twin: dequantises each weight row to f32 and accumulates in double with f32
// activations (no activation quantisation). The accuracy yardstick for every type.
void matmul_ref(const WeightView& w, const float* x, float* y, int64_t num_tokens);

// Naive twin of the quantised path: quantises x exactly as matmul() does (for Q8_0/Q4_0 and the
// affine types; rounds it to bf16 where rounds_acts_to_bf16; else it equals matmul_ref) and accumulates integer block dot
// products, so matmul() must agree with it up to f32 summation order.
void matmul_ref_quantized_act(const WeightView& w, const float* x, float* y, int64_t num_tokens);

// The reference path of the model tests: while on, matmul() multiplies the affine types (Q4_1,
// Q5_0, Q5_1, Q2_K..Q6_K, MXFP4, IQ4_NL, IQ4_XS) with their scalar kernel — bit-identical to the packed kernels by
// construction (kernels/packed_affine.h) — whatever the ISA and whether a packed copy exists,
// while every other kernel keeps the active ISA. Process-wide; set it between calls only.
void set_affine_reference_path(bool on);

// Threshold on num_tokens at and above which matmul() uses the tiled GEMM (exposed for tests and
// benchmarks, which exercise both sides).
inline constexpr int64_t kGemmMinTokens = 4;

}  // namespace arbor::kernels
