#include "model/runner.h"

#include <algorithm>

#include "base/status.h"
#include "model/cpu_forward_ops.h"

namespace arbor::model {

Result<std::unique_ptr<ModelRunner>> ModelRunner::load(const std::string& path,
                                                       const RunnerOptions& options) {
  ModelLoadOptions lo;
  lo.pack_for_cpu = options.make_ops == nullptr;
  lo.tp_rank = options.tp.rank;
  lo.tp_size = options.tp.size;
  lo.max_segments = options.max_segments;
  lo.load_mtp = options.load_mtp;
  if (options.tp.size > 1 && options.make_ops != nullptr) {
    return unimplemented("tensor parallelism (", options.tp.size,
                         " ranks) runs on the CPU only; the GPU executor runs one rank "
                         "(use --device cpu, or TP 1)");
  }
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::load(path, lo));
  return create(std::move(model), options);
}

namespace {

// Each layer's attention window, 0 = full attention.
std::vector<int32_t> layer_windows(const ModelConfig& c) {
  std::vector<int32_t> w(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) w[static_cast<size_t>(l)] = c.layer_window(l);
  return w;
}

// Gated DeltaNet layers keep no K/V: with one KV cache group, the attention layers alone get
// pools and the recurrent ones map to pool 0, which they never read or write, so a block holds
// only what attention reads (Qwen3.5: a quarter of the layers).
void drop_recurrent_pools(const ModelConfig& c, KvCacheLayout& layout, KvCacheShape& shape) {
  if (!c.has_recurrent_layers() || layout.num_groups() != 1) return;
  int next = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    layout.layer_pool[static_cast<size_t>(l)] = c.layers[l].recurrent ? 0 : next++;
  }
  layout.num_pools = std::max(1, next);
  shape.layer_pool = layout.layer_pool;
  shape.layer_group.assign(static_cast<size_t>(c.num_layers), 0);
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(std::unique_ptr<LlamaModel> model,
                                                         const RunnerOptions& options) {
  const ModelConfig& c = model->config();
  const TpContext& tp = options.tp;
  if (tp.size != model->tp_size() || tp.rank != model->tp_rank()) {
    return invalid_argument("the model was loaded as TP rank ", model->tp_rank(), " of ",
                            model->tp_size(), ", the runner is asked for rank ", tp.rank, " of ",
                            tp.size);
  }
  if (tp.size > 1) {
    if (options.make_ops != nullptr) {
      return unimplemented("tensor parallelism (", tp.size,
                           " ranks) runs on the CPU only; the GPU executor runs one rank");
    }
    if (tp.collective == nullptr || tp.collective->size() != tp.size ||
        tp.collective->rank() != tp.rank) {
      return invalid_argument("TP rank ", tp.rank, " of ", tp.size,
                              " needs its group's collective (of that rank and size)");
    }
  }
  KvCacheShape shape;
  shape.num_layers = c.num_layers;
  shape.num_kv_heads = tp.size > 1 ? model->tp_shape().num_kv_heads : c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.block_size = options.block_size;
  shape.dtype = options.kv_dtype;
  if (options.block_size < 1) {
    return invalid_argument("block size must be >= 1, got ", options.block_size);
  }
  ARBOR_ASSIGN_OR_RETURN(KvCacheLayout layout,
                         plan_kv_cache_layout(layer_windows(c), options.kv_reclaim));
  apply_kv_cache_layout(layout, shape);
  drop_recurrent_pools(c, layout, shape);
  int64_t num_blocks = options.num_blocks;
  if (num_blocks <= 0) {
    // GiB to bytes, clamped below 2^63 so the conversion cannot overflow.
    const double bytes = std::clamp(options.kv_cache_gib * 1073741824.0, 0.0, 9.0e18);
    Result<int32_t> blocks =
        PagedKvCache::blocks_for_budget(shape, static_cast<int64_t>(bytes));
    if (!blocks.ok()) {
      return blocks.status().with_context(str_cat("--kv-cache-gib ", options.kv_cache_gib));
    }
    num_blocks = *blocks;
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->model_ = std::move(model);
  r->pool_ = options.pool ? options.pool
                          : std::make_shared<kernels::ThreadPool>(options.num_threads);
  if (options.make_ops) {
    ARBOR_ASSIGN_OR_RETURN(r->ops_, options.make_ops(*r->model_));
  } else {
    r->ops_ = std::make_unique<CpuForwardOps>(*r->model_, *r->pool_);
  }
  ARBOR_ASSIGN_OR_RETURN(r->cache_, PagedKvCache::create(shape, num_blocks, options.populate_kv,
                                                         r->ops_.get()));
  if (c.has_recurrent_layers()) {
    ARBOR_ASSIGN_OR_RETURN(r->states_,
                           RecurrentStateCache::create(c, options.state_slots, *r->ops_));
  }
  r->tp_ = tp;
  r->forward_ = std::make_unique<LlamaForward>(*r->model_, *r->ops_, options.reserve_tokens,
                                               tp.collective.get());
  r->forward_->set_recurrent_states(r->states_.get());
  if (layout.num_groups() > 1 || layout.reclaims()) r->group_windows_ = layout.windows();
  r->layout_ = std::move(layout);
  return r;
}

Status ModelRunner::forward(const ForwardBatch& batch, float* logits) {
  LogitsOut out;
  out.logits = logits;
  return forward(batch, out);
}

Status ModelRunner::forward(const ForwardBatch& batch, const LogitsOut& out) {
  BatchLimits limits;
  limits.vocab_size = config().vocab_size;
  limits.block_size = cache_->block_size();
  limits.num_blocks = cache_->num_blocks();
  limits.group_windows = group_windows_;
  limits.num_state_slots = states_ != nullptr ? states_->num_slots() : 0;
  limits.input_hidden_dim = model_->weights().is_mtp_view ? config().dim : 0;
  ARBOR_RETURN_IF_ERROR(validate_batch(batch, limits));
  if (!out.want.empty() && static_cast<int32_t>(out.want.size()) != batch.num_logits()) {
    return invalid_argument("LogitsOut has ", out.want.size(), " row kinds for ",
                            batch.num_logits(), " logits rows");
  }
  if (batch.num_hidden() > 0 && out.hidden == nullptr) {
    return invalid_argument("the batch has ", batch.num_hidden(),
                            " hidden-state rows but LogitsOut has no hidden array");
  }
  if (std::find(out.want.begin(), out.want.end(), RowOut::kTopK) != out.want.end()) {
    const int32_t max_k = std::min(kMaxDeviceTopK, config().vocab_size);
    if (out.top_k < 1 || out.top_k > max_k) {
      return invalid_argument("LogitsOut asks for ", out.top_k,
                              " top-k candidates; the range is [1, ", max_k, "]");
    }
    if (out.top_ids == nullptr || out.top_logits == nullptr ||
        static_cast<int32_t>(out.top_k_scale.size()) != batch.num_logits()) {
      return invalid_argument("LogitsOut has top-k rows but not their arrays (",
                              out.top_k_scale.size(), " scales for ", batch.num_logits(),
                              " logits rows)");
    }
  }
  forward_->run(batch, *cache_, out);
  last_replay_rows_.assign(batch.replay_rows.begin(), batch.replay_rows.end());
  return forward_->status();
}

Status ModelRunner::commit_states(std::span<const StateCommit> commits) {
  if (states_ == nullptr) return invalid_argument("commit_states: the model has no recurrent state");
  if (last_replay_rows_.empty()) {
    return failed_precondition("commit_states: the last forward verified nothing into scratch "
                               "state slots");
  }
  for (const StateCommit& c : commits) {
    if (c.slot < 0 || c.slot >= states_->num_slots()) {
      return invalid_argument("commit_states: slot ", c.slot, " of ", states_->num_slots());
    }
    for (int32_t r : c.rows) {
      if (!std::binary_search(last_replay_rows_.begin(), last_replay_rows_.end(), r)) {
        return invalid_argument("commit_states: row ", r, " is not one of the last forward's ",
                                last_replay_rows_.size(), " replayable rows");
      }
    }
  }
  forward_->commit_states(commits);
  last_replay_rows_.clear();
  return ok_status();
}

SingleSequence::SingleSequence(ModelRunner& runner, std::vector<int32_t> blocks)
    : runner_(runner), blocks_(std::move(blocks)), builder_(runner.kv_cache().block_size()) {
  ARBOR_CHECK_EQ(runner.kv_layout().num_groups(), 1)
      << "SingleSequence needs a runner without KV cache groups (RunnerOptions::kv_reclaim)";
}

std::vector<int32_t> SingleSequence::contiguous_blocks(int32_t first, int32_t count) {
  std::vector<int32_t> ids(count);
  for (int32_t i = 0; i < count; ++i) ids[i] = first + i;
  return ids;
}

int32_t SingleSequence::capacity() const {
  return (int32_t)blocks_.size() * runner_.kv_cache().block_size();
}

void SingleSequence::truncate(int32_t n) {
  ARBOR_CHECK(n >= 0 && n <= num_tokens_) << "truncate(" << n << ") of " << num_tokens_;
  ARBOR_CHECK(runner_.recurrent_states() == nullptr || n == 0 || n == num_tokens_)
      << "truncate(" << n << ") of " << num_tokens_ << ": recurrent layers cannot roll back";
  num_tokens_ = n;
}

Result<std::span<const float>> SingleSequence::run_chunk(std::span<const int32_t> tokens,
                                                         LogitsMode mode) {
  if (tokens.empty()) return invalid_argument("append: no tokens");
  if (num_tokens_ + (int64_t)tokens.size() > capacity()) {
    return out_of_range("sequence has ", num_tokens_, " tokens, appending ", tokens.size(),
                        " exceeds its capacity of ", capacity(), " tokens");
  }
  builder_.clear();
  SequenceInput in;
  in.block_table = blocks_;
  in.num_committed = num_tokens_;
  in.tokens = tokens;
  in.logits = mode;
  if (runner_.recurrent_states() != nullptr) in.state_slot = 0;
  builder_.add(in);
  const size_t vocab = runner_.config().vocab_size;
  logits_.resize(builder_.num_logits() * vocab);
  ARBOR_RETURN_IF_ERROR(runner_.forward(builder_.batch(), logits_.data()));
  num_tokens_ += (int32_t)tokens.size();
  return std::span<const float>(logits_);
}

Result<std::span<const float>> SingleSequence::append(std::span<const int32_t> tokens,
                                                      int32_t max_chunk) {
  if (tokens.empty()) return invalid_argument("append: no tokens");
  const size_t chunk = max_chunk > 0 ? (size_t)max_chunk : tokens.size();
  std::span<const float> last;
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const size_t n = std::min(chunk, tokens.size() - i);
    ARBOR_ASSIGN_OR_RETURN(last, run_chunk(tokens.subspan(i, n), LogitsMode::kLast));
  }
  return last;
}

Result<std::span<const float>> SingleSequence::append_all_logits(std::span<const int32_t> tokens) {
  return run_chunk(tokens, LogitsMode::kAll);
}

}  // namespace arbor::model
