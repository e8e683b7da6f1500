// PagedKvCache: the K and V pools of every layer, in fixed-size blocks.
//
// Layout, per pool and for K and V separately:
//   [num_blocks][num_kv_heads][block_size][head_dim]   elements of `dtype` (F16 default, or F32)
// Token slot s = block_id * block_size + offset. Head-major inside a block lets one
// (sequence, kv head) attention work item stream block_size * head_dim contiguous values.
// Without KV cache groups every layer has its own pool. With them (KvCacheLayout: sliding-window
// layers whose blocks the KV manager releases, docs/kv_layout.md), layers are split into groups
// of at most num_pools layers that share a block table, and pool i holds the i-th layer of every
// group: block b of pool i belongs to whichever group the KV manager handed b to.
//
// The cache knows nothing about which request owns which block: block ids come from the KV
// manager (src/kv) as plain int32 arrays. All memory is allocated once, in create(): host memory
// by default, or a device's (DeviceMemory, e.g. a GPU's), where the pools' pointers are device
// pointers and copies run on the device.
// Not thread-safe: the forward pass writes it while no one else touches the same slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/attention.h"
#include "model/forward_ops.h"

namespace arbor::model {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  kernels::KvDtype dtype = kernels::KvDtype::kF16;
  // KV cache groups (KvCacheLayout): layer l's K/V live in pool layer_pool[l] and are addressed
  // by the block tables of group layer_group[l] ([num_layers] each). Empty: pool l, group 0.
  std::vector<int> layer_pool{};
  std::vector<int> layer_group{};

  int pool_of(int layer) const { return layer_pool.empty() ? layer : layer_pool[layer]; }
  int group_of(int layer) const { return layer_group.empty() ? 0 : layer_group[layer]; }
  // Physical pools: max(layer_pool) + 1, or num_layers.
  int num_pools() const;
};

// Which layers share block tables (KV cache groups) and physical pools: vLLM's hybrid KV cache
// rule (kv_cache_utils.py). Layers of one attention window form a type; with more than one type
// the group size is the smallest type's layer count (or the largest's, when it is under 1.5x
// the smallest: fewer padding layers); each type splits into ceil(n / size) groups, layer j of
// the type going to group j % groups. Group 0 is the full-attention group when there is one,
// then the others by window. Every group's layers share num_pools = group size physical pools,
// so a block id means the same bytes in every group and one pool of blocks serves them all.
struct KvCacheGroup {
  int32_t window = 0;       // 0: full attention; W > 0: a query at p reads p - W + 1 .. p
  std::vector<int> layers;  // model layers, increasing
};
struct KvCacheLayout {
  std::vector<KvCacheGroup> groups;  // [num_groups], >= 1
  int num_pools = 0;                 // physical pools per block (the group size)
  std::vector<int> layer_group;      // [num_layers]
  std::vector<int> layer_pool;       // [num_layers] position of the layer in its group

  int num_groups() const { return static_cast<int>(groups.size()); }
  std::vector<int32_t> windows() const;  // [num_groups]
  // Whether any group is sliding (the KV manager then releases blocks and reserves block 0).
  bool reclaims() const;
  // "7 KV cache groups over 4 pools: full attention (layers 5 11 17 23), window 512 (layers 0
  // 6 12 18), ..."
  std::string summary() const;
};
// layer_windows: [num_layers] each layer's window (0 = full attention), >= 0. reclaim false:
// one group of every layer with window 0 (the KV manager keeps every block; the attention still
// applies each layer's window), one pool per layer: exactly the layout without groups.
// Errors: an empty list or a negative window.
Result<KvCacheLayout> plan_kv_cache_layout(std::span<const int32_t> layer_windows, bool reclaim);
// A shape's layer_pool / layer_group from a layout ([num_layers] each).
void apply_kv_cache_layout(const KvCacheLayout& layout, KvCacheShape& shape);

class PagedKvCache {
 public:
  // Bytes one block takes over all pools, K and V:
  //   num_pools * 2 * num_kv_heads * block_size * head_dim * (2 for F16, 4 for F32).
  static size_t bytes_per_block(const KvCacheShape& shape);
  // The one KV pool sizing rule: how many blocks a memory budget of `budget_bytes` holds,
  // floor(budget_bytes / bytes_per_block(shape)), capped at INT32_MAX (block ids are int32 in
  // the batch layout and the KV manager). The count includes block 0, which the KV manager
  // reserves as its null block. Errors (invalid_argument, with the numbers): a shape whose block
  // has no bytes, or a budget that holds fewer than 2 blocks (the null block and one usable
  // block).
  static Result<int32_t> blocks_for_budget(const KvCacheShape& shape, int64_t budget_bytes);

  // Allocates num_blocks blocks, zero-filled. In host memory (`device` null or host): pages
  // committed on first write, or all at once when `populate`. Errors: num_blocks < 1, bad shape,
  // or the allocation failing (the message has the byte count). `device` must outlive the cache.
  static Result<std::unique_ptr<PagedKvCache>> create(const KvCacheShape& shape,
                                                      int64_t num_blocks, bool populate = false,
                                                      DeviceMemory* device = nullptr);
  ~PagedKvCache();
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int block_size() const { return shape_.block_size; }
  size_t total_bytes() const { return bytes_; }

  // Base of layer `layer`'s K / V pool (its group's pool, shared with the same position of every
  // other group): [num_blocks, num_kv_heads, block_size, head_dim].
  void* k_pool(int layer);
  void* v_pool(int layer);
  const void* k_pool(int layer) const;
  const void* v_pool(int layer) const;

  // The memory the pools live in.
  DeviceMemory& memory() const { return *memory_; }

  // Writes one token's K and V (f32, [num_kv_heads, head_dim] each) into `slot` of `layer`,
  // converting to the cache dtype. Host memory only (the forward writes device caches itself).
  void write_token(int layer, int64_t slot, const float* k, const float* v);
  // Reads back one token's K or V of one kv head as f32 ([head_dim]); for tests and debugging.
  // Any memory (a device cache copies the row to the host).
  void read_token(int layer, int64_t slot, int kv_head, bool value, float* out) const;

  // Copies block `src` onto block `dst` in every pool, K and V (copy-on-write of a shared
  // block, whichever group it serves). src == dst is a no-op.
  void copy_block(int32_t src, int32_t dst);
  // Copies the K/V of token slot `src` onto slot `dst` in every pool and kv head (KV compaction
  // after a token tree's verification moves the accepted path into place; with KV cache groups,
  // once per group with that group's slots). src == dst is a no-op.
  void copy_slot(int64_t src, int64_t dst);

 private:
  PagedKvCache(const KvCacheShape& shape, int64_t num_blocks, uint8_t* data, size_t bytes,
               DeviceMemory* device);
  size_t pool_bytes() const;  // one pool, K or V
  size_t elem_offset(int64_t slot, int kv_head) const;  // elements from a pool base

  KvCacheShape shape_;
  int64_t num_blocks_;
  uint8_t* data_;  // [num_layers][2 (K, V)][pool]
  size_t bytes_;
  DeviceMemory* device_;  // null: data_ is our own host mapping
  DeviceMemory* memory_;  // device_, or host_memory()
};

// Writes one token's K and V (f32, [num_kv_heads, head_dim] each) into `slot` of host pools
// laid out as PagedKvCache's ([num_blocks, num_kv_heads, block_size, head_dim] of shape.dtype;
// shape.num_layers is not read). The one place the host layout's store is written.
void store_kv_token(const KvCacheShape& shape, void* k_pool, void* v_pool, int64_t slot,
                    const float* k, const float* v);

}  // namespace arbor::model
