// Read-only memory-mapped file. Move-only; unmaps on destruction.
// Weights stay mmapped for the life of a model, so the page cache is the only copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace arbor {

class MappedFile {
 public:
  // Maps the whole file read-only. Errors name the path and the OS error.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Drops the whole pages inside [p, p + n) of a read-only file mapping from this process's
// resident set (madvise MADV_DONTNEED). The bytes stay readable: a later read faults them back
// in from the page cache. For weights that were copied into another layout.
void release_mapped_pages(const void* p, size_t n);

// Whole-file helpers. Errors name the path.
Result<std::string> read_file(const std::string& path);
// Writes to path.tmp then renames, so readers never see a half-written file.
Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace arbor
