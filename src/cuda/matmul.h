// Matrix multiplication on the GPU: y = x W^T with W in its GGUF (ggml block) encoding.
//
//   W: [rows, cols], `rows` rows of weight_row_bytes(type, cols) bytes each (row_stride apart),
//      uploaded to the device unchanged from the GGUF file: the device reads ggml's blocks.
//   x: [num_tokens, cols] f32, y: [num_tokens, rows] f32, both device pointers, y not aliasing x.
//
// Types: F32, F16, BF16, Q8_0, Q4_0 and the affine types Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K (matmul_supported; cols a multiple of the type's block size); the forward refuses a
// model with another matrix type on the GPU at load, naming the tensor. Q8_0, Q4_0 and the
// affine types multiply the activations quantised to int8 per block of 32 exactly as the CPU's
// kernels do (and the affine types take the CPU's f32 step per block), so they agree with
// kernels::matmul_ref_quantized_act up to f32 summation order.
//
// Batch invariance (the contract speculative decoding depends on): y[t, r] depends, bit for bit,
// only on x[t] and row r of W — not on num_tokens, on the other tokens of the call, or on which
// kernel variant (decode GEMV or multi-token GEMM) served the call. Every variant therefore
// reduces each output over `cols` in one fixed order.
//
// Everything is issued on `stream` and returns at once; `workspace` (device memory of at least
// matmul_workspace_bytes(w, num_tokens) bytes) must stay untouched until the call has run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/ggml_type.h"
#include "kernels/matmul.h"

// The CUDA runtime's stream handle, declared as cuda_runtime.h does, so that this header is
// usable from code not compiled by nvcc.
typedef struct CUstream_st* cudaStream_t;

namespace arbor::cuda {

bool matmul_supported(gguf::GgmlType type);

// Device scratch bytes matmul() needs for this matrix and token count (0 allowed).
size_t matmul_workspace_bytes(const kernels::WeightView& w, int32_t num_tokens);

// y = x W^T; w.data is the device copy of the matrix (w.packed is ignored).
void matmul(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
            void* workspace, cudaStream_t stream);

// Naive twin: one thread per output, each weight dequantised to f32, f32 activations,
// accumulated in double. The yardstick of the GPU tests.
void matmul_ref(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
                cudaStream_t stream);

// out[i] = row ids[i] of W dequantised to f32 (the embedding lookup). ids: [n] device int32,
// each in [0, rows); out: [n, cols] device f32.
void get_rows(const kernels::WeightView& w, const int32_t* ids, int32_t n, float* out,
              cudaStream_t stream);

}  // namespace arbor::cuda
