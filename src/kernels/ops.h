// Element-wise and row operations of the forward pass, on raw f32 pointers.
//
// Each non-trivial op has a `_ref` twin (plain scalar, double accumulation where it matters)
// that the tests compare against. The fast versions dispatch on active_isa(); all are safe to
// call from any thread (no shared state) and never allocate.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace arbor::kernels {

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; x, weight, y: [n]. y may alias x.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);
void rms_norm_ref(const float* x, const float* weight, float* y, int64_t n, float eps);

// Rotary position embedding parameters.
struct RopeParams {
  float theta = 10000.0f;  // frequency base: inv_freq[i] = theta^(-2i / rot_dim)
  // false: rotate interleaved pairs (2i, 2i+1) (GGUF llama, llama2.c);
  // true: rotate halves (i, i + rot_dim/2) (NeoX, qwen2).
  bool neox = false;
  // Llama 3 frequency scaling; factor == 0 means none. Frequencies whose wavelength exceeds
  // original_context / low_freq_factor are divided by factor, those shorter than
  // original_context / high_freq_factor are kept, and the band between is interpolated.
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

// The rot_dim / 2 inverse frequencies (radians per position) after scaling. out: [rot_dim / 2].
void rope_inv_freqs(const RopeParams& p, int rot_dim, float* out);

// Rotates the first rot_dim dimensions of each head of one token in place.
// x: [num_heads, head_dim]; rot_dim even, <= head_dim, <= 1024. Angles are pos * inv_freq,
// computed once per call and shared by all heads.
void rope(float* x, int num_heads, int head_dim, int rot_dim, int32_t pos, const RopeParams& p);
void rope_ref(float* x, int num_heads, int head_dim, int rot_dim, int32_t pos, const RopeParams& p);

// Applies precomputed cos/sin (each [rot_dim / 2], from rope_cos_sin) to one token's heads, for
// callers that rotate q and k (or many layers) at the same position.
void rope_cos_sin(const RopeParams& p, int rot_dim, int32_t pos, float* cos_out, float* sin_out);
void rope_apply(float* x, int num_heads, int head_dim, int rot_dim, bool neox, const float* cos,
                const float* sin);

// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); gate, up: [n]. Element i's
// bits depend only on gate[i] and up[i], not on n or i (callers pass many tokens at once).
void silu_mul(float* gate, const float* up, int64_t n);
void silu_mul_ref(float* gate, const float* up, int64_t n);

// gate[i] = gelu_tanh(gate[i]) * up[i] with gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi)
// (g + 0.044715 g^3))), evaluated as g / (1 + exp(-2 u)) (the same function); [n]. Batch
// invariant like silu_mul: element i's bits depend only on gate[i] and up[i].
void gelu_mul(float* gate, const float* up, int64_t n);
void gelu_mul_ref(float* gate, const float* up, int64_t n);

// gpt-oss's clamped SwiGLU, as llama.cpp's ggml_swiglu_oai computes it: with g = min(gate[i],
// limit) and u = clamp(up[i], -limit, limit), gate[i] = g / (1 + exp(-alpha g)) * (u + 1);
// [n]. Element i's bits depend only on gate[i] and up[i]. A NaN input gives a NaN.
void swiglu_oai(float* gate, const float* up, int64_t n, float alpha, float limit);
void swiglu_oai_ref(float* gate, const float* up, int64_t n, float alpha, float limit);

// x[i] = cap * tanh(x[i] / cap) (soft-capping); [n], cap > 0. tanh as 1 - 2 / (exp(2y) + 1):
// absolute error about 1e-7 * cap. Element i's bits depend only on x[i] and cap.
void softcap(float* x, int64_t n, float cap);
void softcap_ref(float* x, int64_t n, float cap);

// In-place softmax of x: [n], max-subtracted (finite for any finite input; -inf entries give 0).
// n >= 1.
void softmax(float* x, int64_t n);
void softmax_ref(float* x, int64_t n);

// y += x; y, x: [n].
void add(float* y, const float* x, int64_t n);
// y += a * x; y, x: [n].
void axpy(float* y, float a, const float* x, int64_t n);
// x *= s; x: [n].
void scale(float* x, float s, int64_t n);
// sum_i a[i] * b[i]; a, b: [n].
float dot_f32(const float* a, const float* b, int64_t n);

// y[i] = fp32_to_fp16(x[i]) (base/fp16.h: round to nearest even, NaN -> sign | 0x7e00), bit for
// bit on every ISA; x: [n], y: [n].
void f32_to_f16(const float* x, uint16_t* y, int64_t n);
// Whether any x[i] is Inf or NaN; x: [n].
bool any_nonfinite(const float* x, int64_t n);

// Dequantises row `id` (0 <= id < w.rows) of w to f32 (embedding lookup). out: [w.cols].
void get_row(const WeightView& w, int64_t id, float* out);

// The k best entries of each row r < n of x ([n, cols]), 1 <= k <= cols (CHECKed), ranked by
// score descending, ties by id ascending, score(c) = (x[r, c] - max of row r) * scale[r] in
// float (a score of -0 counts as +0): sampling::Sampler's order for top_k at scale
// 1 / temperature. Written per row in increasing id: ids[r, j], values[r, j] = x[r, ids[r, j]],
// j < k; a row holding an Inf or NaN gets ids[r, j] = -1 (values unspecified).
// scale: [n] positive, finite; ids, values: [n, k]. O(cols log k) per row at worst (a heap of k;
// typically O(cols): most columns lose one comparison).
void top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                int32_t* ids, float* values);

}  // namespace arbor::kernels
