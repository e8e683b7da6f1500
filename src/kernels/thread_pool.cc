#include "kernels/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "base/check.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace arbor::kernels {
namespace {

// How long an idle thread spins before it sleeps. Decode issues a job every ~100 us, so a short
// spin keeps wake-up latency at a few hundred nanoseconds without burning a core when idle.
constexpr int kPauseSpins = 2000;
constexpr auto kSpinBudget = std::chrono::microseconds(300);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Sleeps while *word == expected (spurious returns are fine: callers loop).
void wait_on(std::atomic<uint32_t>& word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
#else
  word.wait(expected);
#endif
}

void wake_all(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
#else
  word.notify_all();
#endif
}

// Spins (then sleeps) until word != value; returns the new value. `sleepers` counts threads
// that may be asleep on `word`, so wakers can skip the syscall when nobody sleeps.
uint32_t await_change(std::atomic<uint32_t>& word, uint32_t value, std::atomic<int>& sleepers,
                      bool spin) {
  uint32_t now = word.load(std::memory_order_acquire);
  if (now != value) return now;
  if (spin) {
    // Pause-spin first (wake-up in well under a microsecond), then yield so that a peer that
    // the OS descheduled (a loaded machine) can run on this core, then sleep.
    for (int i = 0; i < kPauseSpins; ++i) {
      cpu_relax();
      now = word.load(std::memory_order_acquire);
      if (now != value) return now;
    }
    const auto deadline = std::chrono::steady_clock::now() + kSpinBudget;
    for (int i = 1;; ++i) {
      std::this_thread::yield();
      now = word.load(std::memory_order_acquire);
      if (now != value) return now;
      if ((i & 15) == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
  }
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while ((now = word.load(std::memory_order_seq_cst)) == value) wait_on(word, value);
  sleepers.fetch_sub(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return now;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  ARBOR_CHECK_GE(num_threads, 0) << "thread count must be >= 0";
  if (num_threads == 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(num_threads, 1);
  // With more threads than cores a spinning thread can hold the core that the thread it waits
  // for needs, so oversubscribed pools sleep at once.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  spin_ = static_cast<unsigned>(num_threads_) <= cores;
  slots_ = std::vector<Slot>(static_cast<size_t>(num_threads_) + 1);
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back(&ThreadPool::worker_main, this, i);
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  wake_all(generation_);
  for (std::thread& t : workers_) t.join();
  for (Slot& s : slots_) std::free(s.data);
}

void ThreadPool::worker_main(int index) {
  uint32_t seen = 0;
  for (;;) {
    seen = await_change(generation_, seen, worker_sleepers_, spin_);
    if (stop_.load(std::memory_order_relaxed)) return;
    run_chunks(index, seen);
  }
}

void ThreadPool::run_chunks(int index, uint32_t generation) {
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(c >> 32) != generation) return;
    const uint32_t chunk = static_cast<uint32_t>(c);
    const uint64_t job = job_.load(std::memory_order_acquire);
    // A newer job is being set up, so ours has finished (it cannot start before ours ends).
    if (static_cast<uint32_t>(job >> 32) != generation) return;
    const uint32_t num_chunks = static_cast<uint32_t>(job);
    if (chunk >= num_chunks) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    // Claimed: the job cannot finish (nor be replaced) before this chunk is done.
    int64_t begin, end;
    if (grain_ > 0) {
      begin = static_cast<int64_t>(chunk) * grain_;
      end = std::min(n_, begin + grain_);
    } else {
      const int64_t q = n_ / num_chunks, r = n_ % num_chunks;
      begin = chunk * q + std::min<int64_t>(chunk, r);
      end = begin + q + (chunk < r ? 1 : 0);
    }
    (*fn_)(begin, end, index);
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == num_chunks &&
        caller_sleeping_.load(std::memory_order_seq_cst) > 0) {
      wake_all(done_);
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  const int64_t chunks = grain > 0 ? (n + grain - 1) / grain : std::min<int64_t>(n, num_threads_);
  ARBOR_CHECK_LE(chunks, int64_t{UINT32_MAX}) << "grain " << grain << " too small for n " << n;
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  job_.store((static_cast<uint64_t>(generation) << 32) | static_cast<uint64_t>(chunks),
             std::memory_order_release);
  claim_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  if (num_threads_ > 1 && chunks > 1) {
    generation_.store(generation, std::memory_order_seq_cst);
    if (worker_sleepers_.load(std::memory_order_seq_cst) > 0) wake_all(generation_);
  } else {
    generation_.store(generation, std::memory_order_relaxed);
  }
  run_chunks(0, generation);
  uint32_t finished = done_.load(std::memory_order_acquire);
  while (finished != chunks) finished = await_change(done_, finished, caller_sleeping_, spin_);
}

void* ThreadPool::workspace(int slot, size_t bytes) {
  ARBOR_CHECK(slot >= 0 && slot <= num_threads_) << "workspace slot " << slot;
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (bytes > s.bytes) {
    std::free(s.data);
    const size_t rounded = (bytes + 63) / 64 * 64;
    s.data = std::aligned_alloc(64, rounded);
    ARBOR_CHECK(s.data != nullptr) << "out of memory allocating " << rounded << " bytes";
    s.bytes = rounded;
  }
  return s.data;
}

}  // namespace arbor::kernels
