// GroupCollective: the collective of a TP group whose processes outlive its incarnations (the
// shard processes of `arbor serve --shards N`, docs/shards.md "Tensor parallelism across shard processes").
//
// A model is loaded once per process, with a Collective* that its forward keeps; the group behind
// it changes whenever the engine starts a new incarnation (after any fault: the old group's
// collectives are broken for good, collective.h). GroupCollective is that stable object: join()
// names the incarnation's group, and the first collective call after it connects (so no rank
// waits for the others while saying Hello: the ranks meet in their first collective). Calls
// before any join() fail.
//
// A group is named by a spec, chosen by the engine per incarnation:
//   "shm:/arbor-tp-<...>"      ranks on one host: ShmRegion::open_named (shm_collective.h); rank 0
//                              unlinks the name after the first call succeeded (every rank has it
//                              mapped by then), so nothing is left in /dev/shm
//   "gloo:<dir>:<prefix>"      ranks anywhere: GlooCollective over a FileStore in <dir> (a folder
//                              every rank can reach) under key prefix <prefix>; this rank's
//                              address is `hostname` given to the constructor
//
// Thread-safety: join() and the calls from one thread (the shard's session thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "collective/collective.h"

namespace arbor::collective {

// The parts of a group spec. kInvalidArgument naming the spec and the expected forms.
struct GroupSpec {
  enum class Transport { kShm, kGloo };
  Transport transport = Transport::kShm;
  std::string name;      // shm: the shm_open name ("/..."); gloo: the FileStore folder
  std::string prefix;    // gloo: the incarnation's key prefix
};
Result<GroupSpec> parse_group_spec(std::string_view spec);

class GroupCollective final : public Collective {
 public:
  // rank / size: this process's place, fixed for its life. hostname: this rank's address for
  // gloo (unused by shm).
  GroupCollective(int rank, int size, std::string hostname = "127.0.0.1");
  ~GroupCollective() override;

  // Leaves the current group (if any) and names the next one; connects on the next call.
  // kInvalidArgument when the spec does not parse.
  Status join(std::string_view spec);
  // The spec joined last ("" before any).
  const std::string& spec() const { return spec_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override;
  Status all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) override;
  Status gather(const void* send, size_t bytes, void* recv, const CollectiveTag& tag) override;
  Status broadcast(void* data, size_t bytes, const CollectiveTag& tag) override;
  void set_timeout(std::chrono::milliseconds timeout) override;

 private:
  // The current group's collective, connected on first use.
  Result<Collective*> current();
  // After a call: rank 0 unlinks a shm name once a call went through.
  Status after_call(Status s);

  int rank_ = 0;
  int size_ = 1;
  std::string hostname_;
  std::chrono::milliseconds timeout_{10000};
  std::string spec_;
  GroupSpec parsed_;
  std::unique_ptr<Collective> impl_;  // null until the first call after join()
  bool unlinked_ = false;
};

// Removes a shm group's name if it is still there (a launcher cleaning up after a group that
// died before its first call). No-op for other transports or an unparsable spec.
void remove_group_name(std::string_view spec);

}  // namespace arbor::collective
