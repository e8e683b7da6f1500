// Internal to the kernels module: AVX2 versions of the row ops (ops_avx2.cc), called by ops.cc
// when active_isa() is kAvx2.
#pragma once

#include <cstdint>

namespace arbor::kernels::internal {

void rms_norm_avx2(const float* x, const float* weight, float* y, int64_t n, float eps);
void silu_mul_avx2(float* gate, const float* up, int64_t n);
void gelu_mul_avx2(float* gate, const float* up, int64_t n);
void softcap_avx2(float* x, int64_t n, float cap);
void swiglu_oai_avx2(float* gate, const float* up, int64_t n, float alpha, float limit);
void softmax_avx2(float* x, int64_t n);
void add_avx2(float* y, const float* x, int64_t n);
void axpy_avx2(float* y, float a, const float* x, int64_t n);
void scale_avx2(float* x, float s, int64_t n);
float dot_f32_avx2(const float* a, const float* b, int64_t n);
void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n);
bool any_nonfinite_avx2(const float* x, int64_t n);

}  // namespace arbor::kernels::internal
