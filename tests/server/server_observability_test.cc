// End to end: what `arbor serve` tells its operator. One info line per request with its status
// and the id the client sees (X-Request-Id, the OpenAI body's id), failures included; the
// periodic engine line while busy (--log-stats-interval); --help shows the defaults.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

struct Answer {
  HttpResult result;
  std::string request_id;  // the X-Request-Id header of the answer
};

// Sends `body`, with X-Request-Id: `sent_id` unless it is empty.
Answer call(const ServerProcess& server, const test::TempDir& dir, const std::string& method,
            const std::string& path, const json& body, const std::string& sent_id) {
  static int n = 0;
  const std::string headers = dir / ("headers" + std::to_string(n++));
  std::string curl = "-D '" + headers + "'";
  if (!sent_id.empty()) curl += " -H 'X-Request-Id: " + sent_id + "'";
  Answer a;
  a.result = server.request(method, path, body.dump(), curl);
  std::istringstream in(test::read_file(headers));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("X-Request-Id: ", 0) == 0) a.request_id = line.substr(14);
  }
  return a;
}

std::vector<std::string> log_lines(const std::string& log, const std::string& marker) {
  std::vector<std::string> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(marker) != std::string::npos) out.push_back(line);
  }
  return out;
}

// Exactly one line holds `needle`, and it holds `also`.
void expect_one_line(const std::vector<std::string>& lines, const std::string& needle,
                     const std::string& also) {
  std::vector<std::string> hits;
  for (const std::string& l : lines) {
    if (l.find(needle) != std::string::npos) hits.push_back(l);
  }
  ASSERT_EQ(hits.size(), 1u) << "lines with '" << needle << "'";
  EXPECT_NE(hits[0].find(also), std::string::npos) << hits[0];
  EXPECT_EQ(hits[0].rfind("I ", 0), 0u) << "at info level: " << hits[0];
}

bool is_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A streaming request with X-Request-Id: `id` whose client hangs up after the first chunk.
void hang_up_mid_stream(int port, const std::string& id) {
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 1500},
                                {"ignore_eos", true}, {"stream", true}}.dump();
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Type: application/json\r\nX-Request-Id: " + id +
                               "\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\n\r\n" + body));
  std::string got;
  char buf[4096];
  while (got.find("data:") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(got.find("X-Request-Id: " + id), std::string::npos) << got;
  close(fd);
}

TEST(ServerRequestLog, EveryRequestIsOneInfoLineWithTheIdTheClientSees) {
  test::TempDir dir("reqlog");
  const std::string log = dir / "server.log";
  ServerProcess server({}, 0, "", log);
  ASSERT_TRUE(server.ok());
  const json ok_body{{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"ignore_eos", true}};

  // No X-Request-Id: the server makes one, sends it back, and the body's id builds on it.
  const Answer a = call(server, dir, "POST", "/v1/completions", ok_body, "");
  ASSERT_EQ(a.result.status, 200) << a.result.body;
  ASSERT_EQ(a.request_id.size(), 32u);
  EXPECT_TRUE(is_hex(a.request_id)) << a.request_id;
  EXPECT_EQ(a.result.json()["id"], "cmpl-" + a.request_id);

  // The client's id is echoed and used, in every chunk of a stream too (vLLM's rule).
  json stream_body = ok_body;
  stream_body["stream"] = true;
  const Answer b = call(server, dir, "POST", "/v1/completions", stream_body, "trace/42:a");
  ASSERT_EQ(b.result.status, 200) << b.result.body;
  EXPECT_EQ(b.request_id, "trace/42:a");
  const auto payloads = sse_payloads(b.result.body);
  ASSERT_GE(payloads.size(), 2u);
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    EXPECT_EQ(json::parse(payloads[i])["id"], "cmpl-trace/42:a") << payloads[i];
  }

  // Failures carry the id too.
  const Answer c = call(server, dir, "POST", "/v1/completions",
                                {{"prompt", "x"}, {"top_p", 5}}, "bad-7");
  EXPECT_EQ(c.result.status, 400);
  EXPECT_EQ(c.request_id, "bad-7");
  json unknown_model = ok_body;
  unknown_model["model"] = "nope";
  const Answer d = call(server, dir, "POST", "/v1/completions", unknown_model, "");
  EXPECT_EQ(d.result.status, 404);
  EXPECT_EQ(d.request_id.size(), 32u);
  const Answer e = call(server, dir, "POST", "/generate", {{"inputs", ""}}, "tgi-1");
  EXPECT_EQ(e.result.status, 422);
  EXPECT_EQ(e.request_id, "tgi-1");
  const Answer f = call(server, dir, "GET", "/nope", json::object(), "route-1");
  EXPECT_EQ(f.result.status, 404);
  EXPECT_EQ(f.request_id, "route-1");
  // An id that is not 1-128 visible ASCII characters is replaced.
  const Answer g = call(server, dir, "POST", "/v1/completions", ok_body, std::string(129, 'x'));
  EXPECT_EQ(g.result.status, 200);
  EXPECT_EQ(g.request_id.size(), 32u);
  EXPECT_TRUE(is_hex(g.request_id)) << g.request_id;

  hang_up_mid_stream(server.port(), "gone-1");
  // Probes and scrapes (wait_no_blocks_used polls /metrics) are not info lines.
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);

  const std::vector<std::string> lines = log_lines(test::read_file(log), "request_log.cc");
  expect_one_line(lines, "] POST /v1/completions 200 cmpl-" + a.request_id + " ",
                  " completion=3");
  expect_one_line(lines, "] POST /v1/completions 200 cmpl-trace/42:a ", "completion=3");
  expect_one_line(lines, "] POST /v1/completions 400 bad-7 ", ": 'top_p' is 5");
  expect_one_line(lines, "] POST /v1/completions 404 " + d.request_id + " ", "'nope'");
  expect_one_line(lines, "] POST /generate 422 tgi-1 ", "'inputs'");
  expect_one_line(lines, "] GET /nope 404 route-1 ", "no route");
  expect_one_line(lines, "] POST /v1/completions 200 cmpl-" + g.request_id + " ", "completion=3");
  expect_one_line(lines, "] POST /v1/completions 200 cmpl-gone-1 ", "(client gone)");
  EXPECT_EQ(lines.size(), 8u) << "one line per request, no probe or scrape";
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find("/health"), std::string::npos) << l;
    EXPECT_EQ(l.find("/metrics"), std::string::npos) << l;
  }
}

struct StatsLine {
  double prompt_tps = 0;
  double generation_tps = 0;
  int running = 0;
  int waiting = 0;
  double kv_percent = 0;
  bool spec = false;
};

std::vector<StatsLine> stats_lines(const std::string& log) {
  static const std::regex re(
      "^I .*\\] Avg prompt throughput: ([0-9.]+) tokens/s, Avg generation throughput: ([0-9.]+) "
      "tokens/s, Running: ([0-9]+) reqs, Waiting: ([0-9]+) reqs, KV cache usage: ([0-9.]+)%, "
      "Prefix cache hit rate: [0-9.]+%(, Spec acceptance rate: [0-9.]+% \\([0-9]+/[0-9]+ drafts\\), "
      "Mean accepted length: [0-9.]+)?$");
  std::vector<StatsLine> out;
  for (const std::string& l : log_lines(log, "Avg prompt throughput")) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(l, m, re)) << l;
    if (m.empty()) continue;
    out.push_back({std::stod(m[1]), std::stod(m[2]), std::stoi(m[3]), std::stoi(m[4]),
                   std::stod(m[5]), m[6].matched});
  }
  return out;
}

// A greedy request that keeps the engine busy for a while (about 0.5-1 s: 4 x 1800 tokens), with
// n-gram drafts to verify.
void busy_request(const ServerProcess& server) {
  const HttpResult r = server.post(
      "/v1/completions",
      {{"prompt", "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."},
       {"max_tokens", 1800}, {"n", 4}, {"temperature", 0}, {"ignore_eos", true},
       {"speculation", {{"mode", "fixed"}, {"k", 4}}}});
  ASSERT_EQ(r.status, 200) << r.body;
}

TEST(ServerStatsLog, EngineLineWhileBusyOnly) {
  test::TempDir dir("statslog");
  const std::string log = dir / "server.log";
  ServerProcess server({"--log-stats-interval", "0.1", "--spec", "ngram"}, 0, "", log);
  ASSERT_TRUE(server.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // idle: no line
  EXPECT_TRUE(stats_lines(test::read_file(log)).empty()) << test::read_file(log);
  busy_request(server);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // idle again
  EXPECT_EQ(server.terminate(), 0);

  const std::vector<StatsLine> lines = stats_lines(test::read_file(log));
  ASSERT_GE(lines.size(), 2u) << test::read_file(log);
  bool running = false, generating = false, kv = false, spec = false;
  for (const StatsLine& s : lines) {
    EXPECT_FALSE(s.prompt_tps == 0 && s.generation_tps == 0 && s.running == 0 && s.waiting == 0)
        << "an idle interval is not an info line";
    running = running || s.running >= 1;
    generating = generating || s.generation_tps > 0;
    kv = kv || s.kv_percent > 0;
    spec = spec || s.spec;
  }
  EXPECT_TRUE(running);
  EXPECT_TRUE(generating);
  EXPECT_TRUE(kv);
  EXPECT_TRUE(spec) << "n-gram drafts were verified: the acceptance rate is reported";
}

TEST(ServerStatsLog, IntervalZeroTurnsTheLineOff) {
  test::TempDir dir("statslog0");
  const std::string log = dir / "server.log";
  ServerProcess server({"--log-stats-interval", "0", "--spec", "ngram"}, 0, "", log);
  ASSERT_TRUE(server.ok());
  busy_request(server);
  EXPECT_EQ(server.terminate(), 0);
  const std::string text = test::read_file(log);
  EXPECT_NE(text.find("request_log.cc"), std::string::npos) << "the log was captured";
  EXPECT_EQ(text.find("Avg prompt throughput"), std::string::npos) << text;
}

TEST(ServeCli, LogLevelAfterTheSubcommandAndFromTheEnvironment) {
  test::CommandResult r = test::run_arbor("serve -m /nonexistent.gguf --log-level bogus");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output().find("unknown log level 'bogus'"), std::string::npos) << r.output();
  r = test::run_shell("ARBOR_LOG_LEVEL=bogus " + test::arbor_bin() +
                      " serve -m /nonexistent.gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output().find("unknown log level 'bogus'"), std::string::npos) << r.output();
  // A valid level from the environment is taken: the model error is what remains.
  r = test::run_shell("ARBOR_LOG_LEVEL=error " + test::arbor_bin() +
                      " serve -m /nonexistent.gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output().find("log level"), std::string::npos) << r.output();
  EXPECT_NE(r.output().find("/nonexistent.gguf"), std::string::npos) << r.output();
}

TEST(ServeCli, NewFlagsShowTheirDefaults) {
  const test::CommandResult r = test::run_arbor("serve --help");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  for (const char* expected :
       {"--log-stats-interval FLOAT:NONNEGATIVE=10", "(default: the file name without extension)",
        "--accept-any-model-name", "default off"}) {
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
  }
}

}  // namespace
}  // namespace arbor::server::testing
