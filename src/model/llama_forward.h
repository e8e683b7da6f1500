// LlamaForward: the forward pass of a LlamaModel over one ragged batch and a paged KV cache.
//
//   embed -> per layer: rms_norm -> q, k, v (+bias) -> RoPE at positions[t] -> K/V written at
//   slot_mapping[t] -> paged attention -> wo -> residual -> rms_norm -> gate, up -> silu_mul ->
//   down -> residual;  final rms_norm and the output matmul only for logits_indices rows.
//
// Owns the activation scratch, sized for the largest batch seen so far (grows when a batch has
// more tokens; a steady-state step allocates nothing). Not thread-safe: one caller at a time,
// which also owns the ThreadPool for the call.
#pragma once

#include <string>
#include <vector>

#include "kernels/thread_pool.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace arbor::model {

class LlamaForward {
 public:
  // `model` must outlive this object. reserve_tokens sizes the scratch up front.
  explicit LlamaForward(const LlamaModel& model, int32_t reserve_tokens = 0);

  // Runs one step. The batch must be valid (validate_batch) for `cache`, whose shape must match
  // the model (CHECKed). logits: [batch.num_logits(), vocab_size].
  void run(const ForwardBatch& batch, PagedKvCache& cache, kernels::ThreadPool& pool,
           float* logits);

  // Tokens the scratch currently holds.
  int32_t capacity_tokens() const { return cap_tokens_; }

  // After run(): where logits row i's hidden state first stopped being finite ("the token
  // embedding", "layer 3's attention block", "layer 3's feed-forward block", "the output norm
  // or classifier"), or "" when it stayed finite. Each block checks only the rows that produce
  // logits (num_logits x dim values), so this costs next to nothing.
  const std::string& nonfinite_origin(int32_t i) const { return nonfinite_origin_[i]; }

 private:
  // Marks the logits rows whose hidden state is no longer finite after `layer`'s `block`
  // (layer -1: after the embedding).
  void note_nonfinite(const ForwardBatch& batch, int layer, const char* block);
  void reserve(int32_t num_tokens, int32_t num_logits);
  void embed(const ForwardBatch& batch, kernels::ThreadPool& pool);
  void attention_block(int layer, const ForwardBatch& batch, PagedKvCache& cache,
                       kernels::ThreadPool& pool);
  void qkv_rope_store(int layer, const ForwardBatch& batch, PagedKvCache& cache,
                      kernels::ThreadPool& pool);
  void ffn_block(int layer, int32_t num_tokens, kernels::ThreadPool& pool);
  void compute_logits(const ForwardBatch& batch, kernels::ThreadPool& pool, float* logits);
  void norm_rows(const float* in, const float* weight, float* out, int32_t rows,
                 kernels::ThreadPool& pool);

  const LlamaModel& model_;
  const ModelConfig& cfg_;
  std::vector<float> inv_freq_;  // [rope_dim / 2] radians per position, after any scaling
  int32_t cap_tokens_ = 0;
  int32_t cap_logits_ = 0;
  std::vector<std::string> nonfinite_origin_;  // [num_logits], see nonfinite_origin()
  std::vector<float> x_;         // [T, dim] residual stream
  std::vector<float> xb_;        // [T, dim] normed input / projection output
  std::vector<float> q_;         // [T, q_dim]
  std::vector<float> k_;         // [T, kv_dim]
  std::vector<float> v_;         // [T, kv_dim]
  std::vector<float> att_;       // [T, q_dim]
  std::vector<float> hb_;        // [T, ffn_dim]
  std::vector<float> hb2_;       // [T, ffn_dim]
  std::vector<float> rope_cos_;  // [T, rope_dim / 2]
  std::vector<float> rope_sin_;  // [T, rope_dim / 2]
  std::vector<float> xl_;        // [L, dim] normed rows for the output matmul
};

}  // namespace arbor::model
