// HugePageBuffer: zero-filled anonymous memory for large read-mostly data (the packed weights),
// 2 MiB-aligned and advised to the kernel as transparent-huge-page memory (MADV_HUGEPAGE), so a
// kernel streaming it takes one TLB entry per 2 MiB instead of per 4 KiB. Move-only; unmaps on
// destruction.
//
// Huge pages are advice: with transparent huge pages off ("never"), or no free 2 MiB page at a
// fault, the range is backed by 4 KiB pages and works the same. Only the pages written become
// resident (a huge page whole once any byte of it is), so the rounding to 2 MiB costs at most
// one huge page. Docs: docs/kernels.md, "Huge pages".
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace arbor {

class HugePageBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  // `bytes` (> 0) of zeros at a 2 MiB-aligned address. Errors name the size and the OS error.
  static Result<HugePageBuffer> allocate(size_t bytes);

  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }  // the bytes asked for
  // Whether the kernel accepted the huge-page advice for the range (false: 4 KiB pages).
  bool advised() const { return advised_; }

 private:
  void release();  // unmaps (if mapped)

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // size_ rounded up to kHugePage
  bool advised_ = false;
};

}  // namespace arbor
