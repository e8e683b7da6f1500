#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "base/check.h"
#include "kernels/cpu_features.h"
#include "kernels/ops_internal.h"

namespace arbor::kernels {

namespace {

bool use_avx2() { return active_isa() >= Isa::kAvx2; }

constexpr int kMaxRotDim = 1024;

// Llama 3 scaling of one inverse frequency (radians per position), as in Meta's reference code
// and llama.cpp: long wavelengths are slowed by `factor`, short ones kept, the band between
// interpolated.
double llama3_scale(double inv_freq, const RopeParams& p) {
  const double wavelen = 2.0 * std::numbers::pi / inv_freq;
  const double low_wavelen = p.original_context / static_cast<double>(p.low_freq_factor);
  const double high_wavelen = p.original_context / static_cast<double>(p.high_freq_factor);
  if (wavelen < high_wavelen) return inv_freq;
  if (wavelen > low_wavelen) return inv_freq / p.factor;
  const double smooth = (p.original_context / wavelen - p.low_freq_factor) /
                        (static_cast<double>(p.high_freq_factor) - p.low_freq_factor);
  return (1.0 - smooth) * inv_freq / p.factor + smooth * inv_freq;
}

// Inverse frequencies in double: angles reach 1e5 rad at long positions, where an f32
// frequency would already move them by ~1e-2 rad.
void inv_freqs_f64(const RopeParams& p, int rot_dim, double* out) {
  ARBOR_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= kMaxRotDim) << "rot_dim " << rot_dim;
  for (int i = 0; i < rot_dim / 2; ++i) {
    double f = std::pow(static_cast<double>(p.theta), -2.0 * i / rot_dim);
    if (p.factor != 0.0f) f = llama3_scale(f, p);
    out[i] = f;
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (use_avx2()) return internal::rms_norm_avx2(x, weight, y, n, eps);
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

void rms_norm_ref(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * inv * weight[i]);
}

void rope_inv_freqs(const RopeParams& p, int rot_dim, float* out) {
  double f[kMaxRotDim / 2];
  inv_freqs_f64(p, rot_dim, f);
  for (int i = 0; i < rot_dim / 2; ++i) out[i] = static_cast<float>(f[i]);
}

void rope_cos_sin(const RopeParams& p, int rot_dim, int32_t pos, float* cos_out, float* sin_out) {
  double inv_freq[kMaxRotDim / 2];
  inv_freqs_f64(p, rot_dim, inv_freq);
  for (int i = 0; i < rot_dim / 2; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

void rope_apply(float* x, int num_heads, int head_dim, int rot_dim, bool neox, const float* cos,
                const float* sin) {
  ARBOR_CHECK(rot_dim <= head_dim && rot_dim % 2 == 0) << rot_dim << " vs " << head_dim;
  const int half = rot_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int i0 = neox ? i : 2 * i;
      const int i1 = neox ? i + half : 2 * i + 1;
      const float a = v[i0], b = v[i1];
      v[i0] = a * cos[i] - b * sin[i];
      v[i1] = a * sin[i] + b * cos[i];
    }
  }
}

void rope(float* x, int num_heads, int head_dim, int rot_dim, int32_t pos, const RopeParams& p) {
  float cos[kMaxRotDim / 2], sin[kMaxRotDim / 2];
  rope_cos_sin(p, rot_dim, pos, cos, sin);
  rope_apply(x, num_heads, head_dim, rot_dim, p.neox, cos, sin);
}

void rope_ref(float* x, int num_heads, int head_dim, int rot_dim, int32_t pos,
              const RopeParams& p) {
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < rot_dim / 2; ++i) {
      double f = std::pow(static_cast<double>(p.theta), -2.0 * i / rot_dim);
      if (p.factor != 0.0f) f = llama3_scale(f, p);
      const double angle = pos * f;
      const int i0 = p.neox ? i : 2 * i;
      const int i1 = p.neox ? i + rot_dim / 2 : 2 * i + 1;
      const double a = v[i0], b = v[i1];
      v[i0] = static_cast<float>(a * std::cos(angle) - b * std::sin(angle));
      v[i1] = static_cast<float>(a * std::sin(angle) + b * std::cos(angle));
    }
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  if (use_avx2()) return internal::silu_mul_avx2(gate, up, n);
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void silu_mul_ref(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void softmax(float* x, int64_t n) {
  if (use_avx2()) return internal::softmax_avx2(x, n);
  softmax_ref(x, n);
}

void softmax_ref(float* x, int64_t n) {
  ARBOR_CHECK_GE(n, 1);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void add(float* y, const float* x, int64_t n) {
  if (use_avx2()) return internal::add_avx2(y, x, n);
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void axpy(float* y, float a, const float* x, int64_t n) {
  if (use_avx2()) return internal::axpy_avx2(y, a, x, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale(float* x, float s, int64_t n) {
  if (use_avx2()) return internal::scale_avx2(x, s, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  if (use_avx2()) return internal::dot_f32_avx2(a, b, n);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace arbor::kernels
