// The RoPE frequency table of a RopeVariant (model_config.h), as llama.cpp's ggml_rope_ext
// computes its angles: pair i at position p turns by p * inv_freq[i], and cos / sin are scaled
// by the variant's mscale.
//
//   base[i]     = theta^(-2i / rope_dim) / factors[i]            (factors: null = all ones)
//   kNone       inv_freq[i] = base[i]
//   kLinear,
//   kLongRope   inv_freq[i] = base[i] * freq_scale
//   kYarn       inv_freq[i] = base[i] * (freq_scale * (1 - r[i]) + r[i]), with the ramp
//               r[i] = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) over the correction band
//               [lo, hi] of ggml_rope_yarn_corr_dims(rope_dim, original_context, theta,
//               beta_fast, beta_slow) — YaRN's blend of interpolated and extrapolated angles,
//               which is linear in p, so a per-pair frequency
//   kLlama3     kernels::rope_inv_freqs' Llama 3 bands
#pragma once

#include <vector>

#include "model/model_config.h"

namespace arbor::model {

// [rope_dim / 2] radians per position. factors: [rope_dim / 2] divisors or null.
std::vector<float> rope_inv_freq(const RopeVariant& r, int rope_dim, const float* factors);

}  // namespace arbor::model
