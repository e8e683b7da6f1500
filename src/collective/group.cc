#include "collective/group.h"

#include <sys/mman.h>

#include <utility>

#include "collective/gloo_collective.h"
#include "collective/shm_collective.h"

namespace arbor::collective {

Result<GroupSpec> parse_group_spec(std::string_view spec) {
  const auto bad = [&] {
    return invalid_argument("TP group '", spec, "' must be shm:/NAME (one host) or ",
                            "gloo:DIR:PREFIX (a FileStore folder every rank reaches)");
  };
  GroupSpec g;
  if (spec.starts_with("shm:")) {
    g.transport = GroupSpec::Transport::kShm;
    g.name = std::string(spec.substr(4));
    if (g.name.size() < 2 || g.name[0] != '/' || g.name.find('/', 1) != std::string::npos) {
      return bad();
    }
    return g;
  }
  if (spec.starts_with("gloo:")) {
    const std::string_view rest = spec.substr(5);
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) return bad();
    g.transport = GroupSpec::Transport::kGloo;
    g.name = std::string(rest.substr(0, colon));
    g.prefix = std::string(rest.substr(colon + 1));
    return g;
  }
  return bad();
}

void remove_group_name(std::string_view spec) {
  Result<GroupSpec> g = parse_group_spec(spec);
  if (g.ok() && g->transport == GroupSpec::Transport::kShm) shm_unlink(g->name.c_str());
}

GroupCollective::GroupCollective(int rank, int size, std::string hostname)
    : rank_(rank), size_(size), hostname_(std::move(hostname)) {}

GroupCollective::~GroupCollective() = default;

Status GroupCollective::join(std::string_view spec) {
  ARBOR_ASSIGN_OR_RETURN(GroupSpec parsed, parse_group_spec(spec));
  impl_.reset();
  spec_ = std::string(spec);
  parsed_ = std::move(parsed);
  unlinked_ = false;
  return ok_status();
}

std::string_view GroupCollective::name() const {
  return parsed_.transport == GroupSpec::Transport::kGloo ? "gloo" : "shm";
}

void GroupCollective::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  if (impl_ != nullptr) impl_->set_timeout(timeout);
}

Result<Collective*> GroupCollective::current() {
  if (impl_ != nullptr) return impl_.get();
  if (spec_.empty()) {
    return failed_precondition("TP rank ", rank_, " of ", size_,
                               ": no group joined yet (the engine's Hello names it)");
  }
  if (parsed_.transport == GroupSpec::Transport::kShm) {
    ARBOR_ASSIGN_OR_RETURN(std::shared_ptr<ShmRegion> region,
                           ShmRegion::open_named(parsed_.name, ShmRegionOptions{.size = size_},
                                                 /*unlink_on_close=*/false));
    impl_ = std::make_unique<ShmCollective>(std::move(region), rank_, timeout_);
  } else {
    ARBOR_ASSIGN_OR_RETURN(impl_, GlooCollective::connect(GlooOptions{.rank = rank_,
                                                                      .size = size_,
                                                                      .store_dir = parsed_.name,
                                                                      .prefix = parsed_.prefix,
                                                                      .hostname = hostname_,
                                                                      .timeout = timeout_}));
  }
  return impl_.get();
}

Status GroupCollective::after_call(Status s) {
  if (s.ok() && !unlinked_ && rank_ == 0 && parsed_.transport == GroupSpec::Transport::kShm) {
    shm_unlink(parsed_.name.c_str());  // every rank arrived, so every rank has it mapped
    unlinked_ = true;
  }
  return s;
}

Status GroupCollective::all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) {
  ARBOR_ASSIGN_OR_RETURN(Collective * c, current());
  return after_call(c->all_reduce_sum(data, n, tag));
}

Status GroupCollective::gather(const void* send, size_t bytes, void* recv,
                               const CollectiveTag& tag) {
  ARBOR_ASSIGN_OR_RETURN(Collective * c, current());
  return after_call(c->gather(send, bytes, recv, tag));
}

Status GroupCollective::broadcast(void* data, size_t bytes, const CollectiveTag& tag) {
  ARBOR_ASSIGN_OR_RETURN(Collective * c, current());
  return after_call(c->broadcast(data, bytes, tag));
}

}  // namespace arbor::collective
