// The conversations behind /v1/responses' `previous_response_id`: each stored response keeps
// the conversation it ended (its input, earlier turns included, and its output) as OpenAI chat
// messages, so that a request naming it continues from there.
//
// Bounded three ways (docs/server.md, "/v1/responses"): a response is kept at most `ttl_s`
// seconds after it completed, the store holds at most `max_responses` of them and at most
// `max_bytes` of conversation (the JSON text's size); beyond a bound the oldest go first. A
// response that is gone (expired, evicted, never stored, stored with `store: false`) is a 404
// naming previous_response_id.
//
// Thread-safety: every method takes a lock (request workers read, the I/O thread writes).
// Complexity: put and get are O(log n) plus the evictions they make.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace arbor::server {

struct ResponseStoreOptions {
  int64_t max_responses = 1000;    // --responses-max; 0 = nothing is stored
  double ttl_s = 3600.0;           // --responses-ttl: seconds a response is kept
  int64_t max_bytes = 64ll << 20;  // --responses-max-mib: conversations' total JSON size
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreOptions options) : options_(options) {}

  // Keeps `messages` (a JSON array of chat messages) under `id` at time `now_s` (seconds on
  // any monotonic clock, the same for every call), replacing an earlier entry with that id.
  // Expired entries go, then the oldest until both bounds hold. A conversation larger than
  // max_bytes by itself is not kept.
  void put(const std::string& id, nlohmann::ordered_json messages, double now_s);
  // The conversation stored under `id`, nullopt when it is not there or expired at `now_s`.
  std::optional<nlohmann::ordered_json> get(const std::string& id, double now_s);

  // The clock the server passes as now_s (steady, in seconds).
  static double clock_s();

  const ResponseStoreOptions& options() const { return options_; }
  int64_t size() const;
  int64_t bytes() const;

 private:
  struct Entry {
    nlohmann::ordered_json messages;
    int64_t bytes = 0;
    double stored_at = 0;
    uint64_t order = 0;  // key in by_age_
  };
  void erase(std::unordered_map<std::string, Entry>::iterator it);
  void evict(double now_s);

  const ResponseStoreOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<uint64_t, std::string> by_age_;  // insertion order -> id (oldest first)
  uint64_t next_order_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace arbor::server
