// Helpers shared by the kernels tests: seeded random data, weight encoding per type, and an ISA
// scope that switches the kernels' dispatch for the duration of a test.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "gguf/ggml_type.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace arbor::kernels::testing {

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
