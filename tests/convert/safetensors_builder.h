// Builds safetensors files (and whole tiny Hugging Face directories) for the converter tests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "test_util.h"

namespace arbor::convert::testing {

struct StEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

inline std::vector<uint8_t> encode_values(const std::string& dtype, const std::vector<float>& v) {
  std::vector<uint8_t> out;
  for (float f : v) {
    if (dtype == "F32") {
      append_f32(&out, f);
    } else {
      const uint16_t h = dtype == "F16" ? fp32_to_fp16(f) : fp32_to_bf16(f);
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
  }
  return out;
}

inline StEntry st_entry(std::string name, const std::string& dtype, std::vector<int64_t> shape,
                        const std::vector<float>& values) {
  return {std::move(name), dtype, std::move(shape), encode_values(dtype, values)};
}

// Header JSON with consecutive data_offsets.
inline nlohmann::json st_header(const std::vector<StEntry>& entries) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& e : entries) {
    h[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
  }
  return h;
}

// The file bytes for `header` (any JSON, possibly malformed on purpose) and the entries' data.
inline std::vector<uint8_t> st_bytes(const std::string& header,
                                     const std::vector<StEntry>& entries) {
  std::vector<uint8_t> out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : header) out.push_back(static_cast<uint8_t>(c));
  for (const auto& e : entries) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

inline std::vector<uint8_t> st_bytes(const std::vector<StEntry>& entries) {
  return st_bytes(st_header(entries).dump(), entries);
}

}  // namespace arbor::convert::testing
