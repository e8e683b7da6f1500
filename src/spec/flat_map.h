// FlatMap: uint64 key -> int32 value, open addressing with linear probing and backward-shift
// deletion over one flat slot array (no tombstones, no per-entry allocation). The proposers'
// indexes are hash maps touched a few dozen times per token, so node-based std::unordered_map
// would dominate their cost. Keys are mixed before use (callers may pass structured keys such as
// node << 32 | token). The capacity doubles at load 1/2, so an insert is O(1) amortized; a
// growth rehashes every entry once.
//
// Threading: none (the owner's thread). Ownership: owns its slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/check.h"

namespace arbor::spec {

class FlatMap {
 public:
  // The one key callers may not use (marks an empty slot).
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  FlatMap() : slots_(kMinCapacity), mask_(kMinCapacity - 1) {}

  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

  // The value of key, or nullptr. The pointer is valid until the next insert or erase. O(1).
  const int32_t* find(uint64_t key) const {
    const Slot& s = slots_[probe(key)];
    return s.key == key ? &s.value : nullptr;
  }
  int32_t* find(uint64_t key) {
    Slot& s = slots_[probe(key)];
    return s.key == key ? &s.value : nullptr;
  }

  // Sets key -> value, inserting or overwriting. O(1) amortized.
  void insert_or_assign(uint64_t key, int32_t value) {
    ARBOR_DCHECK(key != kEmptyKey);
    size_t i = probe(key);
    if (slots_[i].key == key) {
      slots_[i].value = value;
      return;
    }
    if (2 * (size_ + 1) > slots_.size()) {
      grow();
      i = probe(key);
    }
    slots_[i] = Slot{key, value};
    ++size_;
  }

  // Removes key; returns false if it was absent. O(1) expected.
  bool erase(uint64_t key) {
    size_t hole = probe(key);
    if (slots_[hole].key != key) return false;
    // Backward shift: pull later entries of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    for (size_t j = (hole + 1) & mask_; slots_[j].key != kEmptyKey; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (stays) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  void clear() {
    slots_.assign(kMinCapacity, Slot{});
    mask_ = kMinCapacity - 1;
    size_ = 0;
  }

 private:
  static constexpr size_t kMinCapacity = 16;
  struct Slot {
    uint64_t key = kEmptyKey;
    int32_t value = 0;
  };

  // splitmix64's finaliser: structured keys (small node ids, token ids) spread over all bits.
  static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
  }
  size_t home(uint64_t key) const { return static_cast<size_t>(mix(key)) & mask_; }
  // The slot holding key, or the empty slot that ends its probe run.
  size_t probe(uint64_t key) const {
    size_t i = home(key);
    while (slots_[i].key != key && slots_[i].key != kEmptyKey) i = (i + 1) & mask_;
    return i;
  }
  void grow() {
    std::vector<Slot> old(2 * slots_.size());
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.key == kEmptyKey) continue;
      slots_[probe(s.key)] = s;
    }
  }

  std::vector<Slot> slots_;  // [capacity], a power of two
  size_t mask_;
  size_t size_ = 0;
};

}  // namespace arbor::spec
