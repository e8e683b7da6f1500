#include "engine/kv_event_log.h"

#include <chrono>

namespace arbor::engine {

void KvEventLog::append(std::span<const kv::KvEvent> events) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const kv::KvEvent& e : events) {
      if (e.stored) {
        cached_.insert(e.hash);
      } else {
        cached_.erase(e.hash);
      }
      retained_.push_back(e);
      ++last_seq_;
    }
    while (retained_.size() > max_retained_) retained_.pop_front();
  }
  cv_.notify_all();
}

KvEventLog::Snapshot KvEventLog::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.seq = last_seq_;
  s.hashes.assign(cached_.begin(), cached_.end());
  return s;
}

KvEventLog::Batch KvEventLog::wait_after(uint64_t after, double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return closed_ || last_seq_ > after; });
  Batch b;
  const uint64_t first_retained = last_seq_ - retained_.size() + 1;
  if (after + 1 < first_retained) {
    b.lost = true;
    return b;
  }
  b.first_seq = after + 1;
  for (uint64_t seq = after + 1; seq <= last_seq_; ++seq) {
    b.events.push_back(retained_[static_cast<size_t>(seq - first_retained)]);
  }
  return b;
}

void KvEventLog::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

uint64_t KvEventLog::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

}  // namespace arbor::engine
