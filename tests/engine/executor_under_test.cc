#include "executor_under_test.h"

#include <cstdlib>

#include "executor/local_executor.h"
#include "shard/launch.h"
#include "shard/remote_executor.h"
#include "support/subprocess.h"

namespace arbor::engine::testing {

int test_shards() {
  const char* v = std::getenv("ARBOR_TEST_SHARDS");
  return v == nullptr || *v == '\0' ? 0 : std::atoi(v);
}

Result<std::unique_ptr<step::ModelExecutor>> load_executor(
    const std::string& path, const executor::ExecutorOptions& options) {
  const int shards = test_shards();
  if (shards == 0) {
    ARBOR_ASSIGN_OR_RETURN(auto local, executor::LocalExecutor::load(path, options));
    return std::unique_ptr<step::ModelExecutor>(std::move(local));
  }
  if (shards != 1 && shards != 2 && shards != 4) {
    return invalid_argument("ARBOR_TEST_SHARDS=", shards, ": 1, 2 or 4");
  }
  ARBOR_RETURN_IF_ERROR(executor::check_tp_launch(path, shards));
  shard::RemoteExecutorOptions o;
  o.launch_argv = shard::shard_command_line(test::arbor_bin(), path, options, "warn");
  o.num_launched = shards;
  ARBOR_ASSIGN_OR_RETURN(auto remote, shard::RemoteExecutor::start(o));
  return std::unique_ptr<step::ModelExecutor>(std::move(remote));
}

}  // namespace arbor::engine::testing
