// arbor bench null-server: an OpenAI-shaped streaming server that does no work, to measure the
// load generator's own overhead (`arbor bench serve` against it; see docs/loadgen.md).
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/log.h"
#include "base/mapped_file.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "loadgen/null_server.h"

namespace arbor::cli {
namespace cmd_bench_null_server {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string port_file;
  loadgen::NullServerOptions server;
};

Status run(Options o) {
  if (o.port < 0 || o.port > 65535)
    return invalid_argument("--port ", o.port, " is not in 0..65535");
  o.server.http.host = o.host;
  o.server.http.port = static_cast<uint16_t>(o.port);
  ARBOR_ASSIGN_OR_RETURN(auto server, loadgen::NullServer::create(o.server));
  ARBOR_LOG(kInfo) << "null server on " << o.host << ":" << server->port() << " (model '"
                   << o.server.model << "', " << o.server.tokens_per_second
                   << " tokens/s (0 = unpaced), TTFT " << o.server.ttft_ms << " ms)";
  if (!o.port_file.empty()) {
    ARBOR_RETURN_IF_ERROR(write_file_atomic(o.port_file, std::to_string(server->port())));
  }
  server->run();
  ARBOR_LOG(kInfo) << "null server stopped";
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "null-server", "A streaming OpenAI server that does no work (load generator overhead)");
  auto o = std::make_shared<Options>();
  sub->add_option("--host", o->host, "Address to bind")->capture_default_str();
  sub->add_option("--port", o->port, "Port; 0 = any free port")->capture_default_str();
  sub->add_option("--port-file", o->port_file, "Write the bound port to this file once listening");
  sub->add_option("--tokens-per-second", o->server.tokens_per_second,
                  "Pace the chunks of each stream; 0 = write the whole stream at once")
      ->capture_default_str();
  sub->add_option("--ttft-ms", o->server.ttft_ms, "Delay before the first chunk")
      ->capture_default_str();
  sub->add_option("--served-model-name", o->server.model, "Model name in /v1/models and chunks")
      ->capture_default_str();
  sub->add_option("--default-max-tokens", o->server.default_max_tokens,
                  "Chunks per response when the request gives no max_tokens")
      ->capture_default_str();
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
