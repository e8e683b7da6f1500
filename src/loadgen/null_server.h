// A server that does no work: answers OpenAI completions and chat completions at once with
// max_tokens chunks of OpenAI-shaped JSON (" tok" each), the usage chunk when asked for, and
// "[DONE]". `arbor bench serve` against it measures the load generator itself: what it reports
// when the server costs nothing is its own overhead (see docs/loadgen.md).
//
// Routes: POST /v1/completions, POST /v1/chat/completions (streaming or not; "max_tokens" /
// "max_completion_tokens", default `default_max_tokens`), GET /v1/models, GET /health.
// With tokens_per_second > 0 the chunks are paced 1/tokens_per_second apart and the first comes
// after ttft_ms; with both 0 the whole stream is written with one write. Runs on the
// HttpServer's single I/O thread; SIGINT/SIGTERM stop it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "http/http_server.h"

namespace arbor::loadgen {

struct NullServerOptions {
  http::HttpServerOptions http{};
  double tokens_per_second = 0;  // 0 = no pacing
  double ttft_ms = 0;            // delay before the first chunk (only with pacing or > 0)
  std::string model = "null";
  int32_t default_max_tokens = 16;
};

class NullServer {
 public:
  static Result<std::unique_ptr<NullServer>> create(const NullServerOptions& options);
  ~NullServer();

  uint16_t port() const;
  // Serves on the calling thread until SIGINT/SIGTERM or stop().
  void run();
  // Any thread.
  void stop();

  struct State;

 private:
  explicit NullServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace arbor::loadgen
