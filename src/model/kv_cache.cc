#include "model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/ops.h"

namespace arbor::model {

int KvCacheShape::num_pools() const {
  if (layer_pool.empty()) return num_layers;
  return *std::max_element(layer_pool.begin(), layer_pool.end()) + 1;
}

std::vector<int32_t> KvCacheLayout::windows() const {
  std::vector<int32_t> w;
  for (const KvCacheGroup& g : groups) w.push_back(g.window);
  return w;
}

bool KvCacheLayout::reclaims() const {
  return std::any_of(groups.begin(), groups.end(), [](const KvCacheGroup& g) {
    return g.window > 0;
  });
}

std::string KvCacheLayout::summary() const {
  std::string s = str_cat(groups.size(), groups.size() == 1 ? " KV cache group" : " KV cache groups",
                          " over ", num_pools, " pools:");
  for (size_t g = 0; g < groups.size(); ++g) {
    s += g == 0 ? " " : ", ";
    s += groups[g].window == 0 ? std::string("full attention") : str_cat("window ", groups[g].window);
    s += " (layers";
    for (int l : groups[g].layers) s += str_cat(" ", l);
    s += ")";
  }
  return s;
}

Result<KvCacheLayout> plan_kv_cache_layout(std::span<const int32_t> layer_windows, bool reclaim) {
  if (layer_windows.empty()) return invalid_argument("KV cache layout of a model without layers");
  const int num_layers = static_cast<int>(layer_windows.size());
  for (int l = 0; l < num_layers; ++l) {
    if (layer_windows[l] < 0) {
      return invalid_argument("layer ", l, " has attention window ", layer_windows[l]);
    }
  }
  KvCacheLayout out;
  out.layer_group.assign(static_cast<size_t>(num_layers), 0);
  out.layer_pool.resize(static_cast<size_t>(num_layers));
  // Layers by window: full attention (0) first, then increasing windows.
  std::map<int32_t, std::vector<int>> types;
  for (int l = 0; l < num_layers; ++l) types[reclaim ? layer_windows[l] : 0].push_back(l);
  if (types.size() == 1) {
    out.groups.push_back(KvCacheGroup{types.begin()->first, types.begin()->second});
    out.num_pools = num_layers;
    for (int l = 0; l < num_layers; ++l) out.layer_pool[static_cast<size_t>(l)] = l;
    return out;
  }
  size_t min_n = SIZE_MAX, max_n = 0;
  for (const auto& [w, layers] : types) {
    min_n = std::min(min_n, layers.size());
    max_n = std::max(max_n, layers.size());
  }
  const size_t size = 2 * max_n < 3 * min_n ? max_n : min_n;
  out.num_pools = static_cast<int>(size);
  for (const auto& [w, layers] : types) {
    const size_t num_groups = (layers.size() + size - 1) / size;
    for (size_t i = 0; i < num_groups; ++i) {
      KvCacheGroup g{w, {}};
      for (size_t j = i; j < layers.size(); j += num_groups) g.layers.push_back(layers[j]);
      for (size_t k = 0; k < g.layers.size(); ++k) {
        out.layer_group[static_cast<size_t>(g.layers[k])] = static_cast<int>(out.groups.size());
        out.layer_pool[static_cast<size_t>(g.layers[k])] = static_cast<int>(k);
      }
      out.groups.push_back(std::move(g));
    }
  }
  return out;
}

void apply_kv_cache_layout(const KvCacheLayout& layout, KvCacheShape& shape) {
  if (layout.num_groups() == 1) {
    shape.layer_pool.clear();
    shape.layer_group.clear();
    return;
  }
  shape.layer_pool = layout.layer_pool;
  shape.layer_group = layout.layer_group;
}

size_t PagedKvCache::bytes_per_block(const KvCacheShape& s) {
  return (size_t)s.num_pools() * 2 * s.num_kv_heads * s.block_size * s.head_dim *
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
  if ((!shape.layer_pool.empty() &&
       shape.layer_pool.size() != static_cast<size_t>(shape.num_layers)) ||
      shape.layer_group.size() != shape.layer_pool.size()) {
    return invalid_argument("KV cache shape: ", shape.num_layers, " layers but ",
                            shape.layer_pool.size(), " pool and ", shape.layer_group.size(),
                            " group entries");
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
  return bytes_per_block(shape_) / (2 * (size_t)shape_.num_pools()) * (size_t)num_blocks_;
}

void* PagedKvCache::k_pool(int layer) {
  return data_ + (size_t)shape_.pool_of(layer) * 2 * pool_bytes();
}
void* PagedKvCache::v_pool(int layer) {
  return data_ + ((size_t)shape_.pool_of(layer) * 2 + 1) * pool_bytes();
}
const void* PagedKvCache::k_pool(int layer) const {
  return data_ + (size_t)shape_.pool_of(layer) * 2 * pool_bytes();
}
const void* PagedKvCache::v_pool(int layer) const {
  return data_ + ((size_t)shape_.pool_of(layer) * 2 + 1) * pool_bytes();
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
      kernels::f32_to_f16(ks, static_cast<uint16_t*>(k_pool) + off, hd);
      kernels::f32_to_f16(vs, static_cast<uint16_t*>(v_pool) + off, hd);
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
  const size_t block_bytes = bytes_per_block(shape_) / (2 * (size_t)shape_.num_pools());
  std::vector<DeviceMemory::Copy> copies;
  copies.reserve(2 * (size_t)shape_.num_pools());
  for (int p = 0; p < shape_.num_pools(); ++p) {
    for (uint8_t* pool : {data_ + (size_t)p * 2 * pool_bytes(),
                          data_ + ((size_t)p * 2 + 1) * pool_bytes()}) {
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
  copies.reserve(2 * (size_t)shape_.num_pools() * shape_.num_kv_heads);
  for (int p = 0; p < shape_.num_pools(); ++p) {
    for (uint8_t* pool : {data_ + (size_t)p * 2 * pool_bytes(),
                          data_ + ((size_t)p * 2 + 1) * pool_bytes()}) {
      for (int h = 0; h < shape_.num_kv_heads; ++h) {
        copies.push_back(
            {pool + elem_offset(dst, h) * elem, pool + elem_offset(src, h) * elem, row_bytes});
      }
    }
  }
  memory_->copy(copies);
}

}  // namespace arbor::model
