// `arbor bench serve` end to end: against a live `arbor serve` on stories260K (exact counts in
// the JSON report, the Markdown table, plots), against `arbor bench null-server`, against no
// server, and refusing a non-loopback URL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../server/server_test_util.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

using test::CommandResult;
using test::read_file;
using test::run_arbor;
using test::TempDir;

bool file_nonempty(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && st.st_size > 0;
}


TEST(BenchServe, AgainstArborServeReportsExactCounts) {
  ServerProcess server;
  ASSERT_TRUE(server.ok()) << "arbor serve did not start";
  TempDir dir("loadgen_e2e");
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  const CommandResult r =
      run_arbor("bench serve --url " + url +
                  " -n 20 --input-len 40 --output-len 8 --vocab-size 512 --request-rate 40,inf"
                  " --goodput ttft:60000 --result-json " +
                  dir / "r.json" + " --result-md " + dir / "r.md" + " --plot " + dir / "plot");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(r.output().find("model"), std::string::npos);  // the resolved configuration
  const json j = json::parse(read_file(dir / "r.json"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << read_file(dir / "r.json");
  EXPECT_EQ(j["config"]["model"], "stories260K");  // discovered from /v1/models
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const json& run : j["runs"]) {
    EXPECT_EQ(run["completed"], 20) << run.dump(2);
    EXPECT_EQ(run["failed"], 0);
    EXPECT_EQ(run["aborted"], 0);
    EXPECT_EQ(run["total_output_tokens"], 20 * 8);  // ignore_eos + max_tokens: exact
    EXPECT_EQ(run["total_input_tokens"], 20 * 40);  // the server's usage
    EXPECT_EQ(run["good_completed"], 20);
    // stories260K makes 8 tokens in about a millisecond, and the server often writes several
    // chunks with one write, so ITL and TPOT may be 0 here; their order still holds (the paced
    // null-server test below checks ITL values against known delays).
    EXPECT_GT(run["median_ttft_ms"].get<double>(), 0);
    EXPECT_LE(run["median_itl_ms"].get<double>(), run["p99_itl_ms"].get<double>());
    EXPECT_LE(run["p99_itl_ms"].get<double>(), run["max_itl_ms"].get<double>());
    EXPECT_LE(run["max_itl_ms"].get<double>(), run["max_e2el_ms"].get<double>());
    EXPECT_LE(run["max_ttft_ms"].get<double>(), run["max_e2el_ms"].get<double>());
    EXPECT_LE(run["median_e2el_ms"].get<double>(), run["p99_e2el_ms"].get<double>());
    EXPECT_GT(run["request_throughput"].get<double>(), 0);
  }
  EXPECT_EQ(j["runs"][0]["request_rate"], 40.0);
  EXPECT_EQ(j["runs"][1]["request_rate"], "inf");
  const std::string md = read_file(dir / "r.md");
  EXPECT_NE(md.find("| 40 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| inf |"), std::string::npos) << md;
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(file_nonempty(dir / "plot.svg"));
    EXPECT_TRUE(file_nonempty(dir / "plot.png"));
  } else {
    EXPECT_NE(r.output().find("gnuplot is not installed"), std::string::npos) << r.output();
  }
  // Every request ended cleanly on the server: no KV block left behind.
  EXPECT_TRUE(server.wait_no_blocks_used());
  // The warm-up and each rate use their own prompts (40 tokens: two full blocks that a repeat
  // would find in the prefix cache), so a sweep does not measure cache hits.
  EXPECT_EQ(server.metric("arbor_prefix_cache_hit_rate"), 0.0);
  EXPECT_EQ(server.terminate(), 0);
}

TEST(BenchServe, TokenIdsPastTheVocabularyFailTheWarmUp) {
  ServerProcess server;
  ASSERT_TRUE(server.ok());
  const CommandResult r =
      run_arbor("bench serve --url http://127.0.0.1:" + std::to_string(server.port()) +
                  " -n 4 --input-len 64 --output-len 2 --vocab-size 100000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output().find("warm-up request failed: HTTP 400"), std::string::npos) << r.output();
}

// `arbor bench null-server` with `extra_args` as a child process on a free port.
class NullServerProcess {
 public:
  explicit NullServerProcess(const std::string& port_file,
                             std::vector<std::string> extra_args = {}) {
    unlink(port_file.c_str());
    std::vector<std::string> args = {test::arbor_bin(), "--log-level", "warn", "bench",
                                     "null-server", "--port", "0", "--port-file", port_file};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 200 && port_ == 0; ++i) {
      const std::string p = read_file(port_file);
      if (!p.empty()) port_ = std::atoi(p.c_str());
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~NullServerProcess() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }

 private:
  int pid_ = -1;
  int port_ = 0;
};

// `arbor bench serve <bench_args>` against a null server started with `server_args`, reached as
// `host`; its JSON report, or a discarded value (and the test failed) when the run failed.
json bench_null_server(const std::vector<std::string>& server_args, const std::string& bench_args,
                       const std::string& host = "127.0.0.1") {
  TempDir dir("loadgen_e2e");
  NullServerProcess server(dir / "port", server_args);
  EXPECT_GT(server.port(), 0) << "arbor bench null-server did not start";
  if (server.port() <= 0) return json::value_t::discarded;
  const CommandResult r = run_arbor("bench serve --url http://" + host + ":" +
                                    std::to_string(server.port()) + " " + bench_args +
                                    " --result-json " + dir / "r.json");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  return json::parse(read_file(dir / "r.json"), nullptr, false);
}

TEST(BenchServe, AgainstTheNullServer) {
  const json j = bench_null_server({}, "-n 300 --output-len 16 --request-rate 300", "localhost");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["model"], "null");
  const json& run = j["runs"][0];
  EXPECT_EQ(run["completed"], 300);
  EXPECT_EQ(run["total_output_tokens"], 300 * 16);
  // 300 Poisson arrivals at 300/s: the drawn schedule's own rate is near 300 (299 gaps: ~6 %
  // standard error), and the client sends at that rate (a stalled client would fall behind).
  const double scheduled = run["scheduled_rate"].get<double>();
  EXPECT_GT(scheduled, 250.0) << run.dump(2);
  EXPECT_LT(scheduled, 350.0) << run.dump(2);
  EXPECT_NEAR(run["achieved_send_rate"].get<double>(), scheduled, 0.2 * scheduled) << run.dump(2);
}

// A paced null server: the first chunk of every stream 30 ms after the request arrives, then one
// chunk every 20 ms (due times are absolute, so a chunk that timer slack delays shortens the next
// gap by as much). The client's TTFT cannot be below the server's delay, and its median ITL and
// TPOT are the server's gap: a client that timed ITL from the request's start, between reads
// rather than chunks, or in the wrong unit misses these bounds. The upper bounds are loose (5x)
// for a loaded machine.
TEST(BenchServe, PacedNullServerBoundsTtftAndItl) {
  const json j = bench_null_server({"--tokens-per-second", "50", "--ttft-ms", "30"},
                                   "-n 16 --output-len 6 --max-concurrency 4");
  ASSERT_TRUE(j.is_object());
  const json& run = j["runs"][0];
  EXPECT_EQ(run["completed"], 16) << run.dump(2);
  EXPECT_EQ(run["total_output_tokens"], 16 * 6);
  for (const auto& [name, lo, hi] : {std::tuple("median_ttft_ms", 30.0, 5 * 30.0),
                                     std::tuple("median_itl_ms", 0.5 * 20.0, 5 * 20.0),
                                     std::tuple("median_tpot_ms", 0.5 * 20.0, 5 * 20.0)}) {
    EXPECT_GE(run[name].get<double>(), lo) << name << "\n" << run.dump(2);
    EXPECT_LE(run[name].get<double>(), hi) << name << "\n" << run.dump(2);
  }
}

TEST(BenchServe, ChatEndpointWithFixedConcurrency) {
  // Chat takes text prompts (chosen automatically); a closed loop of 4 clients.
  const json j = bench_null_server(
      {}, "--endpoint /v1/chat/completions -n 50 --output-len 8 --max-concurrency 4");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["prompt_format"], "text");
  const json& run = j["runs"][0];
  EXPECT_EQ(run["completed"], 50);
  EXPECT_EQ(run["total_output_tokens"], 50 * 8);
  EXPECT_EQ(run["max_concurrency"], 4);
  EXPECT_LE(run["max_in_flight"].get<int>(), 4);
}

TEST(BenchServe, NoServerIsAClearError) {
  TempDir dir("loadgen_e2e");
  int port = 0;
  {
    NullServerProcess server(dir / "port");
    port = server.port();
  }
  ASSERT_GT(port, 0);
  const CommandResult r =
      run_arbor("bench serve --url http://127.0.0.1:" + std::to_string(port) + " -n 2");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_NE(r.output().find("cannot reach the server"), std::string::npos) << r.output();
}

TEST(BenchServe, RefusesNonLoopbackUrls) {
  for (const char* url : {"http://192.0.2.1:8080", "http://example.com", "http://0.0.0.0:80"}) {
    const CommandResult r = run_arbor(std::string("bench serve --url ") + url + " -n 1");
    EXPECT_EQ(r.exit_code, 2) << url << ": " << r.output();
    EXPECT_NE(r.output().find("is not a loopback address"), std::string::npos) << r.output();
  }
}

TEST(BenchServe, HelpShowsDefaults) {
  const CommandResult r = run_arbor("bench serve --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"--request-rate", "--max-concurrency", "--goodput", "--max-seconds",
                        "http://127.0.0.1:8080", "/v1/completions"}) {
    EXPECT_NE(r.output().find(s), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace arbor::server::testing
