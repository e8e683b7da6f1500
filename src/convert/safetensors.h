// Safetensors reader (single file or a sharded `model.safetensors.index.json` set).
//
// File layout (https://github.com/huggingface/safetensors):
//   u64 header_len (little-endian) | header_len bytes of JSON | byte buffer
// The JSON maps tensor names to {"dtype": "F32", "shape": [d0, d1, ...],
// "data_offsets": [begin, end]} with offsets relative to the start of the byte buffer; the
// optional "__metadata__" entry maps strings to strings.
//
// Everything is validated while parsing: the header length against the file size, the JSON, each
// dtype name, shape × dtype size == end - begin (overflow-checked), every range inside the byte
// buffer, and no two ranges overlapping. Errors name the file and the tensor. Tensor bytes stay
// in the mmap and live as long as the SafetensorsFile.
//
// Thread-safety: immutable after open(); may be read from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"

namespace arbor::convert {

enum class StDtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E4M3,
  kF8E5M2,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};
std::string_view st_dtype_name(StDtype dtype);
size_t st_dtype_size(StDtype dtype);
// Parses "F32", "BF16", ... (exact spelling of the safetensors spec).
Result<StDtype> parse_st_dtype(std::string_view name);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;         // PyTorch order: shape[0] is the slowest-varying (rows)
  std::span<const uint8_t> bytes;     // into the owning file's mapping
  const std::string* file = nullptr;  // path of the file that holds it

  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  // Maps and parses `path`. Errors: "PATH: problem".
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses caller-owned bytes (tests); `bytes` must outlive the result.
  static Result<SafetensorsFile> parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return *path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensor* find(std::string_view name) const;  // nullptr if absent

 private:
  std::shared_ptr<MappedFile> mapping_;
  std::unique_ptr<std::string> path_;  // heap-allocated so StTensor::file stays valid on move
  std::vector<StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a Hugging Face checkpoint directory: `model.safetensors`, or the shards listed
// by `model.safetensors.index.json` (each shard must hold exactly the tensors the index maps to
// it; a name in two shards is an error).
class SafetensorsModel {
 public:
  static Result<SafetensorsModel> open_dir(const std::string& dir);

  const StTensor* find(std::string_view name) const;  // nullptr if absent
  // Every tensor, sorted by name.
  std::vector<const StTensor*> tensors() const;
  size_t num_files() const { return files_.size(); }
  // Union of the files' __metadata__ entries.
  std::map<std::string, std::string> metadata() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const StTensor*, std::less<>> by_name_;
};

}  // namespace arbor::convert
