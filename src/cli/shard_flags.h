// Model shards on the command line (docs/shards.md): `arbor serve --shards N | --shard-uri URI
// [--recover-timeout S]` and `arbor bench shard`. Header-only, for the cmd_*.cc files.
//
//   --shards N           launch and supervise N `arbor shard` processes of this binary on Unix
//                        sockets (0 = run the model in this process, the default; N > 1 waits
//                        for tensor parallelism and is refused)
//   --shard-uri URI      use a shard started elsewhere (`arbor shard --listen URI`):
//                        "unix:/path" on this host or "host:port" across hosts
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
#include "shard/remote_executor.h"

namespace arbor::cli {

struct ShardFlags {
  int32_t shards = 0;
  std::string shard_uri;
  double recover_timeout_s = 30.0;
  bool remote() const { return shards > 0 || !shard_uri.empty(); }
};

inline void add_shard_flags(CLI::App& app, ShardFlags* f) {
  app.add_option("--shards", f->shards,
                 "Run the model in N supervised `arbor shard` processes over gRPC on Unix "
                 "sockets (0: in this process; docs/shards.md). Only 1 until tensor parallelism")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--shard-uri", f->shard_uri,
                 "Use a shard started elsewhere with `arbor shard --listen URI`: unix:/path or "
                 "host:port (reconnected after a fault, never restarted from here)");
  app.add_option("--recover-timeout", f->recover_timeout_s,
                 "Seconds a shard gets to come back after a fault (killed, hung) before the "
                 "affected requests end with an error and /health answers 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
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

// The `arbor shard` command line that runs `model` with these executor options (every flag of
// ExecutorOptions that `arbor shard` reads back through add_engine_flags).
inline std::vector<std::string> shard_command_line(const std::string& model,
                                                   const ServingOptions& s) {
  const executor::ExecutorOptions& e = s.executor;
  std::vector<std::string> argv = {self_executable(), "shard", "-m", model,
                                   "--log-level", log_level_name(),
                                   "--device", std::string(executor::device_name(e.device)),
                                   "--cuda-device", std::to_string(e.cuda_device),
                                   "--block-size", std::to_string(e.block_size),
                                   "--kv-cache-gib", std::to_string(e.kv_cache_gib),
                                   "--num-kv-blocks", std::to_string(e.num_kv_blocks),
                                   "--kv-dtype", e.kv_dtype == kernels::KvDtype::kF32 ? "f32" : "f16",
                                   "-t", std::to_string(e.num_threads),
                                   "--max-num-batched-tokens",
                                   std::to_string(s.engine.max_num_batched_tokens),
                                   "--spec", std::string(executor::spec_proposer_name(e.proposer)),
                                   "--spec-ngram-min", std::to_string(e.ngram_min),
                                   "--spec-ngram-max", std::to_string(e.ngram_max),
                                   "--spec-tree-budget", std::to_string(e.tree_budget),
                                   "--spec-tree-width", std::to_string(e.tree_width)};
  if (!e.kv_reclaim) argv.push_back("--no-kv-reclaim");
  if (!e.draft_model.empty()) argv.insert(argv.end(), {"--draft-model", e.draft_model});
  static const char* const kTreeSampling[] = {"topk", "specinfer", "sequoia"};
  argv.insert(argv.end(),
              {"--spec-tree-sampling", kTreeSampling[static_cast<int>(e.tree_sampling)]});
  if (!e.tree_static_widths.empty()) {
    std::string widths;
    for (int32_t w : e.tree_static_widths) widths += (widths.empty() ? "" : ",") + std::to_string(w);
    argv.insert(argv.end(), {"--spec-tree-shape", widths});
  }
  return argv;
}

// The RemoteExecutor the flags ask for: `f.shards` launched shards or the one at f.shard_uri.
inline Result<std::unique_ptr<shard::RemoteExecutor>> start_shards(const std::string& model,
                                                                   const ServingOptions& s,
                                                                   const ShardFlags& f) {
  if (f.shards > 0 && !f.shard_uri.empty()) {
    return invalid_argument("--shards ", f.shards, " and --shard-uri ", f.shard_uri,
                            ": launch shards or connect to one, not both");
  }
  if (f.shards > 1) {
    return unimplemented("--shards ", f.shards, ": tensor parallelism across shard processes is "
                         "not built yet (docs/shards.md, \"Tensor parallelism\"); use --shards 1");
  }
  shard::RemoteExecutorOptions o;
  o.recover_timeout_s = f.recover_timeout_s;
  if (f.shards > 0) {
    o.launch_argv = shard_command_line(model, s);
    o.num_launched = f.shards;
  } else {
    o.uris = {f.shard_uri};
  }
  return shard::RemoteExecutor::start(o);
}

}  // namespace arbor::cli
