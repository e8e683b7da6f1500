#include "executor/cpu_executor.h"

#include <algorithm>
#include <utility>

namespace arbor::executor {

Result<std::unique_ptr<CpuModelExecutor>> CpuModelExecutor::load(const std::string& path,
                                                                 const CpuExecutorOptions& options) {
  model::RunnerOptions ro;
  ro.block_size = options.block_size;
  ro.num_blocks = options.num_kv_blocks;
  ro.populate_kv = true;
  ro.kv_cache_gib = options.kv_cache_gib;
  ro.kv_dtype = options.kv_dtype;
  ro.num_threads = options.num_threads;
  ro.reserve_tokens = options.reserve_tokens;
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner,
                         model::ModelRunner::load(path, ro));
  if (runner->kv_cache().num_blocks() < 2) {
    return invalid_argument("KV cache of ", runner->kv_cache().num_blocks(),
                            " blocks: need at least 2 (the null block and one more)");
  }
  return std::make_unique<CpuModelExecutor>(std::move(runner));
}

Status CpuModelExecutor::check_max_model_len(int64_t max_model_len) const {
  const int64_t context = runner_->config().context_length;
  const int64_t usable_blocks = runner_->kv_cache().num_blocks() - 1;
  if (max_model_len < 0) return invalid_argument("--max-model-len is ", max_model_len);
  if (max_model_len > context) {
    return invalid_argument("--max-model-len is ", max_model_len,
                            ", the model's context length is ", context);
  }
  if (max_model_len > usable_blocks * block_size()) {
    return invalid_argument("--max-model-len is ", max_model_len, ", the KV pool holds only ",
                            usable_blocks * block_size(), " tokens (", usable_blocks,
                            " blocks of ", block_size(), ")");
  }
  return ok_status();
}

int64_t CpuModelExecutor::max_model_len() const {
  const int64_t pool_tokens = (runner_->kv_cache().num_blocks() - 1) * int64_t{block_size()};
  return std::min<int64_t>(runner_->config().context_length, pool_tokens);
}

CpuModelExecutor::CpuModelExecutor(std::unique_ptr<model::ModelRunner> runner)
    : runner_(std::move(runner)), builder_(runner_->kv_cache().block_size()) {}

int64_t CpuModelExecutor::num_kv_blocks() const { return runner_->kv_cache().num_blocks(); }
int32_t CpuModelExecutor::block_size() const { return runner_->kv_cache().block_size(); }

Result<step::StepResult> CpuModelExecutor::execute(const step::SchedulerOutput& output) {
  for (const kv::BlockCopy& c : output.block_copies) {
    runner_->kv_cache().copy_block(c.src_block, c.dst_block);
  }
  builder_.clear();
  std::vector<int32_t> rows(output.requests.size(), -1);
  for (size_t i = 0; i < output.requests.size(); ++i) {
    const step::ScheduledRequest& s = output.requests[i];
    model::SequenceInput in;
    in.block_table = s.block_ids;
    in.num_committed = static_cast<int32_t>(s.num_computed_tokens);
    in.tokens = s.token_ids.subspan(s.num_computed_tokens, s.num_scheduled_tokens);
    in.logits = s.sample ? model::LogitsMode::kLast : model::LogitsMode::kNone;
    const int32_t row = builder_.add(in);
    if (s.sample) rows[i] = row;
  }
  step::StepResult result;
  if (output.requests.empty()) return result;
  const int32_t vocab = vocab_size();
  logits_.resize(static_cast<size_t>(builder_.num_logits()) * vocab);
  ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), logits_.data()));
  for (size_t i = 0; i < output.requests.size(); ++i) {
    if (rows[i] < 0) continue;
    const step::ScheduledRequest& s = output.requests[i];
    std::span<const float> row(logits_.data() + static_cast<size_t>(rows[i]) * vocab, vocab);
    sampling::SampleResult r =
        sampler_.sample(row, *s.sampling, {s.prompt_token_ids, s.output_token_ids}, *s.rng);
    step::SampledToken t;
    t.request_id = s.request_id;
    t.token_id = r.token_id;
    t.logprob = r.logprob;
    t.top_logprobs = std::move(r.top_logprobs);
    result.sampled.push_back(std::move(t));
  }
  return result;
}

}  // namespace arbor::executor
