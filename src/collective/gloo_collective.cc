#include "collective/gloo_collective.h"

#include <cstring>
#include <exception>
#include <vector>

#if defined(ARBOR_HAVE_GLOO)
#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace arbor::collective {
namespace {

enum Kind : uint32_t { kAllReduce = 1, kGather = 2, kBroadcast = 3 };
const char* kind_name(uint32_t k) {
  return k == kAllReduce ? "all-reduce" : k == kGather ? "gather" : k == kBroadcast ? "broadcast"
                                                                                    : "?";
}

// What precedes every rank's data on the wire.
struct WireHeader {
  uint64_t step, digest;
  uint32_t op, kind;
  uint64_t bytes;
};
static_assert(sizeof(WireHeader) == 32);

}  // namespace

#if defined(ARBOR_HAVE_GLOO)

struct GlooCollective::Impl {
  std::shared_ptr<gloo::transport::Device> device;
  std::unique_ptr<gloo::rendezvous::FileStore> file_store;
  std::unique_ptr<gloo::rendezvous::PrefixStore> store;
  std::shared_ptr<gloo::Context> context;
};

bool GlooCollective::available() { return true; }

Result<std::unique_ptr<GlooCollective>> GlooCollective::connect(const GlooOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return invalid_argument("gloo: rank ", o.rank, " of ", o.size);
  }
  std::unique_ptr<GlooCollective> c(new GlooCollective());
  c->impl_ = std::make_unique<Impl>();
  c->rank_ = o.rank;
  c->size_ = o.size;
  c->timeout_ = o.timeout;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.hostname;
    c->impl_->device = gloo::transport::tcp::CreateDevice(attr);
    c->impl_->file_store = std::make_unique<gloo::rendezvous::FileStore>(o.store_dir);
    c->impl_->store = std::make_unique<gloo::rendezvous::PrefixStore>(o.prefix, *c->impl_->file_store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(o.timeout);
    ctx->connectFullMesh(*c->impl_->store, c->impl_->device);
    c->impl_->context = ctx;
  } catch (const std::exception& e) {
    return failed_precondition("gloo: rank ", o.rank, " of ", o.size, " could not join group '",
                               o.prefix, "' (store ", o.store_dir, ", host ", o.hostname,
                               "): ", e.what());
  }
  return c;
}

GlooCollective::~GlooCollective() = default;

Status GlooCollective::fail(Status s) {
  broken_ = s;
  return s;
}

namespace {

// Compares every rank's header (headers: [size] at `stride` bytes) with `mine`.
Status check_headers(const uint8_t* headers, size_t stride, int size, int rank,
                     const WireHeader& mine) {
  for (int r = 0; r < size; ++r) {
    WireHeader h;
    std::memcpy(&h, headers + r * stride, sizeof(h));
    if (std::memcmp(&h, &mine, sizeof(h)) == 0) continue;
    return data_loss("tensor-parallel ranks disagree: rank ", r, " is in ", kind_name(h.kind),
                     " of ", h.bytes, " bytes (", tag_string({h.step, h.digest, h.op}),
                     "), rank ", rank, " in ", kind_name(mine.kind), " of ", mine.bytes,
                     " bytes (", tag_string({mine.step, mine.digest, mine.op}),
                     "): the ranks are not running the same batch in the same order");
  }
  return ok_status();
}

std::vector<uint8_t> framed(const WireHeader& h, const void* data, size_t bytes) {
  std::vector<uint8_t> v(sizeof(h) + bytes);
  std::memcpy(v.data(), &h, sizeof(h));
  if (bytes > 0) std::memcpy(v.data() + sizeof(h), data, bytes);
  return v;
}

}  // namespace

Status GlooCollective::all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  const WireHeader h{tag.step, tag.digest, tag.op, kAllReduce, bytes};
  std::vector<uint8_t> send = framed(h, data, bytes);
  std::vector<uint8_t> all(send.size() * size_);
  try {
    gloo::AllgatherOptions opts(impl_->context);
    opts.setInput(send.data(), send.size());
    opts.setOutput(all.data(), all.size());
    opts.setTag(seq_++);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return fail(failed_precondition("tensor-parallel all-reduce over gloo (", tag_string(tag),
                                    ") on rank ", rank_, ": ", e.what()));
  }
  Status s = check_headers(all.data(), send.size(), size_, rank_, h);
  if (!s.ok()) return fail(std::move(s));
  std::vector<const float*> parts(static_cast<size_t>(size_));
  std::vector<float> aligned(static_cast<size_t>(n) * size_);
  for (int r = 0; r < size_; ++r) {  // copied out: the frames' floats need not be aligned
    std::memcpy(aligned.data() + r * n, all.data() + r * send.size() + sizeof(h), bytes);
    parts[r] = aligned.data() + r * n;
  }
  tree_sum(parts, data, n);
  return ok_status();
}

Status GlooCollective::gather(const void* send, size_t bytes, void* recv,
                              const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  const WireHeader h{tag.step, tag.digest, tag.op, kGather, bytes};
  std::vector<uint8_t> mine = framed(h, send, bytes);
  std::vector<uint8_t> all(rank_ == 0 ? mine.size() * size_ : 0);
  try {
    gloo::GatherOptions opts(impl_->context);
    opts.setInput(mine.data(), mine.size());
    if (rank_ == 0) opts.setOutput(all.data(), all.size());
    opts.setRoot(0);
    opts.setTag(seq_++);
    opts.setTimeout(timeout_);
    gloo::gather(opts);
  } catch (const std::exception& e) {
    return fail(failed_precondition("tensor-parallel gather over gloo (", tag_string(tag),
                                    ") on rank ", rank_, ": ", e.what()));
  }
  if (rank_ != 0) return ok_status();
  Status s = check_headers(all.data(), mine.size(), size_, rank_, h);
  if (!s.ok()) return fail(std::move(s));
  for (int r = 0; r < size_; ++r) {
    std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, all.data() + r * mine.size() + sizeof(h),
                bytes);
  }
  return ok_status();
}

Status GlooCollective::broadcast(void* data, size_t bytes, const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  WireHeader h{tag.step, tag.digest, tag.op, kBroadcast, bytes};
  std::vector<uint8_t> headers(sizeof(h) * size_);
  try {
    gloo::AllgatherOptions check(impl_->context);
    check.setInput(reinterpret_cast<uint8_t*>(&h), sizeof(h));
    check.setOutput(headers.data(), headers.size());
    check.setTag(seq_++);
    check.setTimeout(timeout_);
    gloo::allgather(check);
  } catch (const std::exception& e) {
    return fail(failed_precondition("tensor-parallel broadcast over gloo (", tag_string(tag),
                                    ") on rank ", rank_, ": ", e.what()));
  }
  Status s = check_headers(headers.data(), sizeof(h), size_, rank_, h);
  if (!s.ok()) return fail(std::move(s));
  if (bytes == 0) return ok_status();
  try {
    gloo::BroadcastOptions opts(impl_->context);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(0);
    opts.setTag(seq_++);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return fail(failed_precondition("tensor-parallel broadcast over gloo (", tag_string(tag),
                                    ") on rank ", rank_, ": ", e.what()));
  }
  return ok_status();
}

#else  // !ARBOR_HAVE_GLOO

struct GlooCollective::Impl {};

bool GlooCollective::available() { return false; }

Result<std::unique_ptr<GlooCollective>> GlooCollective::connect(const GlooOptions&) {
  return unimplemented("this arbor was built without gloo: install libgloo-dev "
                       "(scripts/install_deps.sh) and reconfigure");
}

GlooCollective::~GlooCollective() = default;
Status GlooCollective::fail(Status s) { return broken_ = s; }
Status GlooCollective::all_reduce_sum(float*, int64_t, const CollectiveTag&) {
  return unimplemented("built without gloo");
}
Status GlooCollective::gather(const void*, size_t, void*, const CollectiveTag&) {
  return unimplemented("built without gloo");
}
Status GlooCollective::broadcast(void*, size_t, const CollectiveTag&) {
  return unimplemented("built without gloo");
}

#endif

}  // namespace arbor::collective
