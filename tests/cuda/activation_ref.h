// The CPU reference of cuda::matmul with the activations the GPU multiplies (src/cuda/matmul.h):
// F32 takes x; F16 / BF16 take x rounded to f16 / bf16 (nearest even) for the tensor cores;
// Q8_0, Q4_0 and the affine types take x quantised to int8 blocks of 32, as the CPU's kernels do
// (kernels::matmul_ref_quantized_act). GPU and reference then differ only in f32 summation order.
#pragma once

#include <cstdint>
#include <vector>

#include "base/fp16.h"
#include "cuda/ggml_dequant.h"
#include "kernels/matmul.h"

namespace arbor::cuda::testing {

// The types whose activations the GPU quantises to int8 blocks of 32.
inline bool quantised_activations(gguf::GgmlType t) {
  return t == gguf::GgmlType::kQ8_0 || t == gguf::GgmlType::kQ4_0 || ggml::is_affine(t);
}

// x as the float kernels multiply it: rounded to f16 / bf16 for those weight types, else as is.
inline std::vector<float> rounded_activations(gguf::GgmlType type, const std::vector<float>& x) {
  std::vector<float> out = x;
  if (type == gguf::GgmlType::kF16) {
    for (float& v : out) v = fp16_to_fp32(fp32_to_fp16(v));
  } else if (type == gguf::GgmlType::kBF16) {
    for (float& v : out) v = bf16_to_fp32(fp32_to_bf16(v));
  }
  return out;
}

// y [num_tokens, w.rows] = x [num_tokens, w.cols] W^T on the host, with the GPU's activations.
inline std::vector<float> matmul_same_activations(const kernels::WeightView& w,
                                                  const std::vector<float>& x,
                                                  int32_t num_tokens) {
  std::vector<float> y(static_cast<size_t>(num_tokens) * static_cast<size_t>(w.rows));
  if (quantised_activations(w.type)) {
    kernels::matmul_ref_quantized_act(w, x.data(), y.data(), num_tokens);
  } else {
    const std::vector<float> xr = rounded_activations(w.type, x);
    kernels::matmul_ref(w, xr.data(), y.data(), num_tokens);
  }
  return y;
}

}  // namespace arbor::cuda::testing
