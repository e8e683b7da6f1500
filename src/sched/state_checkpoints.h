// StateCheckpoints: which recurrent-state checkpoints the executor holds (Qwen3.5's Gated
// DeltaNet state at a block boundary of a prompt), so that a prefix-cache hit on a model with
// recurrent layers can continue from the state at its end (docs/engine.md, "Recurrent state").
//
// A checkpoint is the state after the tokens of a chain of full blocks, named by the last
// block's hash (the hash chain names the whole prefix); it lives in one of `capacity` executor
// slots. The scheduler acquires a slot when it schedules the step that computes the boundary
// (the executor saves the state there during that step), registers it under the block's hash
// once the step succeeded and the block is hashed, and looks hashes up when admitting a request.
// Least recently used first out: acquiring a slot evicts the oldest checkpoint when all are
// taken. Pure bookkeeping, engine thread only; O(1) per operation (hash map + list).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

#include "kv/kv_cache_utils.h"

namespace arbor::sched {

class StateCheckpoints {
 public:
  explicit StateCheckpoints(int32_t capacity);

  int32_t capacity() const { return capacity_; }
  // Registered checkpoints (slots acquired but not yet registered are not counted).
  int32_t size() const { return static_cast<int32_t>(by_hash_.size()); }

  bool contains(const kv::BlockHash& hash) const { return by_hash_.contains(hash); }
  // The slot holding the state after the block named `hash`, or nullopt; marks it used.
  std::optional<int32_t> find(const kv::BlockHash& hash);
  // A slot for a new checkpoint: a free one, else the least recently used checkpoint's (which
  // is forgotten). The slot is the caller's until register_slot() or release(). nullopt when
  // every slot is being written (capacity acquisitions outstanding).
  std::optional<int32_t> acquire();
  // The state after the block named `hash` is now in `slot` (acquired); a checkpoint the hash
  // already had is replaced (its slot freed).
  void register_slot(const kv::BlockHash& hash, int32_t slot);
  // Gives an acquired slot back unregistered (its step failed or saved nothing).
  void release(int32_t slot);
  // Forgets every checkpoint and outstanding acquisition (the executor lost its state).
  void clear();

 private:
  void evict(int32_t slot);  // forgets the checkpoint in `slot`, if any

  int32_t capacity_;
  std::list<int32_t> lru_;  // registered slots, least recently used first
  struct Entry {
    kv::BlockHash hash;
    std::list<int32_t>::iterator lru;
  };
  std::unordered_map<int32_t, Entry> by_slot_;
  std::unordered_map<kv::BlockHash, int32_t, kv::BlockHashHasher> by_hash_;
  std::list<int32_t> free_;      // never-used or released slots
  int32_t outstanding_ = 0;      // acquired, not yet registered or released
};

}  // namespace arbor::sched
