// Clients that hang up mid-stream get their requests aborted and every KV block back; SSE
// keep-alive comments; graceful shutdown drains in-flight requests and exits 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

// Long generations (the context is 2048 tokens, prompts are short).
const char* kLongStream =
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"ignore_eos\":true,\"stream\":true}";

TEST(ServerHangup, TwentyStreamingClientsHangUpAndEveryBlockReturns) {
  ServerProcess server({"--max-num-seqs", "32"});
  ASSERT_TRUE(server.ok());
  const double total = server.metric("arbor_kv_blocks_usable");
  ASSERT_GT(total, 0);
  std::vector<int> fds(20, -1);
  for (int i = 0; i < 20; ++i) {
    // Read until the first SSE event arrived: the request holds blocks now.
    const std::string got = raw_exchange(server.port(), post_raw("/v1/completions", kLongStream),
                                         1, &fds[i]);
    ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
  }
  EXPECT_GT(server.metric("arbor_kv_blocks_used"), 20) << "the 20 streams hold blocks";
  EXPECT_EQ(server.metric("arbor_http_active_requests"), 20);
  for (int fd : fds) close(fd);
  EXPECT_TRUE(server.wait_no_blocks_used()) << "blocks used: "
                                            << server.metric("arbor_kv_blocks_used");
  EXPECT_EQ(server.metric("arbor_kv_blocks_free"), total);
  EXPECT_GE(server.metric("arbor_request_aborted_total"), 1);
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_EQ(server.terminate(), 0);
}

int num_threads(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

TEST(ServerHangup, IdleAndStreamingConnectionsCostNoThreads) {
  ServerProcess server({"--max-num-seqs", "32"});
  ASSERT_TRUE(server.ok());
  const int before = num_threads(server.pid());
  ASSERT_GT(before, 0);
  std::vector<int> fds;
  for (int i = 0; i < 400; ++i) {  // idle: half a request header, never finished
    int fd = -1;
    raw_exchange(server.port(), "GET /health HTTP/1.1\r\nHost: x\r\n", 0, &fd);
    fds.push_back(fd);
  }
  for (int i = 0; i < 20; ++i) {
    int fd = -1;
    raw_exchange(server.port(), post_raw("/v1/completions", kLongStream), 1, &fd);
    fds.push_back(fd);
  }
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_EQ(num_threads(server.pid()), before) << "connections must not add threads";
  for (int fd : fds) close(fd);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerHangup, PipelinedRequestsInOrderThenIdleTimeoutCloses) {
  ServerProcess server({"--idle-timeout", "0.5"});
  ASSERT_TRUE(server.ok());
  const std::string raw = post_raw("/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":3}") +
                          "GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                          "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  // Reads until the server closes the idle connection (or 10 s pass).
  const auto start = std::chrono::steady_clock::now();
  const std::string got = raw_exchange(server.port(), raw, 1u << 30);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t count = 0;
  for (size_t at = got.find("HTTP/1.1 200 OK"); at != std::string::npos;
       at = got.find("HTTP/1.1 200 OK", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 3u) << got;
  EXPECT_LT(got.find("text_completion"), got.find("model_id"));
  EXPECT_LT(secs, 5.0) << "the idle connection must be closed after --idle-timeout";
}

TEST(ServerHangup, NonStreamingClientHangUpAborts) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const std::string body =
      "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"ignore_eos\":true}";
  for (int i = 0; i < 5; ++i) {
    int fd = -1;
    raw_exchange(server.port(), post_raw("/v1/completions", body), 0, &fd);
    close(fd);
  }
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerHangup, KeepAliveCommentsWhileStreamIsSilent) {
  // A slow stream: one running slot, so the second request waits silently behind the first.
  ServerProcess server({"--sse-keepalive", "0.05", "--max-num-seqs", "1"});
  ASSERT_TRUE(server.ok());
  int fd1 = -1;
  raw_exchange(server.port(), post_raw("/v1/completions", kLongStream), 1, &fd1);
  const std::string got = raw_exchange(server.port(), post_raw("/v1/completions", kLongStream),
                                       1 << 14);
  close(fd1);
  EXPECT_NE(got.find(": keep-alive"), std::string::npos) << got.substr(0, 300);
  EXPECT_NE(got.find("data: "), std::string::npos) << got.substr(0, 300);
  EXPECT_TRUE(server.wait_no_blocks_used());
}

// Reads what is left on `fd` until the peer closes.
std::string read_rest(int fd) {
  std::string got;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
  close(fd);
  return got;
}

const char* kDrainStream =
    "{\"prompt\":\"Once\",\"max_tokens\":1900,\"ignore_eos\":true,\"stream\":true}";

TEST(ServerShutdown, SigtermDrainsInFlightRequestsAndExitsZero) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  int fd = -1;
  const std::string first = raw_exchange(server.port(), post_raw("/v1/completions", kDrainStream),
                                         1, &fd);
  ASSERT_NE(first.find("200 OK"), std::string::npos);
  // The request is running: SIGTERM lets it finish (socket buffers hold the whole stream).
  EXPECT_EQ(server.terminate(), 0);
  const std::string rest = read_rest(fd);
  EXPECT_NE(rest.find("\"finish_reason\":\"length\""), std::string::npos) << rest.substr(0, 300);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
}

// Streams of several MB (more than the socket buffers hold) to clients that have not read
// them yet when SIGTERM comes: the drain waits for the bytes, not just for generation.
TEST(ServerShutdown, SlowReadersReceiveCompleteStreams) {
  ServerProcess server({"--shutdown-timeout", "60"});
  ASSERT_TRUE(server.ok());
  const std::string body =
      "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"ignore_eos\":true,"
      "\"stream\":true,\"n\":8,\"logprobs\":5}";
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {  // the server's queue holds what the small windows do not
    const int fd = connect_small_window(server.port(), post_raw("/v1/completions", body));
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  // Generation ends (nothing running) while most bytes are still queued in the server.
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (server.metric("arbor_request_finished_total") >= 2 &&
        server.metric("arbor_http_active_requests") == 0) {
      break;
    }
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  for (int fd : fds) {
    const std::string got = read_to_close(fd, /*pause_us=*/200);
    close(fd);
    EXPECT_GT(got.size(), 4u << 20) << "a stream of several MB";
    EXPECT_EQ(sse_payloads(got).back(), "[DONE]");
    EXPECT_EQ(got.substr(got.size() - 5), "0\r\n\r\n") << "no chunk terminator";
  }
  EXPECT_EQ(server.wait_exit(), 0);
}

TEST(ServerShutdown, SecondSignalStopsAtOnceAndExitsNonZero) {
  ServerProcess server({"--shutdown-timeout", "60"});
  ASSERT_TRUE(server.ok());
  int fd = -1;
  // 8 x 1900 tokens: seconds of work, still running when both signals come.
  raw_exchange(server.port(),
               post_raw("/v1/completions",
                        "{\"prompt\":\"Once\",\"max_tokens\":1900,\"ignore_eos\":true,"
                        "\"stream\":true,\"n\":8}"),
               1, &fd);
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  const int code = server.wait_exit(10.0);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "it must exit (not hang) after the second signal";
  close(fd);
}

TEST(ServerShutdown, DeadlineAbortsWhatIsStillRunning) {
  ServerProcess server({"--shutdown-timeout", "0"});
  ASSERT_TRUE(server.ok());
  int fd = -1;
  raw_exchange(server.port(), post_raw("/v1/completions", kDrainStream), 1, &fd);
  EXPECT_EQ(server.terminate(), 0);
  const std::string rest = read_rest(fd);
  EXPECT_NE(rest.find("\"finish_reason\":\"abort\""), std::string::npos) << rest.substr(0, 300);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace arbor::server::testing
