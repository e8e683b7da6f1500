// GlooCollective: the collectives of a TP group across hosts, over gloo's TCP transport
// (Debian's libgloo-dev; built when CMake finds it, see available()).
//
// The same contract as every Collective (collective.h): all_reduce_sum is NOT gloo's allreduce
// (whose ring / halving-doubling order depends on the algorithm and the group) but an allgather
// of every rank's [header | data] followed by tree_sum in rank order on every rank, so the bits
// are those of ShmCollective and of TP = 1. Every call's header (tag, kind, length) is compared
// across ranks (gather: on rank 0; broadcast: an allgather of the headers first). Deadlines are
// gloo's per-operation timeouts; a gloo exception (a peer's connection reset when it dies, a
// timeout) becomes kFailedPrecondition naming the call, and the object stays broken.
//
// Rendezvous: a gloo FileStore directory every rank can reach (a shared filesystem across hosts,
// any directory on one host) under a group prefix; a restarted group uses a new prefix.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "base/status.h"
#include "collective/collective.h"

namespace arbor::collective {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string store_dir;           // FileStore directory (must exist)
  std::string prefix = "arbor-tp";  // the group incarnation's key prefix in the store
  std::string hostname = "127.0.0.1";  // this rank's address for the TCP transport
  std::chrono::milliseconds timeout{10000};  // rendezvous and every call's deadline
};

class GlooCollective final : public Collective {
 public:
  // Whether this build has gloo.
  static bool available();
  // Connects the full mesh (blocks until every rank has joined or options.timeout passes).
  static Result<std::unique_ptr<GlooCollective>> connect(const GlooOptions& options);
  ~GlooCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "gloo"; }
  Status all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) override;
  Status gather(const void* send, size_t bytes, void* recv, const CollectiveTag& tag) override;
  Status broadcast(void* data, size_t bytes, const CollectiveTag& tag) override;
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  struct Impl;
  GlooCollective() = default;
  Status fail(Status s);

  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_{10000};
  uint32_t seq_ = 0;
  Status broken_;
};

}  // namespace arbor::collective
