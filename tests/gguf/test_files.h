// Helpers shared by the gguf tests: the shared model files, a synthetic GGUF with every value
// type, and a little-endian byte builder for hand-made (corrupt) files. Shared-data paths come
// from tests/support (test::shared_path, test::require_shared_file).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "support/shared_data.h"

namespace arbor::gguf::test_files {

// Every .gguf under models/ and tokenizers/llamacpp-vocab/, sorted.
inline std::vector<std::string> shared_gguf_files() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const char* dir : {"models", "tokenizers/llamacpp-vocab"}) {
    const fs::path d = test::shared_path(dir);
    if (!fs::exists(d)) continue;
    for (const auto& e : fs::recursive_directory_iterator(d)) {
      if (e.is_regular_file() && e.path().extension() == ".gguf") out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// Metadata with every value type, nested arrays and empty strings/arrays; tensors of F32,
// F16, Q8_0, Q4_K and I32.
inline GgufWriter synthetic_writer(uint32_t version, uint64_t alignment) {
  GgufWriter w;
  w.set_version(version);
  w.set_alignment(alignment);
  w.set("general.architecture", Value::str("llama"));
  w.set("t.u8", Value::u8(200));
  w.set("t.i8", Value::i8(-100));
  w.set("t.u16", Value::u16(60000));
  w.set("t.i16", Value::i16(-30000));
  w.set("t.u32", Value::u32(4000000000u));
  w.set("t.i32", Value::i32(-2000000000));
  w.set("t.f32", Value::f32(1.5f));
  w.set("t.bool", Value::boolean(true));
  w.set("t.string", Value::str("hello \"gguf\"\n"));
  w.set("t.empty_string", Value::str(""));
  w.set("t.u64", Value::u64(uint64_t{1} << 60));
  w.set("t.i64", Value::i64(-(int64_t{1} << 60)));
  w.set("t.f64", Value::f64(-2.25));
  w.set("t.strings", Value::string_array({"a", "", "ccc"}));
  w.set("t.f32s", Value::f32_array({0.5f, -1.0f}));
  w.set("t.i32s", Value::i32_array({1, -2, 3}));
  w.set("t.empty_array", Value::array(ValueType::kUint8, {}));
  w.set("t.bools", Value::array(ValueType::kBool, {Value::boolean(false), Value::boolean(true)}));
  w.set("t.nested", Value::array(ValueType::kArray,
                                 {Value::i32_array({1, 2}), Value::i32_array({}),
                                  Value::array(ValueType::kArray, {Value::string_array({"x"})})}));
  w.add_tensor_owned("a.f32", GgmlType::kF32, {8, 3}, pattern_bytes(8 * 3 * 4, 1));
  w.add_tensor_owned("b.f16", GgmlType::kF16, {5}, pattern_bytes(10, 2));
  w.add_tensor_owned("c.q8_0", GgmlType::kQ8_0, {64, 2}, pattern_bytes(34 * 2 * 2, 3));
  w.add_tensor_owned("d.q4_K", GgmlType::kQ4_K, {256, 1, 1, 2}, pattern_bytes(144 * 2, 4));
  w.add_tensor_owned("e.i32", GgmlType::kI32, {3}, pattern_bytes(12, 5));
  return w;
}

// Little-endian byte builder for hand-made files.
class Bytes {
 public:
  template <typename T>
  Bytes& put(T v) {
    const size_t at = data_.size();
    data_.resize(at + sizeof(T));
    std::memcpy(data_.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& i64(int64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    data_.insert(data_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::string& s) {
    data_.insert(data_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  // A key with a u32 value.
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  // A tensor info.
  Bytes& tensor(const std::string& name, std::vector<int64_t> dims, uint32_t type,
                uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) i64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad_to(size_t alignment) {
    data_.resize((data_.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    data_.resize(data_.size() + n, 0);
    return *this;
  }
  size_t size() const { return data_.size(); }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

}  // namespace arbor::gguf::test_files
