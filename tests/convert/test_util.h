// Helpers for the converter tests: byte builders and GGUF comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "gguf/gguf.h"
#include "support/temp_dir.h"

namespace arbor::convert::testing {

inline void append_i32(std::vector<uint8_t>* out, int32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + 4);
}
inline void append_f32(std::vector<uint8_t>* out, float v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + 4);
}
inline void append_f32s(std::vector<uint8_t>* out, const std::vector<float>& v) {
  for (float f : v) append_f32(out, f);
}

// A scratch path unique to this process (tests/support).
using ::arbor::test::temp_path;

inline void write_bytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  ASSERT_TRUE(out.good()) << path;
}
inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  write_bytes(path, b.data(), b.size());
}
inline void write_text(const std::string& path, const std::string& s) {
  write_bytes(path, s.data(), s.size());
}

// The F32 values of a GGUF tensor of type F32, F16, BF16 or Q8_0.   // [num_elements]
inline std::vector<float> gguf_tensor_f32(const gguf::TensorInfo& t) {
  std::vector<float> out;
  const uint8_t* p = t.data;
  const int64_t n = t.num_elements();
  switch (t.type) {
    case gguf::GgmlType::kF32:
      out.resize(n);
      std::memcpy(out.data(), p, n * 4);
      break;
    case gguf::GgmlType::kF16:
    case gguf::GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out.push_back(t.type == gguf::GgmlType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h));
      }
      break;
    case gguf::GgmlType::kQ8_0:  // blocks of {f16 d, int8 q[32]}
      for (int64_t b = 0; b < n / 32; ++b) {
        uint16_t d;
        std::memcpy(&d, p + b * 34, 2);
        for (int i = 0; i < 32; ++i) {
          out.push_back(fp16_to_fp32(d) *
                        static_cast<float>(static_cast<int8_t>(p[b * 34 + 2 + i])));
        }
      }
      break;
    default:
      ADD_FAILURE() << "unexpected tensor type " << static_cast<int>(t.type);
  }
  return out;
}

}  // namespace arbor::convert::testing
