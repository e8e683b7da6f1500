#include "model/forward_ops.h"

#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "base/check.h"

namespace arbor::model {

namespace {

// Host memory. Allocations are anonymous mappings (page-aligned, zeroed,
// committed on first touch); their sizes are kept so release() can unmap them.
class HostMemory final : public DeviceMemory {
public:
  std::string_view name() const override { return "cpu"; }
  bool is_host() const override { return true; }

  Result<void *> allocate(size_t bytes) override {
    if (bytes == 0)
      bytes = 1;
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return resource_exhausted("cannot map ", bytes, " bytes of host memory");
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    return p;
  }

  void release(void *p) override {
    if (p == nullptr)
      return;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(p);
      ARBOR_CHECK(it != sizes_.end())
          << "release of host memory that allocate() did not return";
      bytes = it->second;
      sizes_.erase(it);
    }
    munmap(p, bytes);
  }

  void copy(std::span<const Copy> copies) override {
    for (const Copy &c : copies)
      std::memmove(c.dst, c.src, c.bytes);
  }
  void to_device(void *dst, const void *src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void to_host(void *dst, const void *src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }

private:
  std::mutex mu_;
  std::unordered_map<void *, size_t> sizes_;
};

} // namespace

DeviceMemory &host_memory() {
  static HostMemory *memory =
      new HostMemory(); // never destroyed: outlives every user
  return *memory;
}

} // namespace arbor::model
