#include "sched/state_checkpoints.h"

#include "base/check.h"

namespace arbor::sched {

StateCheckpoints::StateCheckpoints(int32_t capacity) : capacity_(capacity) {
  ARBOR_CHECK_GE(capacity, 0);
  for (int32_t s = 0; s < capacity; ++s) free_.push_back(s);
}

std::optional<int32_t> StateCheckpoints::find(const kv::BlockHash& hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  Entry& e = by_slot_.at(it->second);
  lru_.splice(lru_.end(), lru_, e.lru);
  return it->second;
}

std::optional<int32_t> StateCheckpoints::acquire() {
  int32_t slot = -1;
  if (!free_.empty()) {
    slot = free_.front();
    free_.pop_front();
  } else if (!lru_.empty()) {
    slot = lru_.front();
    evict(slot);
  } else {
    return std::nullopt;  // every slot is being written
  }
  ++outstanding_;
  return slot;
}

void StateCheckpoints::register_slot(const kv::BlockHash& hash, int32_t slot) {
  ARBOR_CHECK(slot >= 0 && slot < capacity_ && outstanding_ > 0 && !by_slot_.contains(slot))
      << "register_slot(" << slot << "): not an acquired slot";
  --outstanding_;
  if (auto old = by_hash_.find(hash); old != by_hash_.end()) {
    const int32_t prev = old->second;
    evict(prev);
    free_.push_back(prev);
  }
  lru_.push_back(slot);
  by_slot_.emplace(slot, Entry{hash, std::prev(lru_.end())});
  by_hash_.emplace(hash, slot);
}

void StateCheckpoints::release(int32_t slot) {
  ARBOR_CHECK(slot >= 0 && slot < capacity_ && outstanding_ > 0 && !by_slot_.contains(slot))
      << "release(" << slot << "): not an acquired slot";
  --outstanding_;
  free_.push_back(slot);
}

void StateCheckpoints::clear() {
  by_slot_.clear();
  by_hash_.clear();
  lru_.clear();
  free_.clear();
  for (int32_t s = 0; s < capacity_; ++s) free_.push_back(s);
  outstanding_ = 0;
}

void StateCheckpoints::evict(int32_t slot) {
  auto it = by_slot_.find(slot);
  if (it == by_slot_.end()) return;
  by_hash_.erase(it->second.hash);
  lru_.erase(it->second.lru);
  by_slot_.erase(it);
}

}  // namespace arbor::sched
