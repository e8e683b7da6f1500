// A persistent pool of worker threads for data-parallel kernels.
//
// The thread that calls parallel_for() takes part as worker 0, so ThreadPool(1) starts no
// threads and runs everything inline. A job is a list of chunks that threads claim from a shared
// counter, so a worker the OS has not scheduled yet never holds up the caller: whoever is
// running takes the next chunk, and the caller only waits for chunks actually in progress.
// Idle workers spin briefly (decode issues a few hundred small jobs per token), then yield,
// then sleep on a futex, so an idle engine costs no CPU.
//
// Thread-safety: parallel_for() may be called from one thread at a time and is not reentrant
// (fn must not call parallel_for on the same pool). The workspace is owned by the pool and may be
// used by the calling thread between and inside parallel_for calls (see workspace()).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace arbor::kernels {

class ThreadPool {
 public:
  // num_threads >= 1; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(begin, end, thread_index) over [0, n). With grain == 0 the range is cut into
  // min(n, num_threads()) contiguous chunks of near-equal size; with grain > 0 into chunks of
  // `grain` indices (load balancing for uneven work). Chunks go to whichever thread claims them
  // first (normally one per thread). thread_index is in [0, num_threads()) and is unique among
  // concurrently running calls of fn, so it can index per-thread scratch.
  // Returns when every chunk is done. n <= 0 returns at once.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 0);

  // A 64-byte-aligned scratch buffer of at least `bytes` bytes, owned by the pool. Grows (and
  // invalidates earlier pointers) only when a larger size is requested, so steady-state calls do
  // not allocate. Slot 0 is for data shared by all workers of one call (e.g. quantised
  // activations), prepared by the caller before parallel_for; slots 1..num_threads() are
  // per-thread (slot 1 + thread_index). Outside parallel_for the caller may use slot 0 and its
  // own per-thread slot 1 (it is thread 0); inside fn, only the running thread's own slot.
  // matmul() and matmul_experts() use slot 0 and, for steps of few tokens, every per-thread slot
  // (each thread's own activation records); attention uses the per-thread slots: no slot's
  // contents survive one of those calls.
  void* workspace(int slot, size_t bytes);

 private:
  struct alignas(64) Slot {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void worker_main(int index);
  // Claims and runs chunks of job `generation` until none are left (or a newer job started).
  void run_chunks(int index, uint32_t generation);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::vector<Slot> slots_;

  // The current job; written by the caller before claim_ and generation_ publish it. A thread
  // reads fn_/n_/grain_ only after claiming a chunk, i.e. while the caller still waits.
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 0;
  // (generation << 32) | number of chunks, stored before claim_ publishes the job. A thread
  // reads the chunk count from here and checks the generation: a count read on its own could
  // belong to the next job (written before that job's claim_), and a claim checked against it
  // would take a chunk that does not exist in the finished job.
  std::atomic<uint64_t> job_{0};
  // (generation << 32) | next unclaimed chunk: a claim is a CAS, so a thread still holding an
  // old generation can never take a chunk of a newer job.
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<uint32_t> done_{0};  // chunks finished in the current job
  std::atomic<int> caller_sleeping_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<int> worker_sleepers_{0};  // workers that may sleep on generation_
  std::atomic<bool> stop_{false};
  bool spin_ = true;  // spin before sleeping (off when the pool oversubscribes the cores)
};

}  // namespace arbor::kernels
