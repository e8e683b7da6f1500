// The replica side of the replica protocol (router/replica.proto, docs/router.md): `arbor serve
// --replica-listen ADDR` serves its engine to routers on a Unix socket ("unix:/path") or TCP
// ("host:port", port 0: any), beside its HTTP port.
//
//   Generate  decodes the call, submits it to the engine and writes every event; a call the
//             client cancels (or whose stream breaks) aborts the request, so its KV blocks are
//             freed. A request the engine refuses ends with one final event carrying the error.
//   KvEvents  the engine's KvEventLog: a snapshot, then every change (a reader that falls behind
//             the log's retention gets a new snapshot, flagged reset).
//   Status    what the router's probes and routing read.
//
// Threading: Generate runs on gRPC's callback API (the engine's notify starts each write; no
// thread per call); KvEvents and Status on its sync server (a thread per KvEvents subscriber).
// start/shutdown from the owner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/kv_event_log.h"

namespace arbor::router {

// What a replica reports about itself besides the engine's live metrics.
struct ReplicaFacts {
  std::string model;        // the GGUF path
  int32_t vocab_size = 0;
  int32_t block_size = 0;
  int64_t num_kv_blocks = 0;
  bool prefix_caching = true;
};

class ReplicaServer {
 public:
  // Serves `engine` (and `kv_events`, which the engine appends to) on `listen`. Both must
  // outlive the server. Errors: kInvalidArgument when the address cannot be bound.
  static Result<std::unique_ptr<ReplicaServer>> start(engine::Engine& engine,
                                                      engine::KvEventLog& kv_events,
                                                      const ReplicaFacts& facts,
                                                      const std::string& listen);
  ~ReplicaServer();
  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;

  // The address bound: `listen` with the chosen port for "host:0".
  const std::string& address() const;
  // Stops serving: calls in progress end (their requests are aborted).
  void shutdown();

  struct Impl;

 private:
  explicit ReplicaServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor::router
