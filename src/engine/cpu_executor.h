// CpuModelExecutor: the in-process executor over model::ModelRunner.
//
// Builds one ForwardBatch per step from the SchedulerOutput (BatchBuilder: per request its block
// table, num_computed_tokens as committed tokens, the scheduled tokens, logits of the last row
// only when it samples), runs the forward on the runner's thread pool and samples each row with
// the request's params and Rng. Thread-safety: engine thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine_options.h"
#include "engine/model_executor.h"
#include "model/batch_builder.h"
#include "model/runner.h"
#include "sampling/sampler.h"

namespace arbor::engine {

class CpuModelExecutor : public ModelExecutor {
 public:
  // Loads the GGUF at `path` with a KV pool of options.num_kv_blocks blocks (or as many as
  // options.kv_cache_gib holds) of options.block_size tokens. kInvalidArgument, naming the
  // numbers, when options.max_model_len exceeds the model's context length or the KV pool.
  static Result<std::unique_ptr<CpuModelExecutor>> load(const std::string& path,
                                                        const EngineOptions& options);
  explicit CpuModelExecutor(std::unique_ptr<model::ModelRunner> runner);

  Result<sched::StepResult> execute(const sched::SchedulerOutput& output) override;
  int32_t vocab_size() const override { return runner_->config().vocab_size; }
  int64_t max_model_len() const override;
  int64_t num_kv_blocks() const override;
  int32_t block_size() const override;

  model::ModelRunner& runner() { return *runner_; }
  // ok when 0 <= max_model_len <= max_model_len(); otherwise names the limit it exceeds.
  Status check_max_model_len(int64_t max_model_len) const;

 private:
  std::unique_ptr<model::ModelRunner> runner_;
  model::BatchBuilder builder_;
  sampling::Sampler sampler_;
  std::vector<float> logits_;  // [num_logits, vocab_size]
};

}  // namespace arbor::engine
