// WorkerPool: FIFO order on one thread, every task run once on several, and a destructor that
// finishes the running task, drops (destroys, never runs) the queued ones and joins.
#include "server/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace arbor::server {
namespace {

TEST(WorkerPool, OneThreadRunsTasksInSubmissionOrder) {
  std::vector<int> order;
  std::mutex mu;
  std::promise<void> all_done;
  {
    WorkerPool pool(1);
    EXPECT_EQ(pool.num_threads(), 1);
    for (int i = 0; i < 100; ++i) {
      pool.submit([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
        if (i == 99) all_done.set_value();
      });
    }
    all_done.get_future().wait();
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPool, SeveralThreadsRunEveryTaskOnceOffTheCallersThread) {
  constexpr int kTasks = 1000;
  std::atomic<int> runs{0};
  std::set<std::thread::id> ids;
  std::mutex mu;
  std::promise<void> all_done;
  {
    WorkerPool pool(3);
    for (int i = 0; i < kTasks; ++i) {
      pool.submit([&] {
        {
          std::lock_guard<std::mutex> lock(mu);
          ids.insert(std::this_thread::get_id());
        }
        if (runs.fetch_add(1) + 1 == kTasks) all_done.set_value();
      });
    }
    all_done.get_future().wait();
  }
  EXPECT_EQ(runs.load(), kTasks);
  EXPECT_FALSE(ids.contains(std::this_thread::get_id()));
  EXPECT_LE(ids.size(), 3u);
}

TEST(WorkerPool, DestructorFinishesTheRunningTaskAndDropsTheQueue) {
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first_finished{false};
  std::atomic<int> queued_runs{0};
  auto token = std::make_shared<int>(7);  // held by the queued tasks
  auto pool = std::make_unique<WorkerPool>(1);
  pool->submit([&] {
    started.set_value();
    released.wait();
    first_finished = true;
  });
  started.get_future().wait();
  for (int i = 0; i < 5; ++i) pool->submit([&, token] { ++queued_runs; });
  EXPECT_EQ(pool->num_queued(), 5u);
  EXPECT_EQ(token.use_count(), 6);
  // Lets the running task end only once the destructor has taken the queue (its members live
  // until the join returns, so polling them meanwhile is safe).
  WorkerPool* raw = pool.get();
  std::thread releaser([&] {
    while (raw->num_queued() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    release.set_value();
  });
  pool.reset();
  releaser.join();
  EXPECT_TRUE(first_finished.load());
  EXPECT_EQ(queued_runs.load(), 0);
  EXPECT_EQ(token.use_count(), 1) << "dropped tasks must be destroyed";
}

}  // namespace
}  // namespace arbor::server
