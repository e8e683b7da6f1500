// arbor shard: one model shard process (docs/shards.md).
//
//   arbor shard -m MODEL --listen unix:/path/shard.sock | HOST:PORT [executor flags]
//
// Loads the model with a KV pool (the executor's flags: --device, --block-size, --kv-cache-gib,
// --num-kv-blocks, --kv-dtype, -t, --spec ...; the engine's scheduling flags are accepted and
// unused, so a launcher passes one command line) and serves the shard protocol on one gRPC
// stream at a time until SIGINT/SIGTERM. `arbor serve --shards N` launches these itself;
// `arbor serve --shard-uri URI` connects to one started by hand or by another supervisor.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/log.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "executor/local_executor.h"
#include "shard/shard_server.h"

namespace arbor::cli {
namespace {

struct Options {
  std::string model;
  std::string listen;
  ServingOptions serving;
};

Status run(const Options& o) {
  // SIGINT/SIGTERM are taken by sigwait below: blocked before any thread starts, so every
  // thread (the forward's pool, gRPC's) inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ARBOR_ASSIGN_OR_RETURN(auto exec,
                         executor::LocalExecutor::load(o.model, executor_options(o.serving)));
  const std::string summary = exec->runner().config().summary();
  const int64_t blocks = exec->num_kv_blocks();
  ARBOR_ASSIGN_OR_RETURN(auto server, shard::ShardServer::start(
                                          std::move(exec), shard::ShardServerOptions{
                                                               .listen = o.listen,
                                                               .model_name = o.model}));
  ARBOR_LOG(kInfo) << "shard: " << o.model << " (" << summary << ", " << blocks
                   << " KV blocks) serving on " << server->address();
  int sig = 0;
  sigwait(&stop, &sig);
  ARBOR_LOG(kInfo) << "shard: stopping on signal " << sig;
  server->shutdown();
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "shard", "Serve one model shard over gRPC for `arbor serve --shard-uri` (docs/shards.md)");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model file")->required();
  sub->add_option("--listen", o->listen,
                  "Where to serve: unix:/path/to.sock (one host) or HOST:PORT (across hosts)")
      ->required();
  add_engine_flags(*sub, &o->serving);
  sub->callback([o] { exit_on_error(run(*o)); });
}

ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
