// The shard process's server (`arbor shard`, docs/shards.md): owns a LocalExecutor (weights, KV
// memory, the forward) and serves one bidirectional gRPC stream at a time (shard/shard.proto's
// Shard.Session) on a Unix socket ("unix:/path") or TCP ("host:port").
//
// A session: Hello (a new incarnation: every request state is forgotten), then Steps validated
// by a StepDecoder (shard/wire.h) and run by the executor, each answered by its StepReply (rank 0
// of a group carries the StepResult; the other ranks answer with the step alone). A refused message is answered with an Error naming the
// field and ends the session; so does an executor error. When a session ends, the executor
// forgets every request of it. A second concurrent stream is refused (FAILED_PRECONDITION).
//
// Threading: the session runs on a gRPC thread; start/shutdown from the owner.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "collective/group.h"
#include "executor/local_executor.h"

namespace arbor::shard {

struct ShardServerOptions {
  std::string listen;      // "unix:/path/to.sock", "unix:///abs/path" or "host:port" (port 0: any)
  std::string model_name;  // reported in HelloReply (the GGUF path)
  // Tensor parallelism: this shard's rank of tp_size (the executor was loaded as that rank, with
  // `group` as its collective); each Hello must name the same rank and size, and its tp_group is
  // joined for the incarnation. tp_size 1: no group.
  int tp_rank = 0;
  int tp_size = 1;
  std::shared_ptr<collective::GroupCollective> group;
};

class ShardServer {
 public:
  // Serves `executor` on options.listen. Errors: kInvalidArgument when the address cannot be
  // bound (the message names it).
  static Result<std::unique_ptr<ShardServer>> start(
      std::unique_ptr<executor::LocalExecutor> executor, const ShardServerOptions& options);
  ~ShardServer();
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // The address bound: options.listen, with the chosen port for "host:0".
  const std::string& address() const;
  // Stops serving: a session in progress ends (its client sees the stream fail).
  void shutdown();

  struct Impl;

 private:
  explicit ShardServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor::shard
