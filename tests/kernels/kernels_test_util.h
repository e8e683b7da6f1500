// Helpers shared by the kernels tests: seeded random data, weight encoding per type, and an ISA
// scope that switches the kernels' dispatch for the duration of a test.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gguf/ggml_type.h"
#include "kernels/cpu_features.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"

namespace arbor::kernels::testing {

// The head and page shape of a paged-attention test.
struct AttnGeometry {
  int num_q_heads = 8;
  int num_kv_heads = 4;
  int head_dim = 16;
  int block_size = 16;
  KvDtype dtype = KvDtype::kF32;
};

// PagedAttentionParams with the geometry's shape, scale 1/sqrt(head_dim) and the KV pools (the
// F32 or the F16 one, by g.dtype); the caller fills the batch arrays, q, out and masks.
inline PagedAttentionParams attention_params(const AttnGeometry& g, int num_seqs,
                                             const void* k32, const void* v32,
                                             const void* k16, const void* v16) {
  PagedAttentionParams p;
  p.num_seqs = num_seqs;
  p.num_q_heads = g.num_q_heads;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.block_size = g.block_size;
  p.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
  p.kv_dtype = g.dtype;
  const bool f16 = g.dtype == KvDtype::kF16;
  p.k_cache = f16 ? k16 : k32;
  p.v_cache = f16 ? v16 : v32;
  return p;
}

// Uniform floats in [lo, hi) from a seeded generator.
std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo = -1.0f, float hi = 1.0f);

// Encodes a row-major f32 matrix [rows, cols] as `type`, each row padded to `row_stride` bytes
// (0 = dense). Q8_0/Q4_0 use gguf::quantize_row (ggml's reference quantisation).
std::vector<uint8_t> encode_weights(gguf::GgmlType type, const std::vector<float>& w, int64_t rows,
                                    int64_t cols, size_t row_stride = 0);

// The ISAs this CPU can run: scalar up to best_isa().
std::vector<Isa> testable_isas();

// Sets active_isa() for its lifetime and restores the previous value.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(active_isa()) { set_active_isa(isa); }
  ~IsaScope() { set_active_isa(saved_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  Isa saved_;
};

}  // namespace arbor::kernels::testing
