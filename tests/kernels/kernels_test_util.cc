#include "kernels_test_util.h"

#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "gguf/quants.h"

namespace arbor::kernels::testing {

using gguf::GgmlType;

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

namespace {

void encode_row(GgmlType type, const float* src, int64_t cols, uint8_t* dst) {
  for (int64_t c = 0; c < cols; ++c) {
    switch (type) {
      case GgmlType::kF32:
        std::memcpy(dst + c * 4, src + c, 4);
        break;
      case GgmlType::kF16: {
        const uint16_t h = fp32_to_fp16(src[c]);
        std::memcpy(dst + c * 2, &h, 2);
        break;
      }
      case GgmlType::kBF16: {
        const uint16_t h = fp32_to_bf16(src[c]);
        std::memcpy(dst + c * 2, &h, 2);
        break;
      }
      default: {
        // gguf's scalar codecs are bit-exact with ggml's quantize_row_*_ref.
        const Status st = gguf::quantize_row(type, src, dst, cols);
        ARBOR_CHECK(st.ok()) << st.to_string();
        return;
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> encode_weights(GgmlType type, const std::vector<float>& w, int64_t rows,
                                    int64_t cols, size_t row_stride) {
  const size_t dense = weight_row_bytes(type, cols);
  if (row_stride == 0) row_stride = dense;
  // Padding bytes are filled with garbage so a kernel reading past a row shows up as an error.
  std::vector<uint8_t> out(row_stride * static_cast<size_t>(rows), 0xA5);
  for (int64_t r = 0; r < rows; ++r)
    encode_row(type, w.data() + r * cols, cols, out.data() + r * row_stride);
  return out;
}

std::vector<Isa> testable_isas() {
  std::vector<Isa> isas;
  for (int i = 0; i <= static_cast<int>(best_isa()); ++i) isas.push_back(static_cast<Isa>(i));
  return isas;
}

}  // namespace arbor::kernels::testing
