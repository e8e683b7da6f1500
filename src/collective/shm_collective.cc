#include "collective/shm_collective.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/check.h"

namespace arbor::collective {
namespace {

constexpr uint64_t kMagic = 0x61726230'74707368ull;  // "arb0tpsh"
constexpr size_t kHeaderBytes = 1024;
constexpr size_t kCounterBytes = 128;  // arrived and done on their own cache lines
constexpr size_t kSlotHeaderBytes = 64;
constexpr size_t kReasonBytes = 768;

// The region's first kHeaderBytes.
struct RegionHeader {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
  int32_t failed_rank;  // 0: none; else the failing rank + 1 (claimed by CAS)
  int32_t reason_ready;
  char reason[kReasonBytes];
};
static_assert(sizeof(RegionHeader) <= kHeaderBytes);

enum Kind : uint32_t { kAllReduce = 1, kGather = 2, kBroadcast = 3 };

struct SlotHeader {
  uint64_t seq, step, digest;
  uint32_t op, kind;
  uint64_t total, offset, bytes;  // the whole message's bytes; this piece's offset and bytes
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);

size_t round64(size_t n) { return (n + 63) / 64 * 64; }

template <class T>
std::atomic_ref<T> atomic_at(T& v) {
  return std::atomic_ref<T>(v);
}

void lay_out(uint8_t* base, const ShmRegionOptions& o) {
  auto* h = reinterpret_cast<RegionHeader*>(base);
  h->size = static_cast<uint64_t>(o.size);
  h->slot_bytes = o.slot_bytes;
}

Status check_layout(uint8_t* base, const ShmRegionOptions& o, const std::string& name) {
  auto* h = reinterpret_cast<RegionHeader*>(base);
  uint64_t expected = 0;
  // The first rank to get here lays the region out; the others wait for its magic.
  if (atomic_at(h->magic).load() == 0) {
    lay_out(base, o);
    atomic_at(h->magic).compare_exchange_strong(expected, kMagic);
  }
  if (h->size != static_cast<uint64_t>(o.size) || h->slot_bytes != o.slot_bytes) {
    return failed_precondition("shared memory ", name, " is laid out for ", h->size,
                               " ranks with ", h->slot_bytes, "-byte slots, not ", o.size,
                               " ranks with ", o.slot_bytes, "-byte slots");
  }
  return ok_status();
}

Status check_options(const ShmRegionOptions& o) {
  if (o.size < 1 || o.size > 64) return invalid_argument("a TP group of ", o.size, " ranks");
  if (o.slot_bytes < 4096 || o.slot_bytes % 64 != 0) {
    return invalid_argument("shm slot of ", o.slot_bytes, " bytes (>= 4096, a multiple of 64)");
  }
  return ok_status();
}

}  // namespace

size_t ShmRegion::bytes_for(const ShmRegionOptions& o) {
  return kHeaderBytes + kCounterBytes * o.size +
         2 * static_cast<size_t>(o.size) * (kSlotHeaderBytes + round64(o.slot_bytes));
}

Result<std::shared_ptr<ShmRegion>> ShmRegion::create_anonymous(const ShmRegionOptions& o) {
  ARBOR_RETURN_IF_ERROR(check_options(o));
  const size_t bytes = bytes_for(o);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return io_error("mmap of ", bytes, " shared bytes for a TP group: ", std::strerror(errno));
  }
  std::shared_ptr<ShmRegion> r(new ShmRegion());
  r->options_ = o;
  r->base_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  ARBOR_RETURN_IF_ERROR(check_layout(r->base_, o, "(anonymous)"));
  return r;
}

Result<std::shared_ptr<ShmRegion>> ShmRegion::open_named(const std::string& name,
                                                         const ShmRegionOptions& o,
                                                         bool unlink_on_close) {
  ARBOR_RETURN_IF_ERROR(check_options(o));
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return invalid_argument("shared memory name '", name, "' must be '/' and one path element");
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return io_error("shm_open ", name, ": ", std::strerror(errno));
  const size_t bytes = bytes_for(o);
  struct stat st {};
  if (fstat(fd, &st) != 0 ||
      (static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    const int e = errno;
    close(fd);
    return io_error("sizing shared memory ", name, " to ", bytes, " bytes: ", std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) return io_error("mmap of shared memory ", name, ": ", std::strerror(e));
  std::shared_ptr<ShmRegion> r(new ShmRegion());
  r->options_ = o;
  r->base_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  if (unlink_on_close) r->unlink_name_ = name;
  ARBOR_RETURN_IF_ERROR(check_layout(r->base_, o, name));
  return r;
}

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (!unlink_name_.empty()) shm_unlink(unlink_name_.c_str());
}

namespace {

struct Layout {
  uint8_t* base;
  int size;
  size_t slot_stride;
  RegionHeader& header() const { return *reinterpret_cast<RegionHeader*>(base); }
  uint64_t& arrived(int r) const {
    return *reinterpret_cast<uint64_t*>(base + kHeaderBytes + kCounterBytes * r);
  }
  uint64_t& done(int r) const {
    return *reinterpret_cast<uint64_t*>(base + kHeaderBytes + kCounterBytes * r + 64);
  }
  uint8_t* slot(int r, uint64_t seq) const {
    return base + kHeaderBytes + kCounterBytes * size + (2 * r + (seq & 1)) * slot_stride;
  }
  SlotHeader& slot_header(int r, uint64_t seq) const {
    return *reinterpret_cast<SlotHeader*>(slot(r, seq));
  }
  uint8_t* slot_data(int r, uint64_t seq) const { return slot(r, seq) + kSlotHeaderBytes; }
};

Layout layout_of(const ShmRegion& region) {
  return Layout{region.base(), region.size(), kSlotHeaderBytes + round64(region.slot_bytes())};
}

void pause_cpu() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct ShmCollective::Piece {
  uint64_t seq;
  CollectiveTag tag;
  uint32_t kind;
  uint64_t total, offset, bytes;
};

ShmCollective::ShmCollective(std::shared_ptr<ShmRegion> region, int rank,
                             std::chrono::milliseconds timeout)
    : region_(std::move(region)), rank_(rank), timeout_(timeout) {
  ARBOR_CHECK(region_ != nullptr);
  ARBOR_CHECK(rank >= 0 && rank < region_->size()) << "rank " << rank << " of " << region_->size();
}

Status ShmCollective::fail(Status s) {
  broken_ = s;
  RegionHeader& h = layout_of(*region_).header();
  int32_t none = 0;
  if (atomic_at(h.failed_rank).compare_exchange_strong(none, rank_ + 1)) {
    const std::string& m = s.message();
    const size_t n = std::min(m.size(), kReasonBytes - 1);
    std::memcpy(h.reason, m.data(), n);
    h.reason[n] = '\0';
    atomic_at(h.reason_ready).store(1, std::memory_order_release);
  }
  return s;
}

Status ShmCollective::wait_all(bool arrived, uint64_t target, const Piece& piece,
                               const char* what) {
  const Layout l = layout_of(*region_);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  for (int r = 0; r < l.size; ++r) {
    uint64_t& counter = arrived ? l.arrived(r) : l.done(r);
    for (int64_t spins = 0; atomic_at(counter).load(std::memory_order_acquire) < target; ++spins) {
      if (spins < 256) {
        pause_cpu();
        continue;
      }
      RegionHeader& h = l.header();
      if (atomic_at(h.reason_ready).load(std::memory_order_acquire) != 0) {
        const int failed = h.failed_rank - 1;
        return fail(failed_precondition("tensor-parallel ", what, " (", tag_string(piece.tag),
                                        ") on rank ", rank_, ": rank ", failed,
                                        " failed the group: ", h.reason));
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const uint64_t at = atomic_at(counter).load();
        return fail(failed_precondition(
            "tensor-parallel ", what, " (", tag_string(piece.tag), ") on rank ", rank_, ": rank ",
            r, " did not ", arrived ? "arrive" : "finish reading", " within ", timeout_.count(),
            " ms (it is at call ", at, ", this rank at call ", piece.seq,
            "): the rank is dead, stopped or hung"));
      }
      if (now - start < std::chrono::milliseconds(2)) {
        sched_yield();
      } else {
        const timespec ts{0, 50'000};
        nanosleep(&ts, nullptr);
      }
    }
  }
  return ok_status();
}

Status ShmCollective::check_headers(const Piece& p) {
  const Layout l = layout_of(*region_);
  for (int r = 0; r < l.size; ++r) {
    const SlotHeader& h = l.slot_header(r, p.seq);
    if (h.seq == p.seq && h.step == p.tag.step && h.digest == p.tag.digest && h.op == p.tag.op &&
        h.kind == p.kind && h.total == p.total && h.offset == p.offset && h.bytes == p.bytes) {
      continue;
    }
    const CollectiveTag theirs{h.step, h.digest, h.op};
    const char* kinds[] = {"?", "all-reduce", "gather", "broadcast"};
    return fail(data_loss(
        "tensor-parallel ranks disagree: rank ", r, " is in ", kinds[h.kind <= 3 ? h.kind : 0],
        " of ", h.total, " bytes (", tag_string(theirs), "), rank ", rank_, " in ",
        kinds[p.kind], " of ", p.total, " bytes (", tag_string(p.tag),
        "): the ranks are not running the same batch in the same order"));
  }
  return ok_status();
}

Status ShmCollective::all_reduce_piece(float* data, int64_t n, const Piece& p) {
  const Layout l = layout_of(*region_);
  // Our slot of this parity was last used by call seq - 2: every rank must be done reading it.
  ARBOR_RETURN_IF_ERROR(wait_all(false, p.seq >= 2 ? p.seq - 2 : 0, p, "all-reduce"));
  SlotHeader& h = l.slot_header(rank_, p.seq);
  h = SlotHeader{p.seq, p.tag.step, p.tag.digest, p.tag.op, p.kind, p.total, p.offset, p.bytes};
  std::memcpy(l.slot_data(rank_, p.seq), data, p.bytes);
  atomic_at(l.arrived(rank_)).store(p.seq, std::memory_order_release);
  ARBOR_RETURN_IF_ERROR(wait_all(true, p.seq, p, "all-reduce"));
  ARBOR_RETURN_IF_ERROR(check_headers(p));
  std::vector<const float*> parts(static_cast<size_t>(l.size));
  for (int r = 0; r < l.size; ++r) {
    parts[r] = reinterpret_cast<const float*>(l.slot_data(r, p.seq));
  }
  tree_sum(parts, data, n);
  atomic_at(l.done(rank_)).store(p.seq, std::memory_order_release);
  return ok_status();
}

Status ShmCollective::all_reduce_sum(float* data, int64_t n, const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  ARBOR_CHECK_GE(n, 0);
  const int64_t per = static_cast<int64_t>(region_->slot_bytes() / sizeof(float));
  const uint64_t total = static_cast<uint64_t>(n) * sizeof(float);
  for (int64_t i = 0; i == 0 || i < n; i += per) {
    const int64_t m = std::min(per, n - i);
    const Piece p{++seq_, tag, kAllReduce, total, static_cast<uint64_t>(i) * sizeof(float),
                  static_cast<uint64_t>(m) * sizeof(float)};
    ARBOR_RETURN_IF_ERROR(all_reduce_piece(data + i, m, p));
  }
  return ok_status();
}

Status ShmCollective::broadcast_piece(uint8_t* data, size_t bytes, const Piece& p) {
  const Layout l = layout_of(*region_);
  ARBOR_RETURN_IF_ERROR(wait_all(false, p.seq >= 2 ? p.seq - 2 : 0, p, "broadcast"));
  SlotHeader& h = l.slot_header(rank_, p.seq);
  h = SlotHeader{p.seq, p.tag.step, p.tag.digest, p.tag.op, p.kind, p.total, p.offset, p.bytes};
  if (rank_ == 0) std::memcpy(l.slot_data(0, p.seq), data, bytes);
  atomic_at(l.arrived(rank_)).store(p.seq, std::memory_order_release);
  ARBOR_RETURN_IF_ERROR(wait_all(true, p.seq, p, "broadcast"));
  ARBOR_RETURN_IF_ERROR(check_headers(p));
  if (rank_ != 0) std::memcpy(data, l.slot_data(0, p.seq), bytes);
  atomic_at(l.done(rank_)).store(p.seq, std::memory_order_release);
  return ok_status();
}

Status ShmCollective::broadcast(void* data, size_t bytes, const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  const size_t per = region_->slot_bytes();
  auto* d = static_cast<uint8_t*>(data);
  for (size_t i = 0; i == 0 || i < bytes; i += per) {
    const size_t m = std::min(per, bytes - i);
    const Piece p{++seq_, tag, kBroadcast, bytes, i, m};
    ARBOR_RETURN_IF_ERROR(broadcast_piece(d + i, m, p));
  }
  return ok_status();
}

Status ShmCollective::gather_piece(const uint8_t* send, size_t bytes, size_t offset, size_t total,
                                   uint8_t* recv, const Piece& p) {
  const Layout l = layout_of(*region_);
  ARBOR_RETURN_IF_ERROR(wait_all(false, p.seq >= 2 ? p.seq - 2 : 0, p, "gather"));
  SlotHeader& h = l.slot_header(rank_, p.seq);
  h = SlotHeader{p.seq, p.tag.step, p.tag.digest, p.tag.op, p.kind, p.total, p.offset, p.bytes};
  std::memcpy(l.slot_data(rank_, p.seq), send, bytes);
  atomic_at(l.arrived(rank_)).store(p.seq, std::memory_order_release);
  if (rank_ == 0) {
    ARBOR_RETURN_IF_ERROR(wait_all(true, p.seq, p, "gather"));
    ARBOR_RETURN_IF_ERROR(check_headers(p));
    for (int r = 0; r < l.size; ++r) {
      std::memcpy(recv + r * total + offset, l.slot_data(r, p.seq), bytes);
    }
  }
  // Only rank 0 reads the slots; the others are done with this call at once.
  atomic_at(l.done(rank_)).store(p.seq, std::memory_order_release);
  return ok_status();
}

Status ShmCollective::gather(const void* send, size_t bytes, void* recv,
                             const CollectiveTag& tag) {
  if (!broken_.ok()) return broken_;
  ARBOR_CHECK(rank_ != 0 || recv != nullptr || bytes == 0);
  const size_t per = region_->slot_bytes();
  const auto* s = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  for (size_t i = 0; i == 0 || i < bytes; i += per) {
    const size_t m = std::min(per, bytes - i);
    const Piece p{++seq_, tag, kGather, bytes, i, m};
    ARBOR_RETURN_IF_ERROR(gather_piece(s + i, m, i, bytes, out, p));
  }
  return ok_status();
}

}  // namespace arbor::collective
