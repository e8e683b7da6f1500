// GGUF reader and writer (versions 2 and 3).
//
// File layout (little-endian), see docs/gguf.md:
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv            (v1 used u32 counts: rejected)
//   n_kv × { string key | u32 value_type | value }
//   n_tensors × { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   tensor data; each tensor's offset is relative to the start of this section and aligned.
// string = u64 length + bytes (no terminator). array = u32 elem_type + u64 count + elements;
// arrays may nest.
//
// GgufFile validates everything while parsing (counts against the bytes left, dims, types,
// offsets and sizes inside the file) so a corrupt file is a Status naming the file, the byte
// offset and the problem — never a crash. Tensor data stays in the mmap: TensorInfo::data points
// into it and lives as long as the GgufFile.
//
// Thread-safety: a GgufFile is immutable after open() and may be read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "gguf/ggml_type.h"

namespace arbor::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
std::string_view value_type_name(ValueType t);

struct Value;
struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;  // every item has type elem_type

  friend bool operator==(const Array& a, const Array& b) = default;
};

// One metadata value. `bool` is stored as uint8_t-sized bool.
struct Value {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, Array, uint64_t, int64_t, double>;
  ValueType type = ValueType::kUint8;
  Storage data;

  static Value u8(uint8_t v) { return {ValueType::kUint8, v}; }
  static Value i8(int8_t v) { return {ValueType::kInt8, v}; }
  static Value u16(uint16_t v) { return {ValueType::kUint16, v}; }
  static Value i16(int16_t v) { return {ValueType::kInt16, v}; }
  static Value u32(uint32_t v) { return {ValueType::kUint32, v}; }
  static Value i32(int32_t v) { return {ValueType::kInt32, v}; }
  static Value u64(uint64_t v) { return {ValueType::kUint64, v}; }
  static Value i64(int64_t v) { return {ValueType::kInt64, v}; }
  static Value f64(double v) { return {ValueType::kFloat64, v}; }
  static Value f32(float v) { return {ValueType::kFloat32, v}; }
  static Value boolean(bool v) { return {ValueType::kBool, v}; }
  static Value str(std::string v) { return {ValueType::kString, std::move(v)}; }
  static Value string_array(const std::vector<std::string>& v);
  static Value f32_array(const std::vector<float>& v);
  static Value i32_array(const std::vector<int32_t>& v);
  // An array; CHECKs that every item has type elem_type.
  static Value array(ValueType elem_type, std::vector<Value> items);

  // Exact comparison (floats by value, so NaN != NaN).
  friend bool operator==(const Value& a, const Value& b) = default;
};

// A readable rendering: strings quoted and escaped, arrays as "[a, b, ... (N items)]" with at
// most max_items items shown (nested arrays too).
std::string value_to_string(const Value& v, size_t max_items = 8);

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the fastest-varying (row length)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // relative to the data section
  uint64_t size_bytes = 0;    // ggml_row_size(type, dims[0]) * rows
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives

  int64_t num_elements() const;
  std::span<const uint8_t> bytes() const { return {data, size_bytes}; }
};

// Limits that the reader enforces (as ggml does, plus a nesting bound for arrays of arrays).
inline constexpr uint32_t kGgmlMaxDims = 4;
inline constexpr size_t kGgmlMaxNameLength = 63;  // ggml's GGML_MAX_NAME (64) minus the NUL
inline constexpr int kMaxArrayNesting = 16;
// Each decoded item costs ~48 bytes, so a corrupt count could otherwise turn a multi-GB file
// into a 50x larger allocation. Real vocabularies and merge lists are < 1M items.
inline constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;
inline constexpr uint64_t kDefaultAlignment = 32;

class GgufFile {
 public:
  // Maps and parses `path`. A corrupt file is kDataLoss "FILE: at offset N: problem" (the
  // rules are in docs/gguf.md); an unreadable one kIoError. O(file metadata), tensor data is
  // not touched. Copies share the mapping.
  static Result<GgufFile> open(const std::string& path);
  // Parses bytes that the caller keeps alive (fuzz tests, in-memory files); `name` stands in
  // for the path in messages.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, const std::string& name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  const std::string& name() const { return name_; }
  std::span<const uint8_t> file_bytes() const { return bytes_; }

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;  // nullptr if absent; O(1)

  // Typed getters. Integer getters accept any integer value type that fits; a missing key is
  // kNotFound, a wrong type or out-of-range value kInvalidArgument, both naming the key.
  Result<std::string> get_string(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;  // accepts f32 and f64
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;  // any integer elems

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent; O(1)

 private:
  friend class GgufParser;

  std::shared_ptr<MappedFile> mapping_;  // null when parse()d from caller-owned bytes
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> key_index_;     // key -> index in metadata_
  std::unordered_map<std::string, size_t> tensor_index_;  // name -> index in tensors_
};

// Builds a GGUF file. Metadata and tensors are written in insertion order; tensor data is
// placed at increasing aligned offsets, zero-padded. The data section is padded to the
// alignment after every tensor (as ggml and gguf-py do).
//
// Alignment and the `general.alignment` key always agree: set_alignment() updates the key
// (adding it when the alignment is not the default 32), and set("general.alignment", u32)
// updates the alignment. Caller mistakes (non-power-of-two alignment, a tensor whose byte
// count does not match its dims, a duplicate or over-long tensor name) are CHECK failures.
// Not thread-safe.
class GgufWriter {
 public:
  // A writer holding `file`'s version, alignment, metadata and tensors (data referenced, not
  // copied: `file` must outlive the writer). Serialising it reproduces the file byte for byte
  // (tensors keep their offsets; the end of the file is padded only if the file's was).
  static GgufWriter from_file(const GgufFile& file);

  void set_version(uint32_t version);  // 2 or 3 (CHECKed)
  void set_alignment(uint64_t alignment);  // a power of two (CHECKed)
  uint64_t alignment() const { return alignment_; }
  // Whether the file ends padded to the alignment (default true, as ggml writes it). A file
  // without tensors ends right after the tensor infos when false.
  void set_pad_end(bool pad) { pad_end_ = pad; }

  // Sets or replaces a key (replacing keeps the key's original position).
  void set(std::string key, Value value);
  // Removing general.alignment resets the alignment to 32.
  void remove(std::string_view key);
  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;  // nullptr if absent

  // Adds a tensor whose bytes the writer keeps (owned) or references (caller keeps them alive).
  // dims in ggml order. CHECKs that data.size() == ggml_nbytes(type, dims).
  void add_tensor_owned(std::string name, GgmlType type, std::vector<int64_t> dims,
                        std::vector<uint8_t> data);
  void add_tensor_ref(std::string name, GgmlType type, std::vector<int64_t> dims,
                      std::span<const uint8_t> data);
  // A tensor whose bytes `generate` makes when the file is written (each write or serialize
  // calls it once and drops the bytes after writing them): a large model is held one tensor at
  // a time. The bytes must be ggml_nbytes(type, dims) long (CHECKed when written). An error it
  // returns ends write() with that error, naming the tensor (serialize() CHECKs).
  using TensorGenerator = std::function<Result<std::vector<uint8_t>>()>;
  void add_tensor_generated(std::string name, GgmlType type, std::vector<int64_t> dims,
                            TensorGenerator generate);
  size_t num_tensors() const { return tensors_.size(); }

  // The whole file as bytes (small files, tests), or streamed to `path` (written to
  // path + ".tmp", then renamed) with a progress bar on stderr. Errors name the path.
  std::string serialize() const;
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> owned;
    std::span<const uint8_t> data;  // points at `owned` or at caller memory
    TensorGenerator generate;  // instead of data (add_tensor_generated)
    uint64_t nbytes = 0;
    uint64_t offset = 0;  // explicit offset (from_file) or computed when serialising
    bool fixed_offset = false;
  };
  // Offsets (relative to the data section) of every tensor, in insertion order.
  std::vector<uint64_t> plan_offsets() const;
  // Magic, header, metadata and tensor infos, without the padding after them.
  std::string encode_meta(const std::vector<uint64_t>& offsets) const;
  void add_tensor(std::unique_ptr<PendingTensor> t);
  // fn(the tensor's bytes); false when fn is, or when the generator failed (*error set).
  template <class Fn>
  static bool with_bytes(const PendingTensor& t, const Fn& fn, Status* error);

  uint32_t version_ = 3;
  uint64_t alignment_ = kDefaultAlignment;
  bool pad_end_ = true;
  std::vector<KeyValue> metadata_;
  std::vector<std::unique_ptr<PendingTensor>> tensors_;
};

}  // namespace arbor::gguf
