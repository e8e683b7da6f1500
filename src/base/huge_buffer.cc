#include "base/huge_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace arbor {

Result<HugePageBuffer> HugePageBuffer::allocate(size_t bytes) {
  if (bytes == 0) return invalid_argument("a huge-page buffer of 0 bytes");
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Map one huge page more than needed, then unmap the unaligned head and the tail beyond it.
  const size_t reserve = mapped + kHugePage;
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("cannot map ", bytes, " bytes for the packed weights: ",
                              std::strerror(errno));
  }
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) ::munmap(p, aligned - base);
  const uintptr_t end = base + reserve;
  if (end > aligned + mapped) {
    ::munmap(reinterpret_cast<void*>(aligned + mapped), end - aligned - mapped);
  }
  HugePageBuffer b;
  b.data_ = reinterpret_cast<uint8_t*>(aligned);
  b.size_ = bytes;
  b.mapped_ = mapped;
  b.advised_ = ::madvise(b.data_, mapped, MADV_HUGEPAGE) == 0;
  return b;
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      advised_(std::exchange(other.advised_, false)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    advised_ = std::exchange(other.advised_, false);
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() { release(); }

void HugePageBuffer::release() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
}

}  // namespace arbor
