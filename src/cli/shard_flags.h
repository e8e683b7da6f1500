// Model shards on the command line (docs/shards.md): `arbor serve --shards N | --shard-uri URI
// [--recover-timeout S]` and `arbor bench shard`. Header-only, for the cmd_*.cc files.
//
//   --shards N           launch and supervise N `arbor shard` processes of this binary on Unix
//                        sockets (0 = run the model in this process, the default); N > 1: the
//                        ranks of one tensor-parallel group meeting in shared memory
//   --shard-uri URI,...  use shards started elsewhere (`arbor shard --listen URI`, with
//                        --rank r --world-size N for a group of N): "unix:/path" on this host or
//                        "host:port" across hosts, in rank order
//   --tp-store DIR       groups across hosts: gloo over a FileStore in DIR (every rank reaches it)
//   --recover-timeout S  seconds a new shard incarnation gets to come up after a fault before
//                        the affected requests end with an error (default 30)
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/engine_flags.h"
#include "executor/local_executor.h"
#include "shard/launch.h"
#include "shard/remote_executor.h"

namespace arbor::cli {

struct ShardFlags {
  int32_t shards = 0;
  std::vector<std::string> shard_uris;
  std::string tp_store;
  double recover_timeout_s = 30.0;
  std::vector<std::string> extra_args;  // more `arbor shard` flags (the serve task's)
  bool remote() const { return shards > 0 || !shard_uris.empty(); }
  // The ranks' count: the TP degree.
  int32_t world() const { return shards > 0 ? shards : static_cast<int32_t>(shard_uris.size()); }
};

inline void add_shard_flags(CLI::App& app, ShardFlags* f) {
  app.add_option("--shards", f->shards,
                 "Run the model in N supervised `arbor shard` processes over gRPC on Unix "
                 "sockets (0: in this process; docs/shards.md); N > 1: tensor parallelism, the "
                 "N ranks meeting in shared memory (N in 1, 2, 4)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--shard-uri", f->shard_uris,
                 "Use shards started elsewhere with `arbor shard --listen URI` (several, in "
                 "rank order: a tensor-parallel group): unix:/path or host:port (reconnected "
                 "after a fault, never restarted from here)")
      ->delimiter(',');
  app.add_option("--tp-store", f->tp_store,
                 "Tensor-parallel groups meet over gloo (TCP) with a FileStore in this folder, "
                 "which every rank must reach, instead of in shared memory (one host)");
  app.add_option("--recover-timeout", f->recover_timeout_s,
                 "Seconds a shard gets to come back after a fault (killed, hung) before the "
                 "affected requests end with an error and /health answers 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// "a,b": the --shard-uri list, for logs.
inline std::string join_uris(const ShardFlags& f) {
  std::string out;
  for (const std::string& u : f.shard_uris) out += (out.empty() ? "" : ",") + u;
  return out;
}

// This executable's path, for launching shards of the same build.
inline std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("arbor");
}

inline std::string log_level_name() {
  switch (log_level()) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// The `arbor shard` command line that runs `model` with these serving options' executor.
inline std::vector<std::string> shard_command_line(const std::string& model,
                                                   const ServingOptions& s) {
  return shard::shard_command_line(self_executable(), model, executor_options(s),
                                   log_level_name());
}

// The RemoteExecutor the flags ask for: `f.shards` launched shards or those at f.shard_uris.
inline Result<std::unique_ptr<shard::RemoteExecutor>> start_shards(const std::string& model,
                                                                   const ServingOptions& s,
                                                                   const ShardFlags& f) {
  if (f.shards > 0 && !f.shard_uris.empty()) {
    return invalid_argument("--shards ", f.shards, " and --shard-uri ", f.shard_uris[0],
                            ": launch shards or connect to them, not both");
  }
  if (f.world() != 1 && f.world() != 2 && f.world() != 4) {
    return invalid_argument(f.shards > 0 ? str_cat("--shards ", f.shards)
                                         : str_cat("--shard-uri with ", f.world(), " shards"),
                            ": a tensor-parallel group has 1, 2 or 4 ranks "
                            "(docs/tensor_parallel.md)");
  }
  if (f.world() > 1 && s.executor.device == executor::Device::kCuda) {
    return unimplemented("--shards ", f.world(), " with --device cuda: tensor parallelism runs "
                         "on the CPU (docs/tensor_parallel.md); a GPU runs one rank");
  }
  if (f.shards > 0) ARBOR_RETURN_IF_ERROR(executor::check_tp_launch(model, f.world()));
  shard::RemoteExecutorOptions o;
  o.recover_timeout_s = f.recover_timeout_s;
  o.tp_store = f.tp_store;
  if (f.shards > 0) {
    o.launch_argv = shard_command_line(model, s);
    o.launch_argv.insert(o.launch_argv.end(), f.extra_args.begin(), f.extra_args.end());
    o.num_launched = f.shards;
  } else {
    o.uris = f.shard_uris;
  }
  return shard::RemoteExecutor::start(o);
}

}  // namespace arbor::cli
