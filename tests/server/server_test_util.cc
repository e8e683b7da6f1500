#include "server_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {

namespace {

using ::arbor::test::read_file;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

nlohmann::json HttpResult::json() const {
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

ServerProcess::ServerProcess(std::vector<std::string> extra_args, int open_files,
                             const std::string& model, const std::string& log_file) {
  if (!test::expect_shared_file(test::kStories260K)) return;
  std::vector<std::string> args = {"serve", "-m",
                                   model.empty() ? test::shared_path(test::kStories260K) : model,
                                   "--threads", "1", "--num-kv-blocks", "4096"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // The shard passes (ARBOR_TEST_SHARDS, cmake/ArborTest.cmake): the model in launched shards.
  const char* shards = std::getenv("ARBOR_TEST_SHARDS");
  if (shards != nullptr && *shards != '\0' &&
      std::find(args.begin(), args.end(), "--shards") == args.end() &&
      std::find(args.begin(), args.end(), "--shard-uri") == args.end()) {
    args.insert(args.end(), {"--shards", shards});
  }
  launch(std::move(args), open_files, log_file);
}

std::unique_ptr<ServerProcess> ServerProcess::router(std::vector<std::string> args,
                                                     const std::string& log_file) {
  std::unique_ptr<ServerProcess> p(new ServerProcess(Unstarted{}));
  if (!test::expect_shared_file(test::kStories260K)) return p;
  std::vector<std::string> all = {"router", "-m", test::shared_path(test::kStories260K)};
  all.insert(all.end(), args.begin(), args.end());
  p->launch(std::move(all), 0, log_file);
  return p;
}

void ServerProcess::launch(std::vector<std::string> command_args, int open_files,
                           const std::string& log_file) {
  const std::string port_file = dir_ / "port";
  std::vector<std::string> args = {test::arbor_bin(), "--log-level",
                                   log_file.empty() ? "warn" : "info"};
  args.insert(args.end(), command_args.begin(), command_args.end());
  args.insert(args.end(), {"--host", "127.0.0.1", "--port-file", port_file});
  if (std::find(args.begin(), args.end(), "--port") == args.end()) {
    args.insert(args.end(), {"--port", "0"});
  }
  pid_ = fork();
  if (pid_ == 0) {
    if (open_files > 0) {
      const rlimit rl{static_cast<rlim_t>(open_files), static_cast<rlim_t>(open_files)};
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (!log_file.empty()) {
      const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) _exit(126);
      dup2(fd, STDERR_FILENO);
      dup2(fd, STDOUT_FILENO);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 600 && port_ == 0; ++i) {  // up to 30 s
    const std::string p = read_file(port_file);
    if (!p.empty()) port_ = std::atoi(p.c_str());
    if (port_ == 0) {
      if (!running()) return;
      sleep_ms(50);
    }
  }
  for (int i = 0; i < 100; ++i) {
    if (get("/health").status != 0) return;  // answering (401/403 under access options)
    sleep_ms(50);
  }
  port_ = 0;
}

ServerProcess::~ServerProcess() {
  if (running()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ServerProcess::running() const {
  if (pid_ <= 0) return false;
  return waitpid(pid_, nullptr, WNOHANG) == 0;
}

int ServerProcess::terminate(double timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return wait_exit(timeout_s);
}

int ServerProcess::wait_exit(double timeout_s) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    sleep_ms(20);
  }
  return -1;
}

std::string ServerProcess::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + path;
}

HttpResult ServerProcess::request(const std::string& method, const std::string& path,
                                  const std::string& body, const std::string& extra_curl) const {
  // One file per request: requests may come from several threads at once.
  static std::atomic<int64_t> next_body{0};
  const std::string body_file = dir_ / ("body" + std::to_string(next_body++));
  {
    std::ofstream f(body_file, std::ios::binary);
    f << body;
  }
  std::string cmd = "curl -s -N --max-time 60 -o - -w '\\n%{http_code}' -X " + method +
                    " -H 'Content-Type: application/json' " + extra_curl;
  if (!body.empty()) cmd += " --data-binary @" + body_file;
  cmd += " '" + url(path) + "'";
  FILE* p = popen(cmd.c_str(), "r");
  HttpResult r;
  if (p == nullptr) return r;
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  std::remove(body_file.c_str());
  const size_t nl = out.rfind('\n');
  if (nl == std::string::npos) return r;
  r.status = std::atoi(out.c_str() + nl + 1);
  r.body = out.substr(0, nl);
  return r;
}

namespace {

// "name{k=\"v\",...} value" or "name value" -> name and labels; false for other lines.
bool parse_sample(const std::string& line, std::string* name,
                  std::map<std::string, std::string>* labels) {
  if (line.empty() || line[0] == '#') return false;
  const size_t end = line.find_first_of("{ ");
  if (end == std::string::npos) return false;
  *name = line.substr(0, end);
  labels->clear();
  if (line[end] != '{') return true;
  size_t i = end + 1;
  while (i < line.size() && line[i] != '}') {
    const size_t eq = line.find("=\"", i);
    if (eq == std::string::npos) return false;
    const std::string key = line.substr(i, eq - i);
    std::string value;
    for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) ++i;
      value += line[i];
    }
    (*labels)[key] = value;
    if (i < line.size()) ++i;                       // the closing quote
    if (i < line.size() && line[i] == ',') ++i;
  }
  return i < line.size();
}

}  // namespace

std::vector<MetricSample> metric_samples(const std::string& exposition) {
  std::vector<MetricSample> out;
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    MetricSample s;
    if (!parse_sample(line, &s.name, &s.labels)) continue;
    s.value = std::atof(line.c_str() + line.rfind(' ') + 1);
    out.push_back(std::move(s));
  }
  return out;
}

double ServerProcess::metric(const std::string& query) const {
  std::string name;
  std::map<std::string, std::string> want;
  if (!parse_sample(query + " 0", &name, &want)) return -1;
  for (const MetricSample& s : metric_samples(get("/metrics").body)) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : want) {
      auto it = s.labels.find(key);
      match = match && it != s.labels.end() && it->second == value;
    }
    if (match) return s.value;
  }
  return -1;
}

bool ServerProcess::wait_no_blocks_used(double timeout_s) const {
  for (int i = 0; i < static_cast<int>(timeout_s * 20); ++i) {
    if (metric("arbor_kv_blocks_used") == 0 && metric("arbor_http_active_requests") == 0 &&
        metric("arbor_num_requests_running") == 0) {
      return true;
    }
    sleep_ms(50);
  }
  return false;
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data:", 0) != 0) continue;
    std::string payload = line.substr(5);
    if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
    out.push_back(payload);
  }
  return out;
}

std::string post_raw(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

int connect_small_window(int port, const std::string& raw) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || !send_all(fd, raw)) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string read_to_close(int fd, int pause_us) {
  std::string got;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
  }
  return got;
}

std::string raw_exchange(int port, const std::string& raw, size_t min_bytes, int* keep_fd) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, raw.data(), raw.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(raw.size())) {
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    while (got.size() < min_bytes) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  if (keep_fd != nullptr) {
    *keep_fd = fd;
  } else {
    close(fd);
  }
  return got;
}

// A random-weight model over Qwen 3's vocabulary (151,669 tokens) whose GGUF carries Qwen 3's
// chat template (tokenizer_config.json), made once per run.
const std::string& random_qwen3_model() {
  static ::arbor::test::TempDir dir("server_tools");
  static const std::string path = [] {
    const std::string p = dir.path() + "/random_qwen3.gguf";
    EXPECT_TRUE(::arbor::test::expect_shared_file("tokenizers/hf/qwen3/tokenizer_config.json"));
    const ::arbor::test::CommandResult r = ::arbor::test::run_arbor(
        "synth --shape custom --dim 64 --ffn 128 --layers 2 --heads 4 --kv-heads 2 --context 2048 "
        "--type f32 --seed 11 --vocab " + ::arbor::test::shared_path("tokenizers/hf/qwen3") +
        " -o " + p);
    EXPECT_EQ(r.exit_code, 0) << r.output();
    return p;
  }();
  return path;
}

namespace {

std::string synth_qwen3(const std::string& name, const std::string& extra) {
  static ::arbor::test::TempDir dir("server_pooling");
  const std::string p = dir.path() + "/" + name + ".gguf";
  EXPECT_TRUE(::arbor::test::expect_shared_file("tokenizers/hf/qwen3/tokenizer_config.json"));
  const ::arbor::test::CommandResult r = ::arbor::test::run_arbor(
      "synth --shape custom --arch qwen3 --dim 64 --ffn 128 --layers 2 --heads 4 --kv-heads 2 "
      "--context 2048 --type f32 --seed 11 --vocab " +
      ::arbor::test::shared_path("tokenizers/hf/qwen3") + " " + extra + " -o " + p);
  EXPECT_EQ(r.exit_code, 0) << r.output();
  return p;
}

}  // namespace

const std::string& random_qwen3_embed_model() {
  static const std::string path = synth_qwen3("random_qwen3_embed", "--pooling-type last");
  return path;
}

const std::string& random_qwen3_plain_model() {
  static const std::string path = synth_qwen3("random_qwen3_plain", "");
  return path;
}

const std::string& random_qwen3_rank_model() {
  static const std::string path =
      synth_qwen3("random_qwen3_rank", "--pooling-type rank --rank-classes 2");
  return path;
}

}  // namespace arbor::server::testing
