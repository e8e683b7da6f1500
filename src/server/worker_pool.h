// WorkerPool: a few threads that run the server's per-request CPU work that grows with the input
// (tokenisation, chat-template rendering, JSON parsing of the body), so the single HTTP I/O
// thread never waits for it (docs/server.md, "Threads and data flow").
//
// Tasks run in submission order, each on one of the pool's threads; a task that wants to answer
// posts back to the I/O thread itself. The pool knows nothing about HTTP or the engine.
//
// Thread-safety: submit() from any thread. The destructor may run on any thread that is not one
// of the pool's: it lets the running tasks finish, drops the queued ones (destroying them on
// the destroying thread) and joins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace arbor::server {

class WorkerPool {
 public:
  // Starts `num_threads` threads (>= 1, CHECKed).
  explicit WorkerPool(int32_t num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`. A task must not throw (CHECK-fails the process) and must not call submit()
  // after the destructor started (it would be dropped with the queue).
  void submit(std::function<void()> task);
  int32_t num_threads() const { return static_cast<int32_t>(threads_.size()); }
  // Tasks queued and not yet started (for tests and logs).
  size_t num_queued() const;

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace arbor::server
