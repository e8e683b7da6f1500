// ModelRunner: a loaded model + its paged KV cache + a thread pool, running ragged-batch
// forwards. SingleSequence: one sequence on a fixed list of blocks, for tests and
// `arbor generate` (no prefix caching or block sharing: that is the KV manager's job).
//
// Typical use (greedy decoding, one sequence):
//   ARBOR_ASSIGN_OR_RETURN(auto runner, ModelRunner::load(path, {.num_blocks = 64}));
//   SingleSequence seq(*runner, SingleSequence::contiguous_blocks(0, 64));
//   ARBOR_ASSIGN_OR_RETURN(auto logits, seq.append(prompt_ids));    // [vocab]
//   while (...) {
//     int32_t next = argmax(logits);
//     ARBOR_ASSIGN_OR_RETURN(logits, seq.append({&next, 1}));
//   }
//
// Thread-safety: a ModelRunner and its sequences are used from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/thread_pool.h"
#include "model/batch_builder.h"
#include "model/forward_batch.h"
#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "model/llama_forward.h"
#include "model/llama_model.h"

namespace arbor::model {

struct RunnerOptions {
  int32_t block_size = 16;     // tokens per KV block
  int64_t num_blocks = 0;      // > 0: exactly this many blocks; 0: from kv_cache_gib
  // KV memory budget when num_blocks == 0 (--kv-cache-gib), sized by
  // PagedKvCache::blocks_for_budget (floor; an error below 2 blocks).
  double kv_cache_gib = 1.0;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF16;
  int num_threads = 0;         // 0: std::thread::hardware_concurrency()
  int32_t reserve_tokens = 0;  // activation scratch sized up front (grows on demand anyway)
  // Commit the KV pool's pages at creation (MAP_POPULATE) instead of on first write. The engine
  // sets it: a server cycles through every block (the free queue hands out the least recently
  // used), and taking ~150k page faults mid-serving cost ~10 % of a throughput run.
  bool populate_kv = false;
  // Release the KV of sliding-window layers that no query can read again: the layers form KV
  // cache groups (plan_kv_cache_layout) whose block tables the KV manager keeps separately; the
  // engine's executor sets it. false: one group of every layer (block tables as without sliding
  // layers: SingleSequence and a draft model, which shares its target's tables, need that).
  bool kv_reclaim = false;
  // Run on this pool instead of starting one (a draft model shares its target's threads: the two
  // never run at once). Null: a pool of num_threads.
  std::shared_ptr<kernels::ThreadPool> pool;
  // The device the forward runs on and the KV cache lives in: builds its ops for the loaded
  // model (which must outlive them). Null: the CPU (CpuForwardOps on the pool). A GPU's factory
  // comes from src/cuda; load() then skips the CPU's weight packing.
  using OpsFactory = std::function<Result<std::unique_ptr<ForwardOps>>(const LlamaModel&)>;
  OpsFactory make_ops;
  // Tensor parallelism (tp.h, docs/tensor_parallel.md): run rank tp.rank of a group of tp.size
  // ranks, each loading only its share of the weights and holding only its kv heads; the ranks
  // meet through tp.collective. Every rank must run every forward with the same batch; rank 0
  // returns the logits. CPU only: with make_ops (a GPU) tp.size must be 1.
  TpContext tp;
  // ModelLoadOptions::max_segments (load() only).
  int max_segments = kMaxSegments;
  // A model with recurrent layers (Gated DeltaNet): the RecurrentStateCache's slots, one per
  // sequence a batch may run (the executor sets the engine's max_num_seqs; SingleSequence uses
  // slot 0). Ignored for other models.
  int32_t state_slots = 1;
  // ModelLoadOptions::load_mtp (load() only): bind the file's MTP block for
  // LlamaModel::mtp_model() (--spec mtp).
  bool load_mtp = false;
};

class ModelRunner {
 public:
  // Loads the GGUF at `path` (weights stay mmapped) and allocates the KV cache. Errors name the
  // file, key or tensor; a budget too small for one block is kInvalidArgument.
  static Result<std::unique_ptr<ModelRunner>> load(const std::string& path,
                                                   const RunnerOptions& options);
  // Same with an already loaded model (taken over).
  static Result<std::unique_ptr<ModelRunner>> create(std::unique_ptr<LlamaModel> model,
                                                     const RunnerOptions& options);

  const ModelConfig& config() const { return model_->config(); }
  const LlamaModel& model() const { return *model_; }
  PagedKvCache& kv_cache() { return *cache_; }
  // The recurrent layers' states, or null for a model without them.
  RecurrentStateCache* recurrent_states() { return states_.get(); }
  // How the layers share block tables and pools (one group unless RunnerOptions::kv_reclaim and
  // the model has sliding-window layers).
  const KvCacheLayout& kv_layout() const { return layout_; }
  // The device the forward runs on ("cpu", "cuda:0").
  std::string_view device_name() const { return ops_->name(); }
  // True when the forward runs on the host (its logits need no copy).
  bool on_host() const { return ops_->is_host(); }
  kernels::ThreadPool& pool() { return *pool_; }
  const std::shared_ptr<kernels::ThreadPool>& shared_pool() const { return pool_; }
  // The TP group this runner is a rank of (size 1: the whole model).
  const TpContext& tp() const { return tp_; }

  // Validates `batch` (validate_batch; an invalid batch is kInvalidArgument and changes
  // nothing), writes the new tokens' K/V into the cache and fills
  // logits: [batch.num_logits(), vocab_size]. A TP rank: the collective's error when the group
  // broke during the step (LlamaForward::status), and only rank 0 fills the logits.

  Status forward(const ForwardBatch& batch, float* logits);
  // Same, with per row what comes back to the host (LogitsOut: whole rows, only the argmax, or
  // only the top-k candidates). A `want` of the wrong length, or kTopK rows with top_k outside
  // [1, min(kMaxDeviceTopK, vocab_size)] or without their arrays, is kInvalidArgument.
  Status forward(const ForwardBatch& batch, const LogitsOut& out);
  // After a forward() whose batch verified sequences into scratch state slots
  // (SequenceInput::state_scratch): advances each commit's slot by the rows it names (the
  // committed token and the accepted drafts; LlamaForward::commit_states). Errors: a slot or
  // row out of range, or no such forward before.
  Status commit_states(std::span<const StateCommit> commits);
  // After forward(): LlamaForward::experts_touched() (mean distinct experts per MoE layer).
  double experts_touched() const { return forward_->experts_touched(); }
  // After forward(): where logits row i first became non-finite, or "" (LlamaForward).
  const std::string& nonfinite_origin(int32_t i) const { return forward_->nonfinite_origin(i); }

 private:
  ModelRunner() = default;

  // Destroyed bottom-up: the forward and the cache release device memory through ops_, which
  // reads model_ and may use pool_.
  std::unique_ptr<LlamaModel> model_;
  TpContext tp_;  // keeps the collective alive for forward_
  std::shared_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<ForwardOps> ops_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<RecurrentStateCache> states_;
  std::unique_ptr<LlamaForward> forward_;
  KvCacheLayout layout_;
  std::vector<int32_t> group_windows_;  // BatchLimits::group_windows: empty with one full group
  std::vector<int32_t> last_replay_rows_;  // the last forward's ForwardBatch::replay_rows
};

class SingleSequence {
 public:
  // The sequence uses `blocks` of runner's cache, in order; the caller guarantees nobody else
  // writes them while this sequence lives. capacity() = blocks.size() * block_size. The runner
  // must have one KV cache group (CHECKed: RunnerOptions::kv_reclaim false, or no sliding layers).
  SingleSequence(ModelRunner& runner, std::vector<int32_t> blocks);
  // Block ids [first, first + count).
  static std::vector<int32_t> contiguous_blocks(int32_t first, int32_t count);

  // Runs `tokens` after the current ones (positions num_tokens() ...), in chunks of at most
  // max_chunk tokens (0 = one chunk). Returns the last token's logits [vocab_size], valid until
  // the next call. Errors: empty tokens, capacity exceeded, invalid token ids.
  Result<std::span<const float>> append(std::span<const int32_t> tokens, int32_t max_chunk = 0);
  // Same in one chunk, returning every new token's logits [tokens.size(), vocab_size].
  Result<std::span<const float>> append_all_logits(std::span<const int32_t> tokens);

  int32_t num_tokens() const { return num_tokens_; }
  int32_t capacity() const;
  // Forgets tokens from index n on (n <= num_tokens()), e.g. rejected draft tokens; their slots
  // are overwritten by the next append. A model with recurrent layers cannot forget tokens its
  // state has absorbed: only n == 0 (start over) or n == num_tokens() (CHECKed).
  void truncate(int32_t n);

 private:
  Result<std::span<const float>> run_chunk(std::span<const int32_t> tokens, LogitsMode mode);

  ModelRunner& runner_;
  std::vector<int32_t> blocks_;
  int32_t num_tokens_ = 0;
  BatchBuilder builder_;
  std::vector<float> logits_;
};

}  // namespace arbor::model
