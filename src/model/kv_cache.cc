#include "model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"

namespace arbor::model {

size_t PagedKvCache::bytes_per_block(const KvCacheShape& s) {
  return (size_t)s.num_layers * 2 * s.num_kv_heads * s.block_size * s.head_dim *
         kernels::kv_dtype_size(s.dtype);
}

Result<int32_t> PagedKvCache::blocks_for_budget(const KvCacheShape& shape, int64_t budget_bytes) {
  const auto per_block = static_cast<int64_t>(bytes_per_block(shape));
  if (per_block <= 0) {
    return invalid_argument("KV cache shape: ", shape.num_layers, " layers, ", shape.num_kv_heads,
                            " kv heads, head_dim ", shape.head_dim, ", block_size ",
                            shape.block_size, " gives blocks of ", per_block, " bytes");
  }
  const int64_t n = budget_bytes <= 0 ? 0 : budget_bytes / per_block;
  if (n < 2) {
    return invalid_argument("KV budget of ", budget_bytes, " bytes holds ", n, " blocks of ",
                            per_block, " bytes (", shape.block_size,
                            " tokens); need at least 2 (the null block and one usable block)");
  }
  return static_cast<int32_t>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max()));
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const KvCacheShape& shape,
                                                          int64_t num_blocks, bool populate,
                                                          DeviceMemory* device) {
  if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.head_dim < 1 ||
      shape.block_size < 1) {
    return invalid_argument("KV cache shape: ", shape.num_layers, " layers, ", shape.num_kv_heads,
                            " kv heads, head_dim ", shape.head_dim, ", block_size ",
                            shape.block_size, " (all must be >= 1)");
  }
  if (num_blocks < 1) {
    return invalid_argument("KV cache needs at least 1 block, got ", num_blocks,
                            " (one block is ", bytes_per_block(shape), " bytes)");
  }
  const size_t bytes = bytes_per_block(shape) * (size_t)num_blocks;
  if (device != nullptr && !device->is_host()) {
    Result<void*> data = device->allocate(bytes);
    if (!data.ok()) {
      return data.status().with_context(str_cat(num_blocks, " KV blocks on ", device->name()));
    }
    return std::unique_ptr<PagedKvCache>(
        new PagedKvCache(shape, num_blocks, static_cast<uint8_t*>(*data), bytes, device));
  }
  // Anonymous mmap: page-aligned, zeroed, and (unless `populate`) committed lazily, so a
  // generous budget costs nothing until blocks are written.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (data == MAP_FAILED) {
    return resource_exhausted("cannot map ", bytes, " bytes for ", num_blocks, " KV blocks");
  }
  return std::unique_ptr<PagedKvCache>(
      new PagedKvCache(shape, num_blocks, static_cast<uint8_t*>(data), bytes, nullptr));
}

PagedKvCache::PagedKvCache(const KvCacheShape& shape, int64_t num_blocks, uint8_t* data,
                           size_t bytes, DeviceMemory* device)
    : shape_(shape),
      num_blocks_(num_blocks),
      data_(data),
      bytes_(bytes),
      device_(device),
      memory_(device != nullptr ? device : &host_memory()) {}

PagedKvCache::~PagedKvCache() {
  if (device_ != nullptr) {
    device_->release(data_);
  } else {
    munmap(data_, bytes_);
  }
}

size_t PagedKvCache::pool_bytes() const {
  return bytes_per_block(shape_) / (2 * (size_t)shape_.num_layers) * (size_t)num_blocks_;
}

void* PagedKvCache::k_pool(int layer) { return data_ + (size_t)layer * 2 * pool_bytes(); }
void* PagedKvCache::v_pool(int layer) { return data_ + ((size_t)layer * 2 + 1) * pool_bytes(); }
const void* PagedKvCache::k_pool(int layer) const {
  return data_ + (size_t)layer * 2 * pool_bytes();
}
const void* PagedKvCache::v_pool(int layer) const {
  return data_ + ((size_t)layer * 2 + 1) * pool_bytes();
}

size_t PagedKvCache::elem_offset(int64_t slot, int kv_head) const {
  const int64_t block = slot / shape_.block_size, offset = slot % shape_.block_size;
  return (((size_t)block * shape_.num_kv_heads + kv_head) * shape_.block_size + offset) *
         shape_.head_dim;
}

void PagedKvCache::write_token(int layer, int64_t slot, const float* k, const float* v) {
  ARBOR_DCHECK(layer >= 0 && layer < shape_.num_layers);
  ARBOR_CHECK(memory_->is_host()) << "write_token on a KV cache in " << memory_->name();
  ARBOR_CHECK(slot >= 0 && slot < num_blocks_ * shape_.block_size)
      << "slot " << slot << " outside " << num_blocks_ << " blocks of " << shape_.block_size;
  store_kv_token(shape_, k_pool(layer), v_pool(layer), slot, k, v);
}

void store_kv_token(const KvCacheShape& shape, void* k_pool, void* v_pool, int64_t slot,
                    const float* k, const float* v) {
  const int hd = shape.head_dim;
  const int64_t block = slot / shape.block_size, offset = slot % shape.block_size;
  for (int h = 0; h < shape.num_kv_heads; ++h) {
    const size_t off =
        (((size_t)block * shape.num_kv_heads + h) * shape.block_size + offset) * hd;
    const float* ks = k + (size_t)h * hd;
    const float* vs = v + (size_t)h * hd;
    if (shape.dtype == kernels::KvDtype::kF32) {
      std::memcpy(static_cast<float*>(k_pool) + off, ks, sizeof(float) * hd);
      std::memcpy(static_cast<float*>(v_pool) + off, vs, sizeof(float) * hd);
    } else {
      uint16_t* kd = static_cast<uint16_t*>(k_pool) + off;
      uint16_t* vd = static_cast<uint16_t*>(v_pool) + off;
      for (int d = 0; d < hd; ++d) {
        kd[d] = fp32_to_fp16(ks[d]);
        vd[d] = fp32_to_fp16(vs[d]);
      }
    }
  }
}

void PagedKvCache::read_token(int layer, int64_t slot, int kv_head, bool value, float* out) const {
  ARBOR_CHECK(slot >= 0 && slot < num_blocks_ * shape_.block_size);
  const auto elem = static_cast<size_t>(kernels::kv_dtype_size(shape_.dtype));
  const size_t off = elem_offset(slot, kv_head) * elem;
  const auto* pool = static_cast<const uint8_t*>(value ? v_pool(layer) : k_pool(layer));
  std::vector<uint8_t> row(static_cast<size_t>(shape_.head_dim) * elem);
  memory_->to_host(row.data(), pool + off, row.size());
  for (int d = 0; d < shape_.head_dim; ++d) {
    if (shape_.dtype == kernels::KvDtype::kF32) {
      std::memcpy(&out[d], row.data() + d * elem, sizeof(float));
    } else {
      uint16_t h;
      std::memcpy(&h, row.data() + d * elem, sizeof(h));
      out[d] = fp16_to_fp32(h);
    }
  }
}

void PagedKvCache::copy_block(int32_t src, int32_t dst) {
  ARBOR_CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_)
      << "copy_block(" << src << ", " << dst << ") with " << num_blocks_ << " blocks";
  if (src == dst) return;
  const size_t block_bytes = bytes_per_block(shape_) / (2 * (size_t)shape_.num_layers);
  std::vector<DeviceMemory::Copy> copies;
  copies.reserve(2 * (size_t)shape_.num_layers);
  for (int layer = 0; layer < shape_.num_layers; ++layer) {
    for (uint8_t* pool : {static_cast<uint8_t*>(k_pool(layer)),
                          static_cast<uint8_t*>(v_pool(layer))}) {
      copies.push_back({pool + (size_t)dst * block_bytes, pool + (size_t)src * block_bytes,
                        block_bytes});
    }
  }
  memory_->copy(copies);
}

void PagedKvCache::copy_slot(int64_t src, int64_t dst) {
  const int64_t num_slots = num_blocks_ * shape_.block_size;
  ARBOR_CHECK(src >= 0 && src < num_slots && dst >= 0 && dst < num_slots)
      << "copy_slot(" << src << ", " << dst << ") with " << num_slots << " slots";
  if (src == dst) return;
  const auto elem = static_cast<size_t>(kernels::kv_dtype_size(shape_.dtype));
  const size_t row_bytes = static_cast<size_t>(shape_.head_dim) * elem;
  std::vector<DeviceMemory::Copy> copies;
  copies.reserve(2 * (size_t)shape_.num_layers * shape_.num_kv_heads);
  for (int layer = 0; layer < shape_.num_layers; ++layer) {
    for (uint8_t* pool : {static_cast<uint8_t*>(k_pool(layer)),
                          static_cast<uint8_t*>(v_pool(layer))}) {
      for (int h = 0; h < shape_.num_kv_heads; ++h) {
        copies.push_back(
            {pool + elem_offset(dst, h) * elem, pool + elem_offset(src, h) * elem, row_bytes});
      }
    }
  }
  memory_->copy(copies);
}

}  // namespace arbor::model
