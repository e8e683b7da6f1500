// Helpers for the server end-to-end tests: a live `arbor serve` child process on 127.0.0.1 (a
// free port chosen by the server, read back from --port-file), curl for requests, and raw
// sockets for clients that hang up mid-stream.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace arbor::server::testing {

struct HttpResult {
  int status = 0;  // 0: curl failed
  std::string body;
  nlohmann::json json() const;  // discarded value when the body is not JSON
};

// One sample of a Prometheus text exposition.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Every sample of `exposition` (comments skipped), in order.
std::vector<MetricSample> metric_samples(const std::string& exposition);

class ServerProcess {
 public:
  // Starts `arbor serve` on the stories260K model with `extra_args`; waits until /health
  // answers (any status: access options may refuse the probe). When
  // the model file is missing the current test fails naming it, and ok() is false.
  // `open_files` > 0: the child's RLIMIT_NOFILE (soft and hard), like `ulimit -n`.
  // `model`: another GGUF file than stories260K.
  // `log_file`: the server logs at info level into this file (else at warn, to the test's
  // stderr). With ARBOR_TEST_SHARDS=N in the environment (the shard passes), the server runs
  // its model in N launched shards (`--shards N`) unless extra_args choose shards themselves.
  explicit ServerProcess(std::vector<std::string> extra_args = {}, int open_files = 0,
                         const std::string& model = "", const std::string& log_file = "");
  // `arbor router` (docs/router.md) for the stories260K model with `args` (its --replica
  // addresses among them; "--port P" to bind P rather than any free port), started and awaited
  // as above.
  static std::unique_ptr<ServerProcess> router(std::vector<std::string> args,
                                               const std::string& log_file = "");
  // Sends SIGKILL if still running.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ok() const { return port_ > 0; }
  int pid() const { return pid_; }
  int port() const { return port_; }
  std::string url(const std::string& path) const;
  // SIGTERM, then waits up to `timeout_s`; returns the exit status (-1 on timeout / signal).
  int terminate(double timeout_s = 20.0);
  // Waits up to `timeout_s` for the process to exit (a signal sent by the caller).
  int wait_exit(double timeout_s = 20.0);
  bool running() const;

  // Thread-safe: several threads may send requests at once.
  HttpResult request(const std::string& method, const std::string& path,
                     const std::string& body = "", const std::string& extra_curl = "") const;
  HttpResult post(const std::string& path, const nlohmann::json& body) const {
    return request("POST", path, body.dump());
  }
  HttpResult get(const std::string& path) const { return request("GET", path); }
  // A Prometheus sample's value: the first sample named `name` that has the labels given with
  // it ("arbor_kv_blocks_used", "arbor_http_requests_total{code=\"200\"}"; other labels, such
  // as model_name, may be present); -1 if absent.
  double metric(const std::string& name) const;
  // Polls until arbor_kv_blocks_used and arbor_http_active_requests are 0.
  bool wait_no_blocks_used(double timeout_s = 10.0) const;

 private:
  struct Unstarted {};
  explicit ServerProcess(Unstarted) {}
  // Runs arbor `command_args` --host 127.0.0.1 --port 0 --port-file F and waits for /health.
  void launch(std::vector<std::string> command_args, int open_files, const std::string& log_file);
  int pid_ = -1;
  int port_ = 0;
  test::TempDir dir_{"srv_test"};  // port file and request bodies
};

// A random-weight model (arbor synth, dim 64, 2 layers, F32) over Qwen 3's vocabulary
// (151,669 tokens) whose GGUF carries Qwen 3's chat template, which renders tools: made once
// per test process from shared/tokenizers/hf/qwen3. Its served name is "random_qwen3".
const std::string& random_qwen3_model();
// The same shape with Qwen3-Embedding's and Qwen3-Reranker's metadata (docs/server.md,
// "Embeddings and rerank"): qwen3.pooling_type last ("random_qwen3_embed"), and pooling_type rank
// with a two-class rank head, cls.output.weight, labelled "yes", "no" ("random_qwen3_rank").
const std::string& random_qwen3_embed_model();
const std::string& random_qwen3_rank_model();
// The qwen3 architecture of that shape without pooling metadata or rank head (a Qwen3-Reranker
// converted as a causal LM): "random_qwen3_plain".
const std::string& random_qwen3_plain_model();

// "data: {...}" payloads of an SSE body, in order ("[DONE]" included as a string).
std::vector<std::string> sse_payloads(const std::string& body);

// A raw HTTP/1.1 POST with a JSON body and Content-Length.
std::string post_raw(const std::string& path, const std::string& body);
// A connected loopback socket (30 s receive timeout), or -1.
int connect_to(int port);
bool send_all(int fd, const std::string& bytes);
// A client that sends `raw` and then reads only when the test does: a 4 KiB receive buffer
// (no autotuning), so the kernel holds little of the answer for it. -1 on failure.
int connect_small_window(int port, const std::string& raw);
// Reads until the peer closes (or the receive timeout); `pause_us` > 0: sleeps that long after
// each read (a slow reader).
std::string read_to_close(int fd, int pause_us = 0);

// Opens a connection, sends `raw`, reads until `min_bytes` arrived (or the peer closed) and
// returns what was read; the socket is closed on return unless `keep_fd` receives it.
std::string raw_exchange(int port, const std::string& raw, size_t min_bytes, int* keep_fd = nullptr);

}  // namespace arbor::server::testing
