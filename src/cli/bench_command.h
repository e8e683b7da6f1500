// Sub-benchmarks of `arbor bench`.
//
// `arbor bench -m MODEL` (no subcommand) runs the model benchmark of cmd_bench.cc. Other
// benchmarks (`arbor bench serve`, `arbor bench throughput`, ...) live in their own
// cmd_bench_<name>.cc and register a setup function here; cmd_bench.cc calls every registered
// setup with the `bench` App, so each adds its own subcommand:
//
//   namespace {
//   void setup(CLI::App& bench) {
//     auto* sub = bench.add_subcommand("serve", "Benchmark a running server");
//     ...
//     sub->callback([opts] { arbor::cli::exit_on_error(run(*opts)); });
//   }
//   ARBOR_REGISTER_BENCH_COMMAND(setup);
//   }  // namespace
//
// Header-only because only cmd_*.cc files are compiled into the executable; the registry is an
// inline function's static, so every translation unit shares it.
#pragma once

#include <CLI/CLI.hpp>
#include <vector>

#include "cli/command.h"

namespace arbor::cli {

using BenchSetup = void (*)(CLI::App& bench);

inline std::vector<BenchSetup>& bench_commands() {
  static std::vector<BenchSetup> commands;
  return commands;
}

inline bool register_bench_command(BenchSetup setup) {
  bench_commands().push_back(setup);
  return true;
}

}  // namespace arbor::cli

#define ARBOR_REGISTER_BENCH_COMMAND(fn) \
  static const bool ARBOR_CONCAT_(arbor_bench_registered_, __LINE__) = \
      ::arbor::cli::register_bench_command(fn)
