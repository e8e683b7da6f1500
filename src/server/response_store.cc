#include "server/response_store.h"

#include <chrono>

namespace arbor::server {

double ResponseStore::clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ResponseStore::erase(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  by_age_.erase(it->second.order);
  entries_.erase(it);
}

// Entries are stored in time order (put's now_s never goes back on a monotonic clock), so the
// oldest entry is also the first to expire.
void ResponseStore::evict(double now_s) {
  while (!by_age_.empty()) {
    auto it = entries_.find(by_age_.begin()->second);
    const bool expired = now_s - it->second.stored_at > options_.ttl_s;
    const bool over = static_cast<int64_t>(entries_.size()) > options_.max_responses ||
                      bytes_ > options_.max_bytes;
    if (!expired && !over) break;
    erase(it);
  }
}

void ResponseStore::put(const std::string& id, nlohmann::ordered_json messages, double now_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) erase(it);
  Entry e;
  e.bytes = static_cast<int64_t>(
      messages.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).size());
  if (options_.max_responses <= 0 || e.bytes > options_.max_bytes) {
    evict(now_s);
    return;
  }
  e.messages = std::move(messages);
  e.stored_at = now_s;
  e.order = next_order_++;
  bytes_ += e.bytes;
  by_age_.emplace(e.order, id);
  entries_.emplace(id, std::move(e));
  evict(now_s);
}

std::optional<nlohmann::ordered_json> ResponseStore::get(const std::string& id, double now_s) {
  std::lock_guard<std::mutex> lock(mu_);
  evict(now_s);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.messages;
}

int64_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

int64_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace arbor::server
