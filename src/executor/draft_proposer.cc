#include "executor/draft_proposer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "sampling/rng.h"

namespace arbor::executor {

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load(
    const std::string& path, int64_t num_blocks, int32_t block_size,
    std::shared_ptr<kernels::ThreadPool> pool) {
  model::RunnerOptions ro;
  ro.block_size = block_size;
  ro.num_blocks = num_blocks;
  ro.pool = std::move(pool);
  Result<std::unique_ptr<model::ModelRunner>> runner = model::ModelRunner::load(path, ro);
  if (!runner.ok()) return runner.status().with_context(str_cat("draft model ", path));
  return std::unique_ptr<DraftModelProposer>(new DraftModelProposer(std::move(runner).value()));
}

DraftModelProposer::DraftModelProposer(std::unique_ptr<model::ModelRunner> runner)
    : runner_(std::move(runner)), builder_(runner_->kv_cache().block_size()) {}

Result<double> DraftModelProposer::measure_token_cost() {
  const std::vector<int32_t> blocks{1};
  const int32_t token = 1;
  std::vector<double> runs;
  logits_.resize(static_cast<size_t>(vocab_size()));
  for (int r = 0; r < 4; ++r) {
    builder_.clear();
    builder_.add(model::SequenceInput{.block_table = blocks,
                                      .num_committed = 0,
                                      .tokens = std::span<const int32_t>(&token, 1),
                                      .logits = model::LogitsMode::kLast});
    const auto t0 = std::chrono::steady_clock::now();
    ARBOR_RETURN_IF_ERROR(runner_->forward(builder_.batch(), logits_.data()));
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(runs.begin() + 1, runs.end());
  return runs[2];
}

// The draft token at `position` from the draft's logits row, following the request's sampling.
int32_t DraftModelProposer::pick(const DraftInput& in, std::span<const float> logits,
                                 int64_t position, std::span<const int32_t> drafted,
                                 DraftOutput& out) {
  history_.assign(in.token_ids.begin() + in.num_prompt_tokens, in.token_ids.end());
  history_.insert(history_.end(), drafted.begin(), drafted.end());
  const sampling::TokenHistory history{in.token_ids.first(in.num_prompt_tokens), history_};
  sampling::Rng rng = sampling::Rng::at(in.seed, position, sampling::RngStream::kDraft);
  const int32_t token = sampler_.sample(logits, *in.sampling, history, rng).token_id;
  if (in.keep_distributions) {
    work_.assign(logits.begin(), logits.end());
    sampler_.apply_penalties(work_, *in.sampling, history);
    out.q.push_back(sampler_.distribution(work_, *in.sampling));
  }
  return token;
}

Result<std::vector<DraftOutput>> DraftModelProposer::propose(std::span<const DraftInput> inputs) {
  const int32_t vocab = vocab_size();
  std::vector<DraftOutput> outs(inputs.size());
  // Round 0: catch up on committed tokens not yet run (at least the last one) and draft 1 token.
  builder_.clear();
  std::vector<std::vector<int32_t>> chunks(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    std::vector<int32_t>& run = states_[in.request_id];
    const auto n = static_cast<int64_t>(in.token_ids.size());
    auto [a, b] = std::mismatch(run.begin(), run.end(), in.token_ids.begin(), in.token_ids.end());
    const int64_t valid = std::min<int64_t>(a - run.begin(), n - 1);
    run.resize(static_cast<size_t>(valid));
    chunks[i].assign(in.token_ids.begin() + valid, in.token_ids.end());
    builder_.add(model::SequenceInput{.block_table = in.block_ids,
                                      .num_committed = static_cast<int32_t>(valid),
                                      .tokens = chunks[i],
                                      .logits = model::LogitsMode::kLast});
  }
  int32_t max_drafts = 0;
  for (const DraftInput& in : inputs) max_drafts = std::max(max_drafts, in.num_drafts);
  for (int32_t round = 0; round < max_drafts; ++round) {
    if (round > 0) {
      builder_.clear();
      for (size_t i = 0; i < inputs.size(); ++i) {
        const DraftInput& in = inputs[i];
        if (in.num_drafts <= round) continue;
        const std::vector<int32_t>& run = states_[in.request_id];
        chunks[i].assign(1, outs[i].tokens.back());
        builder_.add(model::SequenceInput{.block_table = in.block_ids,
                                          .num_committed = static_cast<int32_t>(run.size()),
                                          .tokens = chunks[i],
                                          .logits = model::LogitsMode::kLast});
      }
    }
    logits_.resize(static_cast<size_t>(builder_.num_logits()) * vocab);
    const Status st = runner_->forward(builder_.batch(), logits_.data());
    if (!st.ok()) {
      for (const DraftInput& in : inputs) states_.erase(in.request_id);
      return st;
    }
    size_t row = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DraftInput& in = inputs[i];
      if (in.num_drafts <= round) continue;
      std::vector<int32_t>& run = states_[in.request_id];
      run.insert(run.end(), chunks[i].begin(), chunks[i].end());
      std::span<const float> logits(logits_.data() + row * vocab, static_cast<size_t>(vocab));
      ++row;
      const int64_t position = static_cast<int64_t>(in.token_ids.size()) + round;
      outs[i].tokens.push_back(pick(in, logits, position, outs[i].tokens, outs[i]));
    }
  }
  return outs;
}

}  // namespace arbor::executor
