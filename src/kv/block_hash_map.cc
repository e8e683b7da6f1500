#include "kv/block_hash_map.h"

#include <algorithm>
#include <bit>

#include "base/check.h"

namespace arbor::kv {

BlockHashMap::BlockHashMap(int32_t max_entries)
    : slots_(std::bit_ceil(std::max<size_t>(8, 2 * static_cast<size_t>(std::max(max_entries, 0))))),
      mask_(slots_.size() - 1),
      max_entries_(max_entries) {}

size_t BlockHashMap::probe(const BlockHash& hash) const {
  size_t i = home(hash);
  while (slots_[i].block_id != kNoBlock && !(slots_[i].hash == hash)) i = (i + 1) & mask_;
  return i;
}

std::optional<BlockId> BlockHashMap::find(const BlockHash& hash) const {
  const Slot& s = slots_[probe(hash)];
  if (s.block_id == kNoBlock) return std::nullopt;
  return s.block_id;
}

bool BlockHashMap::insert(const BlockHash& hash, BlockId id) {
  ARBOR_CHECK_NE(id, kNoBlock);
  Slot& s = slots_[probe(hash)];
  if (s.block_id != kNoBlock) return false;
  ARBOR_CHECK_LT(size_, max_entries_) << "block hash map is full";
  s.hash = hash;
  s.block_id = id;
  ++size_;
  return true;
}

bool BlockHashMap::erase(const BlockHash& hash) {
  size_t hole = probe(hash);
  if (slots_[hole].block_id == kNoBlock) return false;
  // Backward shift: pull later entries of the cluster into the hole unless that would move
  // one before its home slot, so every probe sequence stays unbroken without tombstones.
  for (size_t j = (hole + 1) & mask_; slots_[j].block_id != kNoBlock; j = (j + 1) & mask_) {
    const size_t k = home(slots_[j].hash);
    const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

}  // namespace arbor::kv
