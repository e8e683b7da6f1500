// GET /v1/engine/events: the engine view's server-sent event stream (docs/web_ui.md has every
// field). While at least one client is connected, one event goes out every interval_s:
//
//   data: {"object": "engine.event", "running": 1, "waiting": 0, "kv": {...},
//          "throughput": {...}, "totals": {...}, "steps": [...], "requests": [...]}
//
// Each stream's first event is sent at once and carries the whole step ring (up to 64 steps);
// later ones carry the steps since the previous event of that stream. Events are built from
// Engine::metrics() and Engine::activity(), which the engine publishes after every step,
// so watching costs the engine nothing; with no client connected no timer runs.
//
// At most max_subscribers streams are open at once; another is answered 429. The route obeys the
// API key like the other API routes (server.cc's access check runs first).
// Threading: I/O thread only (the HttpServer's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "http/http_server.h"
#include "server/api_errors.h"

namespace arbor::server {

struct EngineEventsOptions {
  double interval_s = 0.25;     // between events, > 0
  int32_t max_subscribers = 8;  // open streams at once, >= 1
};

// What one event is built from. `before` and `seconds`: the previous tick's metrics and the time
// since, for the throughputs (seconds 0: throughputs 0).
struct EngineEventInput {
  std::string model;
  double unix_time_s = 0.0;
  double interval_s = 0.25;
  const engine::EngineMetricsSnapshot* before = nullptr;
  const engine::EngineMetricsSnapshot* now = nullptr;
  double seconds = 0.0;
  const engine::EngineActivity* activity = nullptr;
  int64_t after_step = 0;  // only steps numbered above this are included
};

// Pure: the event's JSON (one line, no "data: " prefix).
std::string engine_event_json(const EngineEventInput& in);

class EngineEvents {
 public:
  // `http` and `engine` must outlive this object.
  EngineEvents(http::HttpServer& http, const engine::Engine& engine, std::string model,
               const EngineEventsOptions& options);
  EngineEvents(const EngineEvents&) = delete;
  EngineEvents& operator=(const EngineEvents&) = delete;

  // Starts an event stream on `ex` (its first event at once). Returns the error to answer
  // instead (429) when max_subscribers streams are open.
  std::optional<ApiError> subscribe(const std::shared_ptr<http::HttpExchange>& ex);
  // Ends every stream (the drain: their clients get the chunk terminator).
  void close_all();
  int32_t num_subscribers() const { return static_cast<int32_t>(subscribers_.size()); }

 private:
  struct Subscriber {
    uint64_t id = 0;
    std::shared_ptr<http::HttpExchange> ex;
    int64_t last_step = 0;  // the newest step sent to it
  };
  void tick();
  void schedule_tick();
  // "data: {...}\n\n" with the steps numbered above `after_step`.
  std::string event_body(int64_t after_step, const engine::EngineActivity& activity);
  static int64_t newest_step(const engine::EngineActivity& activity, int64_t last);
  void unsubscribe(uint64_t id);

  http::HttpServer& http_;
  const engine::Engine& engine_;
  std::string model_;
  EngineEventsOptions options_;
  std::vector<Subscriber> subscribers_;
  uint64_t next_id_ = 1;
  bool tick_pending_ = false;
  // The previous tick's metrics, for throughputs.
  engine::EngineMetricsSnapshot before_;
  std::chrono::steady_clock::time_point before_time_;
  engine::EngineMetricsSnapshot now_;
  double seconds_ = 0.0;
};

}  // namespace arbor::server
