// arbor shard: one model shard process (docs/shards.md).
//
//   arbor shard -m MODEL --listen unix:/path/shard.sock | HOST:PORT [executor flags]
//               [--rank R --world-size N [--tp-hostname HOST]]
//
// With --world-size N > 1 the process is rank R of a tensor-parallel group of N shards: it loads
// only its share of the weights (model/tp.h) and meets the other ranks in the group each Hello
// names (collective/group.h); the engine connects to all N (`arbor serve --shard-uri A,B`).
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
#include "cli/serve_task.h"
#include "collective/group.h"
#include "executor/local_executor.h"
#include "shard/shard_server.h"

namespace arbor::cli {
namespace cmd_shard {  // named, not anonymous: the commands share unity sources

struct Options {
  std::string model;
  std::string listen;
  int rank = 0;
  int world_size = 1;
  std::string tp_hostname = "127.0.0.1";
  TaskOptions task;  // the serve task's executor side (serve_task.h)
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
  if (o.rank < 0 || o.rank >= o.world_size) {
    return invalid_argument("--rank ", o.rank, " must be in [0, --world-size ", o.world_size, ")");
  }
  executor::ExecutorOptions eo = executor_options(o.serving);
  std::shared_ptr<collective::GroupCollective> group;
  if (o.world_size > 1) {
    group = std::make_shared<collective::GroupCollective>(o.rank, o.world_size, o.tp_hostname);
    eo.tp = model::TpContext{.rank = o.rank, .size = o.world_size, .collective = group};
  }
  ARBOR_ASSIGN_OR_RETURN(auto exec, executor::LocalExecutor::load(o.model, eo));
  {
    ARBOR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_file(o.model));
    ARBOR_RETURN_IF_ERROR(apply_task(o.task, *exec, *tok));
  }
  const std::string summary = exec->runner().config().summary();
  const int64_t blocks = exec->num_kv_blocks();
  ARBOR_ASSIGN_OR_RETURN(auto server, shard::ShardServer::start(
                                          std::move(exec), shard::ShardServerOptions{
                                                               .listen = o.listen,
                                                               .model_name = o.model,
                                                               .tp_rank = o.rank,
                                                               .tp_size = o.world_size,
                                                               .group = group}));
  ARBOR_LOG(kInfo) << "shard: " << o.model << " (" << summary << ", " << blocks
                   << " KV blocks"
                   << (o.world_size > 1 ? str_cat(", TP rank ", o.rank, " of ", o.world_size)
                                        : std::string())
                   << ") serving on " << server->address();
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
  sub->add_option("--rank", o->rank, "This shard's rank in its tensor-parallel group")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--world-size", o->world_size,
                  "Ranks in the tensor-parallel group (1, 2 or 4; docs/tensor_parallel.md)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--tp-hostname", o->tp_hostname,
                  "This rank's address for gloo (groups the engine names gloo:...; shared "
                  "memory needs none)")
      ->capture_default_str();
  add_task_flags(*sub, &o->task);
  add_engine_flags(*sub, &o->serving);
  sub->callback([o] { exit_on_error(run(*o)); });
}

ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
