// RemoteExecutor: the step protocol over gRPC to shard processes (docs/shards.md). Behind
// step::ModelExecutor, so the engine runs unchanged: each execute() encodes the SchedulerOutput
// as deltas (shard/wire.h), sends it on the shard's stream and waits for its StepReply, which it
// checks (the step and incarnation echoed, step::validate_step_result) before returning it.
//
// Shards are either launched and supervised here (`arbor serve --shards N`: child processes of
// `arbor shard` on Unix sockets in a private folder, restarted after a fault) or started
// elsewhere (`--shard-uri`: reconnected after a fault, never restarted from here).
//
// Faults. execute() answers kFailedPrecondition with faulted() true, naming the shard and what
// happened, when
//   * the stream breaks (the shard died: detected when its socket closes, within milliseconds;
//     a launched shard's exit status names the signal, "killed by signal 9 (SIGKILL)");
//   * no answer arrives by the step's deadline: max(min_deadline_s, deadline_factor x the
//     expected cost of the step from the measured seconds per token), start_deadline_s before
//     any step was measured; a launched shard is then killed (a hung or stopped process);
//   * the shard refuses the step (an Error naming the field) or its reply is malformed.
// The state of that incarnation is gone; recover() brings up the next one within
// recover_timeout_s (respawn, or reconnect, then Hello), and the engine recomputes.
//
// Tensor parallelism: with N > 1 shards (launched, or N uris) the shards are the N ranks of one
// TP group (each started as `arbor shard --rank r --world-size N`). Every rank gets the same
// Step at once (ranks > 0 from a worker thread each) and the engine waits for every reply under
// one deadline; rank 0's reply carries the StepResult, the others' only the step (checked). Each
// incarnation names a new group (Hello.tp_group: shared memory, or gloo over options.tp_store);
// any rank's fault ends the incarnation of the whole group, and a launched group is restarted
// whole (docs/shards.md, "Tensor parallelism across shard processes").
//
// Threading: the engine thread only (as every ModelExecutor).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "step/model_executor.h"

namespace arbor::shard {

struct RemoteExecutorOptions {
  // Launch: the `arbor shard` command line of every shard without --listen, --rank (added per
  // shard); empty: connect to `uris` instead.
  std::vector<std::string> launch_argv;
  int32_t num_launched = 1;           // shards to launch: the TP degree (1, 2 or 4)
  std::vector<std::string> uris;      // shards started elsewhere, rank order: "unix:/path" or "host:port"
  double start_timeout_s = 120.0;     // a launched shard's first Hello (it loads the model)
  double recover_timeout_s = 30.0;    // --recover-timeout: a new incarnation up after a fault
  double min_deadline_s = 1.0;        // a step's deadline, at least
  double deadline_factor = 10.0;      // ... times the step's expected cost
  double start_deadline_s = 30.0;     // ... before any step was measured
  // TP groups of more than one rank: "" meets in shared memory (every rank on one host);
  // otherwise gloo over a FileStore in this folder (every rank must reach it).
  std::string tp_store;
};

// One step's times as the engine saw them, for `arbor bench shard`.
struct StepTiming {
  int32_t num_requests = 0;
  double step_s = 0;     // encode + send + the shard's work + receive + decode + validate
  double execute_s = 0;  // the shard's LocalExecutor::execute
  double decode_s = 0;   // the shard's validation of the step (StepDecoder)
  double engine_s = 0;   // the engine's encoding, and its decoding and check of the reply
  double to_shard_s = 0;    // the step written by the engine .. read by the shard (one host)
  double from_shard_s = 0;  // the reply ready in the shard .. read by the engine (one host)
};

class RemoteExecutor : public step::ModelExecutor {
 public:
  // Launches (or connects to) the shards and says Hello (incarnation 1); errors name the shard
  // and why it did not come up.
  static Result<std::unique_ptr<RemoteExecutor>> start(const RemoteExecutorOptions& options);
  ~RemoteExecutor() override;

  Result<step::StepResult> execute(const step::SchedulerOutput& output) override;
  int32_t vocab_size() const override;
  int64_t max_model_len() const override;
  Status check_max_model_len(int64_t max_model_len) const override;
  int64_t num_kv_blocks() const override;
  int32_t block_size() const override;
  std::vector<int32_t> kv_group_windows() const override;
  Result<std::vector<step::StepCostSample>> measure_step_costs(
      std::span<const step::StepCostProbe> probes) override;
  step::ExpertShape expert_shape() const override;
  int32_t recurrent_state_slots() const override;
  int32_t state_checkpoints() const override;
  double draft_token_cost() const override;
  bool has_proposer() const override;
  bool proposer_writes_kv() const override;
  bool proposer_keeps_up() const override;
  int32_t max_tree_nodes() const override;
  bool faulted() const override;
  Status recover() override;
  std::vector<step::ShardStats> shard_stats() const override;

  // The latest steps' times (at most 4096, oldest first), for `arbor bench shard`.
  std::vector<StepTiming> step_timings() const;
  // A launched shard's process id (0 for --shard-uri shards), for tests.
  int64_t shard_pid(int32_t rank = 0) const;
  uint64_t incarnation() const;

  struct Impl;

 private:
  explicit RemoteExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor::shard
