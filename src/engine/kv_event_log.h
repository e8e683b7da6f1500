// KvEventLog: the engine's prefix-cache changes (kv::KvEvent: a block hash stored or removed),
// for readers on other threads: the replica service streams them to routers, whose prefix
// index then knows this engine's cache exactly (docs/router.md, "Exact prefix index").
//
// The engine thread appends each step's events in order; each gets the next sequence number
// (the first is 1). The log keeps a mirror of the cached hashes, so a reader takes a snapshot
// (the set and the sequence number it is current at) and then reads every later event. It
// retains the latest `max_retained` events: a reader that falls further behind is told so
// (Batch::lost) and takes a new snapshot.
//
// Threading: append() from the engine thread; everything else from any thread. Memory: the
// mirror holds one hash per cached block (at most the pool's size), plus the retained events.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <unordered_set>
#include <vector>

#include "kv/block_pool.h"

namespace arbor::engine {

class KvEventLog {
 public:
  explicit KvEventLog(size_t max_retained = size_t{1} << 16) : max_retained_(max_retained) {}

  // Engine thread. Applies `events` to the mirror and retains them. O(events).
  void append(std::span<const kv::KvEvent> events);

  struct Snapshot {
    uint64_t seq = 0;                   // the last event the set reflects (0: none yet)
    std::vector<kv::BlockHash> hashes;  // [cached blocks] in no particular order
  };
  Snapshot snapshot() const;  // O(cached blocks)

  struct Batch {
    uint64_t first_seq = 0;           // the sequence number of events[0]
    std::vector<kv::KvEvent> events;  // every retained event after `after`, in order
    bool lost = false;                // events after `after` were dropped: take a new snapshot
  };
  // The events after sequence number `after`, waiting up to `timeout_s` for one when there are
  // none (an empty batch then). O(events returned).
  Batch wait_after(uint64_t after, double timeout_s) const;
  // Wakes every wait_after() at once (shutdown).
  void close();

  uint64_t last_seq() const;

 private:
  const size_t max_retained_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::unordered_set<kv::BlockHash, kv::BlockHashHasher> cached_;
  std::deque<kv::KvEvent> retained_;  // events (last_seq_ - retained_.size(), last_seq_]
  uint64_t last_seq_ = 0;
  bool closed_ = false;
};

}  // namespace arbor::engine
