// The executor an engine test runs its model with: in this process (LocalExecutor), or, when
// the environment says ARBOR_TEST_SHARDS=N (the `shards` passes of ctest, registered by
// arbor_add_shard_pass in cmake/ArborTest.cmake), N launched `arbor shard` processes over gRPC
// (shard::RemoteExecutor; N > 1: a tensor-parallel group) loaded with the same options. The
// tests' expectations (goldens, speculation equal to plain, structured output, prompt logprobs,
// preemption) then hold through shards unchanged (docs/shards.md).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "executor/executor_options.h"
#include "step/model_executor.h"

namespace arbor::engine::testing {

// 0: in process; otherwise the shards ARBOR_TEST_SHARDS asks for (1, 2 or 4; anything else
// fails the test that asks).
int test_shards();

// `path` with `options` as the test's executor (above). Errors: the load's, or the shards'.
Result<std::unique_ptr<step::ModelExecutor>> load_executor(const std::string& path,
                                                           const executor::ExecutorOptions& options);

}  // namespace arbor::engine::testing
