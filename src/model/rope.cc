#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace arbor::model {
namespace {

// ggml_rope_yarn_corr_dim: the pair index whose wavelength fits n_rot turns in the original
// context.
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) /
         (2 * std::log(base));
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeVariant& r, int rope_dim, const float* factors) {
  const int half = rope_dim / 2;
  std::vector<float> inv(half);
  kernels::RopeParams p;
  p.theta = r.theta;
  if (r.scaling == RopeScaling::kLlama3) {
    p.factor = r.llama3_factor;
    p.low_freq_factor = r.llama3_low_freq_factor;
    p.high_freq_factor = r.llama3_high_freq_factor;
    p.original_context = r.original_context;
  }
  if (half > 0) kernels::rope_inv_freqs(p, rope_dim, inv.data());
  if (factors != nullptr) {
    for (int i = 0; i < half; ++i) inv[i] /= factors[i];
  }
  switch (r.scaling) {
    case RopeScaling::kNone:
    case RopeScaling::kLlama3:
      break;
    case RopeScaling::kLinear:
    case RopeScaling::kLongRope:
      for (float& f : inv) f *= r.freq_scale;
      break;
    case RopeScaling::kYarn: {
      const float lo = std::max(
          0.0f, std::floor(yarn_corr_dim(rope_dim, r.original_context, r.yarn_beta_fast, r.theta)));
      const float hi = std::min(
          static_cast<float>(rope_dim - 1),
          std::ceil(yarn_corr_dim(rope_dim, r.original_context, r.yarn_beta_slow, r.theta)));
      for (int i = 0; i < half; ++i) {
        const float y = (static_cast<float>(i) - lo) / std::max(0.001f, hi - lo);
        const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
        inv[i] *= r.freq_scale * (1.0f - ramp) + ramp;
      }
      break;
    }
  }
  return inv;
}

}  // namespace arbor::model
