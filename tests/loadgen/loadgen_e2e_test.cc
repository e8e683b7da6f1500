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
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "../server/server_test_util.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_command(const std::string& args) {
  const std::string cmd = std::string(ARBOR_BIN) + " " + args + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool file_nonempty(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/arbor_loadgen_e2e_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(BenchServe, AgainstArborServeReportsExactCounts) {
  ServerProcess server;
  ASSERT_TRUE(server.ok()) << "arbor serve did not start";
  TempDir dir;
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  const CommandResult r =
      run_command("bench serve --url " + url +
                  " -n 20 --input-len 40 --output-len 8 --vocab-size 512 --request-rate 40,inf"
                  " --goodput ttft:60000 --result-json " +
                  dir / "r.json" + " --result-md " + dir / "r.md" + " --plot " + dir / "plot");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model"), std::string::npos);  // the resolved configuration
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
    // chunks with one write, so ITL and TPOT may be 0 here; their bounds still hold.
    EXPECT_GT(run["median_ttft_ms"].get<double>(), 0);
    EXPECT_GE(run["median_itl_ms"].get<double>(), 0);
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
    EXPECT_NE(r.output.find("gnuplot is not installed"), std::string::npos) << r.output;
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
      run_command("bench serve --url http://127.0.0.1:" + std::to_string(server.port()) +
                  " -n 4 --input-len 64 --output-len 2 --vocab-size 100000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("warm-up request failed: HTTP 400"), std::string::npos) << r.output;
}

// `arbor bench null-server` as a child process on a free port.
class NullServerProcess {
 public:
  explicit NullServerProcess(const std::string& port_file) {
    unlink(port_file.c_str());
    pid_ = fork();
    if (pid_ == 0) {
      execl(ARBOR_BIN, ARBOR_BIN, "--log-level", "warn", "bench", "null-server", "--port", "0",
            "--port-file", port_file.c_str(), static_cast<char*>(nullptr));
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

TEST(BenchServe, AgainstTheNullServer) {
  TempDir dir;
  NullServerProcess server(dir / "port");
  ASSERT_GT(server.port(), 0);
  const CommandResult r =
      run_command("bench serve --url http://localhost:" + std::to_string(server.port()) +
                  " -n 300 --output-len 16 --request-rate 300 --result-json " + dir / "r.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir / "r.json"), nullptr, false);
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

TEST(BenchServe, ChatEndpointWithFixedConcurrency) {
  TempDir dir;
  NullServerProcess server(dir / "port");
  ASSERT_GT(server.port(), 0);
  // Chat takes text prompts (chosen automatically); a closed loop of 4 clients.
  const CommandResult r =
      run_command("bench serve --url http://127.0.0.1:" + std::to_string(server.port()) +
                  " --endpoint /v1/chat/completions -n 50 --output-len 8"
                  " --max-concurrency 4 --result-json " +
                  dir / "r.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(read_file(dir / "r.json"), nullptr, false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["prompt_format"], "text");
  const json& run = j["runs"][0];
  EXPECT_EQ(run["completed"], 50);
  EXPECT_EQ(run["total_output_tokens"], 50 * 8);
  EXPECT_EQ(run["max_concurrency"], 4);
  EXPECT_LE(run["max_in_flight"].get<int>(), 4);
}

TEST(BenchServe, NoServerIsAClearError) {
  TempDir dir;
  int port = 0;
  {
    NullServerProcess server(dir / "port");
    port = server.port();
  }
  ASSERT_GT(port, 0);
  const CommandResult r =
      run_command("bench serve --url http://127.0.0.1:" + std::to_string(port) + " -n 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot reach the server"), std::string::npos) << r.output;
}

TEST(BenchServe, RefusesNonLoopbackUrls) {
  for (const char* url : {"http://192.0.2.1:8080", "http://example.com", "http://0.0.0.0:80"}) {
    const CommandResult r = run_command(std::string("bench serve --url ") + url + " -n 1");
    EXPECT_EQ(r.exit_code, 2) << url << ": " << r.output;
    EXPECT_NE(r.output.find("is not a loopback address"), std::string::npos) << r.output;
  }
}

TEST(BenchServe, HelpShowsDefaults) {
  const CommandResult r = run_command("bench serve --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"--request-rate", "--max-concurrency", "--goodput", "--max-seconds",
                        "http://127.0.0.1:8080", "/v1/completions"}) {
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace arbor::server::testing
