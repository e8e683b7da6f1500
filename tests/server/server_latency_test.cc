// Request preparation runs off the I/O thread: while a huge prompt is being tokenised, the other
// requests keep streaming at their normal inter-token latency. And a client that hangs up while
// its request is being prepared gets nothing submitted.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One streaming completion: when it was sent and when each of its SSE events arrived.
struct Stream {
  std::vector<Clock::time_point> marks;  // the send, then each read that brought SSE events
  std::string head;                      // the first bytes (status line)
};

// Streams `body` until "[DONE]", or until an event arrives after `stop` was seen set.
Stream run_stream(int port, const std::string& body, const std::atomic<bool>& stop,
                  std::atomic<int>* num_events) {
  Stream s;
  const int fd = connect_to(port);
  if (fd < 0) return s;
  s.marks.push_back(Clock::now());
  if (!send_all(fd, post_raw("/v1/completions", body))) {
    close(fd);
    return s;
  }
  std::string tail;  // the last bytes of the previous read: a marker may be split across reads
  char buf[65536];
  for (;;) {
    const bool stopping = stop.load();
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    const Clock::time_point now = Clock::now();
    const std::string got = tail + std::string(buf, static_cast<size_t>(n));
    if (s.head.empty()) s.head = got.substr(0, 64);
    int events = 0;
    for (size_t at = got.find("data: "); at != std::string::npos; at = got.find("data: ", at + 1)) {
      if (at + 6 > tail.size()) ++events;  // markers wholly inside `tail` were counted before
    }
    if (events > 0) s.marks.push_back(now);  // events that arrive together are one arrival
    num_events->fetch_add(events);
    if (got.find("data: [DONE]") != std::string::npos || (stopping && events > 0)) break;
    tail = got.substr(got.size() - std::min<size_t>(got.size(), 11));
  }
  close(fd);
  return s;
}

// Runs streams back to back until `stop`; the last one sees an event after `stop` was set.
void stream_until(int port, const std::string& body, const std::atomic<bool>& stop,
                  std::atomic<int>* num_events, std::vector<Stream>* out) {
  while (!stop.load()) out->push_back(run_stream(port, body, stop, num_events));
}

// Sends one request and reads its whole (Content-Length) response; returns the status code.
int exchange(int port, const std::string& raw, std::string* body) {
  const int fd = connect_to(port);
  if (fd < 0 || !send_all(fd, raw)) return 0;
  std::string got;
  char buf[65536];
  size_t need = std::string::npos;
  while (got.size() < need) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    const size_t end = got.find("\r\n\r\n");
    const size_t cl = got.find("Content-Length: ");
    if (end != std::string::npos && cl != std::string::npos && cl < end) {
      need = end + 4 + std::stoul(got.substr(cl + 16));
    }
  }
  close(fd);
  const size_t end = got.find("\r\n\r\n");
  if (body != nullptr && end != std::string::npos) *body = got.substr(end + 4);
  return got.size() > 12 ? std::atoi(got.c_str() + 9) : 0;
}

// A prompt of `num_chars` characters of story-like text (words the tokenizer knows, so the
// tokenisation cost is the realistic one, not the byte-fallback one).
std::string long_prompt(size_t num_chars) {
  const std::string words = "Once upon a time, there was a little girl named Lily. She liked to "
                            "play in the park with her dog and her friends. ";
  std::string s;
  while (s.size() < num_chars) s += words;
  s.resize(num_chars);
  return s;
}

// Tokenising costs about 60-100 ns per character with the stories260K vocabulary (docs/server.md
// has the measurements), so 100,000 characters take only ~6 ms and a stall of that size would
// hide in scheduling noise. 12,000,000 characters (a 12 MB body, under the test server's
// --max-body-mib 32) take ~1 s: on the I/O thread they stall every stream by that much, far
// over the bound below.
constexpr size_t kHugePromptChars = 12000000;
// Enough to keep one worker busy for ~0.3 s.
constexpr size_t kBusyPromptChars = 4000000;

TEST(ServerLatency, StreamsKeepTheirPaceWhileAHugePromptIsTokenised) {
  ServerProcess server({"--max-body-mib", "32"});
  ASSERT_TRUE(server.ok());
  const std::string huge =
      post_raw("/v1/completions",
               json{{"prompt", long_prompt(kHugePromptChars)}, {"max_tokens", 1}}.dump());
  // Each reader runs streams back to back, so streams cover the whole window however fast the
  // machine is.
  const std::string stream_body =
      "{\"prompt\":\"Once upon a time\",\"max_tokens\":1900,\"ignore_eos\":true,"
      "\"stream\":true,\"temperature\":0}";
  constexpr int kReaders = 3;
  std::vector<std::vector<Stream>> streams(kReaders);
  std::atomic<bool> stop{false};
  std::atomic<int> num_events{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back(stream_until, server.port(), stream_body, std::cref(stop), &num_events,
                         &streams[i]);
  }
  for (int i = 0; i < 2000 && num_events.load() < kReaders * 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(num_events.load(), kReaders * 20) << "the streams did not start";

  const Clock::time_point window_start = Clock::now();
  std::string body;
  const int status = exchange(server.port(), huge, &body);
  const Clock::time_point window_end = Clock::now();
  stop = true;
  for (std::thread& t : readers) t.join();
  // Tokenised first, then refused for its length.
  EXPECT_EQ(status, 400) << body.substr(0, 300);
  const json err = json::parse(body, nullptr, false);
  EXPECT_EQ(err["error"]["code"], "context_length_exceeded") << body.substr(0, 300);

  std::vector<double> gaps;
  double max_in_window = 0;
  for (int i = 0; i < kReaders; ++i) {
    ASSERT_FALSE(streams[i].empty());
    // Otherwise the window proves nothing: this reader streamed from before it to after it.
    ASSERT_LT(streams[i].front().marks.front(), window_start);
    ASSERT_GT(streams[i].back().marks.back(), window_end);
    for (const Stream& s : streams[i]) {
      ASSERT_NE(s.head.find("200 OK"), std::string::npos) << s.head;
      for (size_t k = 1; k < s.marks.size(); ++k) {
        const double gap = ms_between(s.marks[k - 1], s.marks[k]);
        gaps.push_back(gap);
        if (s.marks[k] > window_start && s.marks[k - 1] < window_end) {
          max_in_window = std::max(max_in_window, gap);
        }
      }
    }
  }
  ASSERT_GT(gaps.size(), 100u);
  std::sort(gaps.begin(), gaps.end());
  const double median = gaps[gaps.size() / 2];
  const double bound = std::max(250.0, 10 * median);
  std::printf("huge prompt (%zu chars) answered in %.1f ms; other streams: median gap %.3f ms, "
              "max gap during the window %.1f ms (bound %.1f ms)\n",
              kHugePromptChars, ms_between(window_start, window_end), median, max_in_window,
              bound);
  EXPECT_LT(max_in_window, bound) << "the streams stalled while the huge prompt was tokenised";
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// One worker, busy with a huge prompt; a short request queued behind it whose client hangs up
// is never submitted to the engine, and the server stays healthy.
TEST(ServerLatency, ClientThatLeavesDuringPreparationIsNeverSubmitted) {
  ServerProcess server({"--tokenizer-threads", "1"});
  ASSERT_TRUE(server.ok());
  const double submitted_before = server.metric("arbor_request_submitted_total");
  ASSERT_GE(submitted_before, 0);
  const std::string huge = json{{"prompt", long_prompt(kBusyPromptChars)}, {"max_tokens", 1}}.dump();
  std::string huge_body;
  int huge_status = 0;
  std::thread busy([&] {
    huge_status = exchange(server.port(), post_raw("/v1/completions", huge), &huge_body);
  });
  // The huge request is being prepared (the gauge counts it) and holds the only worker.
  for (int i = 0; i < 1000 && server.metric("arbor_http_active_requests") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(server.metric("arbor_http_active_requests"), 1);
  for (int i = 0; i < 5; ++i) {
    const int fd = connect_to(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, post_raw("/v1/completions",
                                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,"
                                      "\"ignore_eos\":true,\"stream\":true}")));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    close(fd);
  }
  busy.join();
  EXPECT_EQ(huge_status, 400) << huge_body.substr(0, 300);
  EXPECT_EQ(server.get("/health").status, 200);
  // A request that does arrive afterwards is served normally.
  const HttpResult ok = server.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 3}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.metric("arbor_request_submitted_total") - submitted_before, 1)
      << "only the last request may reach the engine";
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
