// The collectives: tree_sum's fixed order, the shared-memory all-reduce and gather across threads
// and forked processes (bitwise equal to tree_sum at every size, including messages longer than
// a slot), and the failure behaviour: a tag mismatch is an error on every rank, a missing rank
// fails the call at the deadline with its number, and a broken group stays broken. GroupCollective
// (the shard processes' collective): specs parsed or refused by name, a group joined per
// incarnation (shm and gloo), its shm name gone after the first call, a broken group replaced by
// the next one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "collective/collective.h"
#include "collective/gloo_collective.h"
#include "collective/group.h"
#include "collective/shm_collective.h"
#include "support/temp_dir.h"

namespace arbor::collective {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<ShmRegion> region(int size, size_t slot_bytes = 4096) {
  Result<std::shared_ptr<ShmRegion>> r = ShmRegion::create_anonymous({size, slot_bytes});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return *r;
}

// Rank r's contribution to call `call` (values spread over many magnitudes, so that a different
// summation order changes the bits).
std::vector<float> contribution(int rank, int call, int64_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * call + rank));
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mant(gen), expo(gen));
  return v;
}

std::vector<float> expected_sum(int size, int call, int64_t n) {
  std::vector<std::vector<float>> parts;
  std::vector<const float*> ptrs;
  for (int r = 0; r < size; ++r) parts.push_back(contribution(r, call, n));
  for (const auto& p : parts) ptrs.push_back(p.data());
  std::vector<float> out(static_cast<size_t>(n));
  tree_sum(ptrs, out.data(), n);
  return out;
}

TEST(TreeSum, AddsAdjacentPairsLevelByLevel) {
  // In arrival (left-to-right) order 1e8 + 1 - 1e8 + 1 is 1; in the tree it is 0: (1e8 + 1) and
  // (-1e8 + 1) each round back to +-1e8.
  const float a[] = {1e8f}, b[] = {1.0f}, c[] = {-1e8f}, d[] = {1.0f};
  const float* parts[] = {a, b, c, d};
  float out = -1.0f;
  tree_sum(parts, &out, 1);
  EXPECT_EQ(out, 0.0f);
  EXPECT_EQ(((1e8f + 1.0f) + -1e8f) + 1.0f, 1.0f);  // what arrival order would give
  // Three parts: (p0 + p1) + p2.
  const float e[] = {1.0f, 2.0f}, f[] = {1e8f, 3.0f}, g[] = {-1e8f, 4.0f};
  const float* three[] = {e, f, g};
  float out3[2];
  tree_sum(three, out3, 2);
  EXPECT_EQ(out3[0], (1.0f + 1e8f) + -1e8f);
  EXPECT_EQ(out3[1], 9.0f);
}

TEST(TreeSum, LongVectorsMatchTheScalarTree) {
  const int64_t n = 1500;  // crosses the 512-element chunks
  std::vector<std::vector<float>> p;
  for (int r = 0; r < 4; ++r) p.push_back(contribution(r, 7, n));
  const float* ptrs[] = {p[0].data(), p[1].data(), p[2].data(), p[3].data()};
  std::vector<float> out(n);
  tree_sum(ptrs, out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float want = (p[0][i] + p[1][i]) + (p[2][i] + p[3][i]);
    ASSERT_EQ(std::memcmp(&out[i], &want, 4), 0) << i;
  }
}

// Runs fn(rank, collective) on `size` threads sharing one region.
template <class Fn>
void run_threads(int size, size_t slot_bytes, milliseconds timeout, const Fn& fn) {
  auto reg = region(size, slot_bytes);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ShmCollective c(reg, r, timeout);
      fn(r, c);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(ShmCollective, AllReduceIsTheTreeSumOnEveryRankBitForBit) {
  for (int size : {1, 2, 3, 4}) {
    // Sizes around the 4 KiB slot: one piece, exactly one, several pieces.
    const int64_t sizes[] = {1, 1000, 1024, 1025, 5000};
    run_threads(size, 4096, milliseconds(20000), [&](int rank, ShmCollective& c) {
      for (int call = 0; call < 40; ++call) {
        const int64_t n = sizes[call % 5];
        std::vector<float> v = contribution(rank, call, n);
        if ((call + rank) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        const Status s = c.all_reduce_sum(v.data(), n, {1, 42, static_cast<uint32_t>(call)});
        ASSERT_TRUE(s.ok()) << s.to_string();
        const std::vector<float> want = expected_sum(size, call, n);
        ASSERT_EQ(std::memcmp(v.data(), want.data(), n * 4), 0)
            << "size " << size << " rank " << rank << " call " << call;
      }
    });
  }
}

TEST(ShmCollective, GatherConcatenatesByRankOnRankZero) {
  run_threads(3, 4096, milliseconds(20000), [&](int rank, ShmCollective& c) {
    for (int call = 0; call < 10; ++call) {
      const size_t bytes = call % 2 == 0 ? 100 : 10000;  // 10000: three pieces
      std::vector<uint8_t> send(bytes);
      for (size_t i = 0; i < bytes; ++i) send[i] = static_cast<uint8_t>(rank * 7 + i + call);
      std::vector<uint8_t> recv(rank == 0 ? 3 * bytes : 0);
      const Status s = c.gather(send.data(), bytes, rank == 0 ? recv.data() : nullptr,
                                {3, 9, static_cast<uint32_t>(call)});
      ASSERT_TRUE(s.ok()) << s.to_string();
      if (rank != 0) continue;
      for (int r = 0; r < 3; ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(recv[r * bytes + i], static_cast<uint8_t>(r * 7 + i + call)) << r << " " << i;
        }
      }
    }
  });
}

TEST(ShmCollective, BroadcastCopiesRankZerosBytes) {
  run_threads(4, 4096, milliseconds(20000), [&](int rank, ShmCollective& c) {
    for (int call = 0; call < 10; ++call) {
      std::vector<int32_t> v(call % 2 == 0 ? 3 : 3000, rank == 0 ? call : -1);  // 3000: 3 pieces
      const Status s = c.broadcast(v.data(), v.size() * 4, {4, 4, static_cast<uint32_t>(call)});
      ASSERT_TRUE(s.ok()) << s.to_string();
      for (int32_t x : v) ASSERT_EQ(x, call) << "rank " << rank;
    }
  });
}

TEST(ShmCollective, ForkedRanksSumBitwiseEqual) {
  const int size = 4;
  auto reg = region(size, 8192);
  std::vector<pid_t> kids;
  for (int r = 1; r < size; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ShmCollective c(reg, r, milliseconds(20000));
      int bad = 0;
      for (int call = 0; call < 30; ++call) {
        std::vector<float> v = contribution(r, call, 3000);
        if (!c.all_reduce_sum(v.data(), 3000, {5, 1, static_cast<uint32_t>(call)}).ok()) bad = 2;
        const std::vector<float> want = expected_sum(size, call, 3000);
        if (std::memcmp(v.data(), want.data(), v.size() * 4) != 0) bad = 3;
      }
      _exit(bad);
    }
    kids.push_back(pid);
  }
  ShmCollective c(reg, 0, milliseconds(20000));
  for (int call = 0; call < 30; ++call) {
    std::vector<float> v = contribution(0, call, 3000);
    ASSERT_TRUE(c.all_reduce_sum(v.data(), 3000, {5, 1, static_cast<uint32_t>(call)}).ok());
    const std::vector<float> want = expected_sum(size, call, 3000);
    ASSERT_EQ(std::memcmp(v.data(), want.data(), v.size() * 4), 0) << call;
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
}

TEST(ShmCollective, DigestMismatchIsAnErrorOnEveryRank) {
  std::vector<Status> got(2);
  run_threads(2, 4096, milliseconds(20000), [&](int rank, ShmCollective& c) {
    float v[4] = {1, 2, 3, 4};
    got[rank] = c.all_reduce_sum(v, 4, {7, rank == 0 ? 0x1111u : 0x2222u, 3});
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    EXPECT_EQ(got[r].code(), StatusCode::kDataLoss) << got[r].to_string();
    EXPECT_NE(got[r].message().find("not running the same batch"), std::string::npos)
        << got[r].to_string();
    EXPECT_NE(got[r].message().find("0000000000001111"), std::string::npos) << got[r].to_string();
    EXPECT_NE(got[r].message().find("0000000000002222"), std::string::npos) << got[r].to_string();
  }
}

TEST(ShmCollective, DifferentCollectivesOfOneStepAreAnError) {
  std::vector<Status> got(2);
  run_threads(2, 4096, milliseconds(20000), [&](int rank, ShmCollective& c) {
    float v[4] = {1, 2, 3, 4};
    // Rank 1 skipped a collective: it is at #4 while rank 0 is at #3.
    got[rank] = c.all_reduce_sum(v, 4, {7, 5, rank == 0 ? 3u : 4u});
  });
  for (const Status& s : got) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("collective #3"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("collective #4"), std::string::npos) << s.to_string();
  }
}

TEST(ShmCollective, MissingRankFailsAtTheDeadlineAndTheGroupStaysBroken) {
  auto reg = region(2);
  ShmCollective c(reg, 0, milliseconds(300));  // rank 1 never comes
  float v[8] = {};
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = c.all_reduce_sum(v, 8, {2, 3, 0});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("rank 1 did not arrive within 300 ms"), std::string::npos)
      << s.to_string();
  EXPECT_GE(ms, 290.0);
  EXPECT_LT(ms, 3000.0);
  // Broken: the next call fails at once with the same error (well within the 300 ms it would
  // wait for the missing rank again; the margin is for a loaded 2-core machine).
  const auto t1 = std::chrono::steady_clock::now();
  const Status again = c.gather(v, 4, v, {2, 3, 1});
  EXPECT_EQ(again.message(), s.message());
  EXPECT_LT(std::chrono::steady_clock::now() - t1, milliseconds(200));
}

TEST(ShmCollective, ARankThatFailsFailsTheOthersAtOnce) {
  // Rank 2 never arrives. Rank 0 has a short deadline, rank 1 a long one: rank 1 must fail as
  // soon as rank 0 records its failure, naming rank 0 and its reason, not after 30 s.
  auto reg = region(3);
  std::thread late([&] {
    ShmCollective c(reg, 1, milliseconds(30000));
    float v[2] = {};
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = c.all_reduce_sum(v, 2, {1, 1, 0});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 0 failed the group"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("rank 2 did not arrive"), std::string::npos) << s.to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  });
  ShmCollective c(reg, 0, milliseconds(200));
  float v[2] = {};
  EXPECT_FALSE(c.all_reduce_sum(v, 2, {1, 1, 0}).ok());
  late.join();
}

TEST(ShmRegion, NamedRegionsAreSharedAndCheckTheirLayout) {
  const std::string name = "/arbor-tp-test-" + std::to_string(getpid());
  auto a = ShmRegion::open_named(name, {2, 4096}, /*unlink_on_close=*/true);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = ShmRegion::open_named(name, {2, 4096}, false);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto wrong = ShmRegion::open_named(name, {3, 4096}, false);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("laid out for 2 ranks"), std::string::npos)
      << wrong.status().to_string();
  std::thread t([&] {
    ShmCollective c(*b, 1, milliseconds(10000));
    float v[3] = {1, 2, 3};
    ASSERT_TRUE(c.all_reduce_sum(v, 3, {0, 0, 0}).ok());
    EXPECT_EQ(v[2], 6.0f);
  });
  ShmCollective c(*a, 0, milliseconds(10000));
  float v[3] = {1, 2, 3};
  ASSERT_TRUE(c.all_reduce_sum(v, 3, {0, 0, 0}).ok());
  EXPECT_EQ(v[0], 2.0f);
  t.join();
  EXPECT_FALSE(ShmRegion::open_named("no-slash", {2, 4096}, false).ok());
}

// ---- gloo (across hosts; here over loopback with a FileStore in a temp folder) ----

// Runs fn(rank, collective) on `size` threads joined into one gloo group.
template <class Fn>
void run_gloo(int size, milliseconds timeout, const Fn& fn) {
  ASSERT_TRUE(GlooCollective::available())
      << "this build has no gloo: install libgloo-dev (scripts/install_deps.sh --tests)";
  test::TempDir dir("gloo");
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto c = GlooCollective::connect({.rank = r, .size = size, .store_dir = dir.path(),
                                        .prefix = "g", .timeout = timeout});
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      fn(r, **c);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooCollective, AllReduceGatherBroadcastMatchTheShmContract) {
  for (int size : {2, 3}) {
    run_gloo(size, milliseconds(20000), [&](int rank, GlooCollective& c) {
      for (int call = 0; call < 6; ++call) {
        const int64_t n = call % 2 == 0 ? 7 : 5000;
        std::vector<float> v = contribution(rank, call, n);
        const Status s = c.all_reduce_sum(v.data(), n, {1, 2, static_cast<uint32_t>(call)});
        ASSERT_TRUE(s.ok()) << s.to_string();
        const std::vector<float> want = expected_sum(size, call, n);
        ASSERT_EQ(std::memcmp(v.data(), want.data(), n * 4), 0) << size << " " << rank;
      }
      std::vector<int32_t> g = {rank, rank * 10};
      std::vector<int32_t> all(rank == 0 ? 2 * size : 0);
      ASSERT_TRUE(c.gather(g.data(), 8, rank == 0 ? all.data() : nullptr, {1, 2, 9}).ok());
      for (int r = 0; rank == 0 && r < size; ++r) {
        EXPECT_EQ(all[2 * r], r);
        EXPECT_EQ(all[2 * r + 1], 10 * r);
      }
      int32_t token = rank == 0 ? 1234 : -1;
      ASSERT_TRUE(c.broadcast(&token, 4, {1, 2, 10}).ok());
      EXPECT_EQ(token, 1234);
    });
  }
}

TEST(GlooCollective, DigestMismatchIsAnErrorOnEveryRank) {
  std::vector<Status> got(2);
  run_gloo(2, milliseconds(20000), [&](int rank, GlooCollective& c) {
    float v[4] = {1, 2, 3, 4};
    got[rank] = c.all_reduce_sum(v, 4, {7, rank == 0 ? 0x1111u : 0x2222u, 3});
  });
  for (const Status& s : got) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
    EXPECT_NE(s.message().find("not running the same batch"), std::string::npos) << s.to_string();
  }
}

TEST(GlooCollective, ARankThatStopsCallingFailsTheCallAtTheDeadline) {
  run_gloo(2, milliseconds(500), [&](int rank, GlooCollective& c) {
    float v[2] = {1, 2};
    ASSERT_TRUE(c.all_reduce_sum(v, 2, {0, 0, 0}).ok());
    if (rank == 1) {  // stays connected but never makes the second call
      std::this_thread::sleep_for(milliseconds(1500));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = c.all_reduce_sum(v, 2, {0, 0, 1});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_NE(s.message().find("all-reduce over gloo"), std::string::npos) << s.to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1400));
    EXPECT_EQ(c.all_reduce_sum(v, 2, {0, 0, 2}).message(), s.message());  // stays broken
  });
}


// ---- GroupCollective: one object per process, a group per incarnation ----

TEST(GroupSpec, ParsesShmAndGlooAndRefusesTheRestByName) {
  auto shm = parse_group_spec("shm:/arbor-tp-1-a-2");
  ASSERT_TRUE(shm.ok());
  EXPECT_EQ(shm->transport, GroupSpec::Transport::kShm);
  EXPECT_EQ(shm->name, "/arbor-tp-1-a-2");
  auto gloo = parse_group_spec("gloo:/shared/store:arbor-tp-1-a-2");
  ASSERT_TRUE(gloo.ok());
  EXPECT_EQ(gloo->transport, GroupSpec::Transport::kGloo);
  EXPECT_EQ(gloo->name, "/shared/store");
  EXPECT_EQ(gloo->prefix, "arbor-tp-1-a-2");
  for (const char* bad : {"", "shm:", "shm:/", "shm:name", "shm:/a/b", "gloo:", "gloo:dir",
                          "gloo::p", "gloo:dir:", "nccl:x"}) {
    auto r = parse_group_spec(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("must be shm:/NAME"), std::string::npos) << bad;
  }
}

bool shm_name_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);
}

TEST(GroupCollective, CallsBeforeJoinFailAndABadSpecIsRefused) {
  GroupCollective c(0, 2);
  float x = 1;
  const Status s = c.all_reduce_sum(&x, 1, {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no group joined yet"), std::string::npos) << s.to_string();
  EXPECT_EQ(c.join("tcp:1.2.3.4").code(), StatusCode::kInvalidArgument);
}

TEST(GroupCollective, EachIncarnationIsANewShmGroupWhoseNameGoesAfterTheFirstCall) {
  const std::string base = "/arbor-tp-test-" + std::to_string(getpid()) + "-";
  GroupCollective r0(0, 2), r1(1, 2);
  for (GroupCollective* c : {&r0, &r1}) c->set_timeout(milliseconds(500));
  // Incarnation 1: both ranks sum; then rank 1 stops calling, rank 0 fails at the deadline and
  // the group stays broken.
  const std::string g1 = "shm:" + base + "1";
  ASSERT_TRUE(r0.join(g1).ok());
  ASSERT_TRUE(r1.join(g1).ok());
  std::vector<float> got[2];
  {
    std::thread t([&] {
      got[1] = contribution(1, 0, 300);
      EXPECT_TRUE(r1.all_reduce_sum(got[1].data(), 300, {.step = 1}).ok());
    });
    got[0] = contribution(0, 0, 300);
    EXPECT_TRUE(r0.all_reduce_sum(got[0].data(), 300, {.step = 1}).ok());
    t.join();
  }
  const std::vector<float> want = expected_sum(2, 0, 300);
  EXPECT_EQ(std::memcmp(got[0].data(), want.data(), 300 * 4), 0);
  EXPECT_EQ(std::memcmp(got[1].data(), want.data(), 300 * 4), 0);
  EXPECT_FALSE(shm_name_exists(base + "1")) << "rank 0 unlinks the name after the first call";
  float x = 1;
  EXPECT_EQ(r0.all_reduce_sum(&x, 1, {.step = 2}).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(r0.all_reduce_sum(&x, 1, {.step = 3}).ok()) << "a broken group stays broken";
  // Incarnation 2: a new group on the same objects works again.
  const std::string g2 = "shm:" + base + "2";
  ASSERT_TRUE(r0.join(g2).ok());
  ASSERT_TRUE(r1.join(g2).ok());
  int32_t token[2] = {42, -1};
  std::thread t([&] { EXPECT_TRUE(r1.broadcast(&token[1], 4, {.step = 1}).ok()); });
  EXPECT_TRUE(r0.broadcast(&token[0], 4, {.step = 1}).ok());
  t.join();
  EXPECT_EQ(token[1], 42);
  EXPECT_EQ(r0.spec(), g2);
  EXPECT_FALSE(shm_name_exists(base + "2"));
}

TEST(GroupCollective, GlooGroupsJoinOnFirstUse) {
  ASSERT_TRUE(GlooCollective::available());
  test::TempDir dir("group_gloo");
  std::vector<float> got[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      GroupCollective c(r, 2);
      c.set_timeout(milliseconds(20000));
      ASSERT_TRUE(c.join("gloo:" + dir.path() + ":inc1").ok());
      EXPECT_EQ(c.name(), "gloo");
      got[r] = contribution(r, 3, 1000);
      const Status s = c.all_reduce_sum(got[r].data(), 1000, {.step = 7});
      EXPECT_TRUE(s.ok()) << s.to_string();
    });
  }
  for (auto& t : threads) t.join();
  const std::vector<float> want = expected_sum(2, 3, 1000);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(std::memcmp(got[r].data(), want.data(), 4000), 0) << r;
}

}  // namespace
}  // namespace arbor::collective
