// RouterEngine: the engine behind `arbor router` (docs/router.md). It serves the same
// engine::Engine interface as EngineCore, so the API server (server/server.h) runs unchanged in
// front of it; each request goes, token-level, to one of N `arbor serve --replica-listen`
// replicas over the replica protocol (router/replica.proto).
//
//   routing   route_policy.h over what the router knows of each replica: its exact prefix
//             cache (its KvEvents stream applied to a CachedBlockSet), the requests and prompt
//             tokens the router has in flight there, its health
//   health    a probe per replica (Status, every probe_interval_s, with a deadline): healthy
//             when it answers, its executor is healthy and, while it runs requests, its step
//             count moves within stall_timeout_s. Passive breaking: a call that fails at the
//             transport marks its replica unhealthy at once; an unhealthy replica's calls are
//             cancelled and fail over.
//   failover  a request that received nothing is retried on another replica; a streaming one
//             (n = best_of = 1) is resumed there from prompt + the tokens already sent with the
//             same seed (engine::GenerateRequest::resume), so the client's stream continues
//             with exactly the tokens a fault-free run produces. A request that cannot be
//             resumed (n > 1 after its first event), or that gets no event from max_attempts
//             replicas in a row, ends with an error event. Every request ends with one final
//             event.
//   seeds     a request without a seed gets one here, so a resumption is exact.
//   sessions  a request's session (GenerateRequest::session) stays on its last replica while
//             that is not overloaded and its cache is no worse (route_policy.h); at most
//             100,000 sessions are remembered, the least recently used forgotten first.
//
// Replicas come from options.replicas and options.replicas_file (one address per line, '#'
// comments), which is re-read when it changes: new addresses are added, missing ones stop
// receiving requests (their running calls finish).
//
// Threading: every Engine method from any thread. Inside: one relay thread per request in
// flight (a blocking gRPC read), a probe and a KvEvents thread per replica, one file watcher.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "router/route_policy.h"

namespace arbor::router {

struct RouterOptions {
  std::vector<std::string> replicas;  // "unix:/path" or "host:port"
  std::string replicas_file;          // optional; re-read when its modification time changes
  RoutePolicy policy = RoutePolicy::kPrefix;
  RouteWeights weights{};
  int32_t vocab_size = 0;             // the router's tokenizer's; a replica that differs is refused
  double probe_interval_s = 0.25;
  double probe_timeout_s = 1.0;
  double stall_timeout_s = 30.0;      // running requests and no step for this long: unhealthy
  int32_t max_attempts = 4;           // attempts in a row without progress, at most
  double no_replica_wait_s = 10.0;    // a request waits this long for a healthy replica
  double startup_timeout_s = 120.0;   // create() waits this long for a first healthy replica
};

// Counters of the router's decisions (published in /metrics: Engine::extra_metrics).
struct RouterStats {
  int64_t routed_prefix = 0, routed_load = 0, routed_imbalance = 0, routed_round_robin = 0;
  int64_t routed_session = 0;
  int64_t prompt_tokens = 0;           // of routed requests (first attempts)
  int64_t predicted_hit_tokens = 0;    // ... predicted to come from the chosen replica's cache
  int64_t retries = 0;                 // attempts that restarted a request that had received nothing
  int64_t resumes = 0;                 // attempts that resumed a streaming request elsewhere
  int64_t resumed_tokens = 0;          // tokens those resumptions were given
  int64_t failed = 0;                  // requests ended with an error event by a fault
  int64_t probe_failures = 0;
};

class RouterEngine final : public engine::Engine {
 public:
  // Connects to the replicas and waits (startup_timeout_s, logging progress) until one is
  // healthy; max_model_len() is the least of the healthy replicas' then. Errors: no address,
  // none healthy in time (naming each replica's state).
  static Result<std::unique_ptr<RouterEngine>> create(const RouterOptions& options);
  ~RouterEngine() override;

  Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerateRequest request) override;
  void abort(const std::string& request_id) override;
  engine::EngineMetricsSnapshot metrics() const override;
  engine::EngineActivity activity() const override { return {}; }
  int64_t max_model_len() const override;
  int32_t max_spec_tokens() const override;
  int32_t max_tree_nodes() const override;
  int32_t num_free_blocks() const override;
  void wait_idle() override;
  std::string extra_metrics() const override;

  RouterStats stats() const;
  int32_t block_size() const;

  struct Impl;

 private:
  explicit RouterEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor::router
