// The `arbor shard` command line that loads a model as an in-process LocalExecutor with the same
// ExecutorOptions would (docs/shards.md): one place for the flag names, used by `arbor serve
// --shards N` (cli/shard_flags.h) and by the tests that run the engine through shards.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "executor/executor_options.h"

namespace arbor::shard {

// argv of `binary shard -m model ...` without --listen, --rank and --world-size (the launcher
// adds them per rank). Every ExecutorOptions field that `arbor shard` reads back is passed;
// reserve_tokens goes as --max-num-batched-tokens (what the CLI derives it from). Not passed:
// tp (the launcher's), top_k_candidates_on_host (no flag: a test-only switch).
std::vector<std::string> shard_command_line(const std::string& binary, const std::string& model,
                                            const executor::ExecutorOptions& e,
                                            std::string_view log_level);

}  // namespace arbor::shard
