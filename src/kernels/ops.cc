#include "kernels/ops.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <vector>
#include <cmath>
#include <limits>
#include <numbers>

#include "base/check.h"
#include "base/fp16.h"
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

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void gelu_mul(float* gate, const float* up, int64_t n) {
  if (use_avx2()) return internal::gelu_mul_avx2(gate, up, n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float u = kGeluC * (g + kGeluA * g * g * g);
    gate[i] = g / (1.0f + std::exp(-2.0f * u)) * up[i];
  }
}

void gelu_mul_ref(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double t = std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g));
    gate[i] = static_cast<float>(0.5 * g * (1.0 + t) * up[i]);
  }
}

void swiglu_oai(float* gate, const float* up, int64_t n, float alpha, float limit) {
  if (use_avx2()) return internal::swiglu_oai_avx2(gate, up, n, alpha, limit);
  swiglu_oai_ref(gate, up, n, alpha, limit);
}

void swiglu_oai_ref(float* gate, const float* up, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    // Comparisons written so that a NaN stays a NaN (std::min / std::clamp would keep it too,
    // but only by argument order).
    const float g = gate[i] > limit ? limit : gate[i];
    const float u = up[i] > limit ? limit : (up[i] < -limit ? -limit : up[i]);
    gate[i] = g / (1.0f + std::exp(alpha * -g)) * (u + 1.0f);
  }
}

void softcap(float* x, int64_t n, float cap) {
  if (use_avx2()) return internal::softcap_avx2(x, n, cap);
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = cap * (1.0f - 2.0f / (std::exp(2.0f * (x[i] * inv)) + 1.0f));
  }
}

void softcap_ref(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(cap * std::tanh(static_cast<double>(x[i]) / cap));
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

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  if (use_avx2()) return internal::f32_to_f16_avx2(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

bool any_nonfinite(const float* x, int64_t n) {
  if (use_avx2()) return internal::any_nonfinite_avx2(x, n);
  uint32_t bad = 0;  // an all-ones exponent: Inf or NaN
  for (int64_t i = 0; i < n; ++i) {
    bad |= (std::bit_cast<uint32_t>(x[i]) & 0x7F800000u) == 0x7F800000u;
  }
  return bad != 0;
}

namespace {

// An unsigned key whose order is the float order of `score` (-0 and +0 equal): the sign bit
// set for non-negative values, every bit flipped for negative ones.
uint32_t order_key(float score) {
  if (score == 0.0f) score = 0.0f;
  const auto u = std::bit_cast<uint32_t>(score);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// The maximum of row [cols], cols >= 1; `finite` = whether every entry is finite. Eight
// independent lanes, so the loop is not one long dependency chain (max is order-free on finite
// values, up to the sign of a zero maximum, which no score depends on).
float finite_max(const float* row, int32_t cols, bool& finite) {
  constexpr int kLanes = 8;
  float lane_max[kLanes];
  std::fill_n(lane_max, kLanes, row[0]);
  bool bad = false;
  int32_t c = 0;
  for (; c + kLanes <= cols; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = row[c + j];
      bad |= !(std::fabs(v) <= std::numeric_limits<float>::max());
      lane_max[j] = v > lane_max[j] ? v : lane_max[j];
    }
  }
  for (; c < cols; ++c) {
    bad |= !std::isfinite(row[c]);
    lane_max[0] = row[c] > lane_max[0] ? row[c] : lane_max[0];
  }
  finite = !bad;
  return *std::max_element(lane_max, lane_max + kLanes);
}

}  // namespace

// One pass for finiteness and the maximum, one that keeps the k largest (score key, ~id) pairs
// in a min-heap (most columns are rejected by one comparison with its smallest); they go out in
// id order.
void top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                int32_t* ids, float* values) {
  ARBOR_CHECK(k >= 1 && k <= cols) << "top_k_rows k " << k << " of " << cols;
  std::vector<uint64_t> heap;
  heap.reserve(static_cast<size_t>(k));
  for (int32_t r = 0; r < n; ++r) {
    const float* row = x + static_cast<size_t>(r) * cols;
    int32_t* out_ids = ids + static_cast<size_t>(r) * k;
    float* out_values = values + static_cast<size_t>(r) * k;
    bool finite = true;
    const float max = finite_max(row, cols, finite);
    if (!finite) {
      std::fill_n(out_ids, k, -1);
      continue;
    }
    heap.clear();
    // The score is non-decreasing in the logit and columns come in increasing id, so a column
    // whose logit is <= the heap's smallest one's cannot beat it: one float comparison.
    float smallest = -std::numeric_limits<float>::infinity();
    for (int32_t c = 0; c < cols; ++c) {
      if (heap.size() == static_cast<size_t>(k) && row[c] <= smallest) continue;
      const uint64_t key = static_cast<uint64_t>(order_key((row[c] - max) * scale[r])) << 32 |
                           ~static_cast<uint32_t>(c);
      if (heap.size() < static_cast<size_t>(k)) {
        heap.push_back(key);
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      } else if (key > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        heap.back() = key;
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      } else {
        continue;
      }
      if (heap.size() == static_cast<size_t>(k)) {
        smallest = row[~static_cast<uint32_t>(heap.front())];
      }
    }
    for (int32_t j = 0; j < k; ++j) {
      out_ids[j] = static_cast<int32_t>(~static_cast<uint32_t>(heap[static_cast<size_t>(j)]));
    }
    std::sort(out_ids, out_ids + k);
    for (int32_t j = 0; j < k; ++j) out_values[j] = row[out_ids[j]];
  }
}

}  // namespace arbor::kernels
