// LlamaForward: the forward pass of a LlamaModel over one ragged batch and a paged KV cache,
// written once over ForwardOps (forward_ops.h), so the same sequence of ops runs on every device.
//
//   embed (x embed_scale) -> per layer: [rms_norm] -> q, k, v (scale, bias) -> [QK-norm] ->
//   RoPE at positions[t] (the layer's variant, or none) -> K/V written at slot_mapping[t] ->
//   paged attention (the layer's window, soft-cap, sinks) -> wo (scale, bias) -> [post-norm] ->
//   residual -> [rms_norm] -> gate, up -> silu_mul | gelu_mul -> down -> [post-norm] ->
//   residual;  final rms_norm and the output matmul (scale, soft-cap) only for logits_indices
//   rows; the final rms_norm alone for hidden_indices rows (embeddings). The bracketed and
//   optional steps are the architecture row's (arch.h); a Llama model runs exactly the ops it
//   always did. A mixture-of-experts FFN (ModelConfig::is_moe) is
//   router -> route_experts -> the (token, slot) pairs through their experts' gate and up
//   (matmul_experts) -> silu_mul -> down (matmul_experts) -> combine_experts (+ a shared expert's
//   FFN under its sigmoid gate, add_gated_rows: Qwen2-MoE), the pairs' outputs
//   weighted and summed per token (docs/kernels.md, "Mixture-of-experts FFN"); gpt-oss adds the
//   router's and the experts' biases and runs its clamped SwiGLU (swiglu_oai).
//
// An MTP head (LlamaModel::mtp_model(), LlamaWeights::is_mtp_view) runs the same forward over
// its one layer, with the embedding replaced by the input mix of MtpInput: each token's
// embedding beside the target's hidden row before it (ForwardBatch::input_hidden).
//
// Attention is planned once per step: after staging the batch, one ForwardOps::plan_attention
// per distinct attention layout among the layers (layouts differ only by window: layers of
// different KV cache groups but one window share a plan, the block tables not being part of
// it), then each layer runs ForwardOps::attention with its window's plan. The batch is
// validated before run() (ModelRunner::forward: validate_batch), not again per layer.
//
// Owns the activation scratch in the device's memory, sized for the largest batch seen so far
// (grows when a batch has more tokens; a steady-state step allocates nothing). Not thread-safe:
// one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "collective/collective.h"
#include "model/llama_model.h"
#include "model/recurrent_state.h"

namespace arbor::model {

// gpt-oss's clamped SwiGLU (Activation::kSwigluOai), as llama.cpp fixes them.
inline constexpr float kSwigluOaiAlpha = 1.702f;
inline constexpr float kSwigluOaiLimit = 7.0f;

// What comes back to the host of one logits row.
enum class RowOut : uint8_t {
  kRow,     // the whole row: vocab_size floats
  kArgmax,  // only its argmax (ForwardOps::argmax_rows): one int; the row stays on the device
  kTopK,    // only its LogitsOut::top_k best candidates (ForwardOps::top_k_rows): ids and logits
};

// The most candidates a kTopK row may ask for (LogitsOut::top_k): 2 KiB of ids and logits per
// row instead of 4 x vocab_size bytes; a larger top_k takes the whole row.
inline constexpr int32_t kMaxDeviceTopK = 256;

// Where a step's logits go, all host memory.
struct LogitsOut {
  // [num_logits, vocab_size]: row i holds the logits when `want` is empty or want[i] == kRow;
  // the other rows' contents are unspecified (the CPU writes them, a GPU leaves them alone).
  float* logits = nullptr;
  std::span<const RowOut> want;  // [num_logits], or empty: every row whole
  // [num_logits]: argmax[i] for every kArgmax row, as ForwardOps::argmax_rows gives it (-1 when
  // the row holds a non-finite logit); other entries unspecified. Needed when a row is kArgmax.
  int32_t* argmax = nullptr;
  // kTopK rows (needed when a row is kTopK): every such row gets the top_k candidates
  // ForwardOps::top_k_rows picks with scale top_k_scale[i] (1 / the request's temperature):
  // top_ids[i, j] and top_logits[i, j], j < top_k, in increasing id; top_ids[i, 0] == -1 flags a
  // row holding a non-finite logit. Other rows' entries unspecified.
  // top_k: in [1, min(kMaxDeviceTopK, vocab_size)] when a row is kTopK.
  int32_t top_k = 0;
  std::span<const float> top_k_scale;  // [num_logits]
  int32_t* top_ids = nullptr;          // [num_logits, top_k]
  float* top_logits = nullptr;         // [num_logits, top_k]
  // [num_hidden, dim]: the final hidden state (after the output norm) of each row of
  // ForwardBatch::hidden_indices. Needed when the batch has hidden rows.
  float* hidden = nullptr;
};

// One sequence's speculative rows to replay into its recurrent state (LlamaForward::
// commit_states): rows of the last run, in order (the committed token, then the accepted drafts).
struct StateCommit {
  int32_t slot = 0;
  std::vector<int32_t> rows;
};

class LlamaForward {
 public:
  // `model` and `ops` must outlive this object; ops runs on the device the cache lives on.
  // reserve_tokens sizes the scratch up front. A rank of a TP group (model.tp_size() > 1) runs
  // its share of the model (tp.h) and meets the other ranks through `collective` (required
  // then, of the model's size and rank, outliving this object; host memory only): every rank
  // runs every step with the same batch; only rank 0's LogitsOut is written (logits, argmax,
  // top-k and non-finite origins); the hidden rows are written on every rank.
  LlamaForward(const LlamaModel& model, ForwardOps& ops, int32_t reserve_tokens = 0,
               collective::Collective* collective = nullptr);
  ~LlamaForward();
  LlamaForward(const LlamaForward&) = delete;
  LlamaForward& operator=(const LlamaForward&) = delete;

  // Runs one step. The batch (host arrays) must be valid (validate_batch) for `cache`, whose
  // shape must match the model (CHECKed). The logits rows go to `out` (host memory).
  void run(const ForwardBatch& batch, PagedKvCache& cache, const LogitsOut& out);
  // Every row whole. logits: host [batch.num_logits(), vocab_size].
  void run(const ForwardBatch& batch, PagedKvCache& cache, float* logits) {
    LogitsOut out;
    out.logits = logits;
    run(batch, cache, out);
  }

  // After run(): ok, or the collective error that broke the step (a rank missing the deadline,
  // ranks running different batches; collective.h). The step's outputs are then garbage, and
  // the group is broken: every later run() fails the same way.
  const Status& status() const { return status_; }
  // After run(): the mean over the mixture-of-experts layers of the distinct experts the
  // batch's rows were routed to (the step-cost model's expert term); 0 for a dense model, -1
  // where the device did not tell (ForwardOps::route_experts).
  double experts_touched() const {
    if (experts_touched_ < 0) return -1.0;
    return moe_layers_run_ > 0 ? static_cast<double>(experts_touched_) / moe_layers_run_ : 0.0;
  }

  // The recurrent layers' states (a model with Gated DeltaNet layers needs them before run();
  // the batch's state_slots index them). Must outlive this object's runs.
  void set_recurrent_states(RecurrentStateCache* states) { states_ = states; }

  // After a run() whose batch had state_src / state_dst (speculation, which left every
  // sequence's state_slots untouched where it verified into a scratch slot): advances each
  // commit's slot by the rows it names, as if they had run in place — the same bits as a plain
  // run over those tokens (the rows' recurrent-layer inputs are kept from the run). Host device
  // only (CHECKed); rows must be the last run's replay_rows (CHECKed).
  void commit_states(std::span<const StateCommit> commits);

  // Tokens the scratch currently holds.
  int32_t capacity_tokens() const { return cap_tokens_; }

  // After run(): where logits row i's hidden state first stopped being finite ("the token
  // embedding", "layer 3's attention block", "layer 3's feed-forward block", "the output norm
  // or classifier"), or "" when it stayed finite. Each block checks only the rows that produce
  // logits (num_logits x dim values), so this costs next to nothing.
  const std::string& nonfinite_origin(int32_t i) const { return nonfinite_origin_[i]; }

 private:
  // A scratch array in the device's memory.
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
    float* f() const { return static_cast<float*>(p); }
  };
  // Makes `s` hold at least `bytes` (contents not kept).
  void ensure(Scratch& s, size_t bytes);
  void reserve(int32_t num_tokens, int32_t num_logits);
  void embed(const ForwardBatch& batch);
  // An MTP view's input mix over x (the tokens' embeddings) and the batch's host hidden rows.
  void mix_mtp_input(std::span<const float> host_hidden, int32_t nt);
  void finish_linear(const Linear& l, float* y, int32_t nt);
  void residual(const float* post_norm, int32_t nt);
  const float* block_input(const float* norm, int32_t nt);
  // Layer `layer`'s attention call over the staged batch.
  kernels::PagedAttentionParams attention_params(int layer, const ForwardBatch& batch,
                                                 PagedKvCache& cache) const;
  // Fills plans_ for the staged batch: one plan_attention per layout.
  void plan_attention(const ForwardBatch& batch, PagedKvCache& cache);
  void attention_block(int layer, const ForwardBatch& batch, PagedKvCache& cache);
  // q (and gate_, with ArchSpec::attn_output_gate) of the normed input `in`, with k and v.
  void project_qkv(const LayerWeights& w, const float* in, int32_t nt);
  // A Gated DeltaNet layer's mixer and residual (kernels/gated_delta_net.h).
  void delta_net_block(int layer, const ForwardBatch& batch);
  // A Gated DeltaNet layer's params but the batch's geometry, z and out.
  void set_layer_params(int layer, kernels::GatedDeltaNetParams& p);
  // Keeps the layer's qkv, alpha and beta rows of a speculative run (saved_).
  void save_recurrent_inputs(int layer);
  // Floats one recurrent layer's saved rows take per token: C + 2 Hv.
  int64_t saved_row_floats() const;
  void ffn_block(int layer, int32_t num_tokens);
  void activation(float* gate, const float* up, int64_t n);
  void moe_block(int layer, int32_t num_tokens);
  void shared_expert(const LayerWeights& w, const float* in, int32_t num_tokens);
  void compute_logits(const ForwardBatch& batch, const LogitsOut& out);
  // TP: the local vocabulary rows' logits gathered to rank 0 (compute_logits' TP half).
  void gather_logits(int32_t num_logits, const LogitsOut& out);
  // TP: y ([n] host floats, this rank's partial sum) all-reduced over the ranks.
  void all_reduce(float* y, int64_t n);
  // The collective's tag for the next call of this step.
  collective::CollectiveTag next_tag();
  void compute_hidden(const ForwardBatch& batch, const LogitsOut& out);
  bool compute_top_k(const LogitsOut& out, const float* logits, int32_t num_logits);
  // Flags the logits rows whose hidden state is no longer finite at checkpoint `c`
  // (0: after the embedding; 1 + 2 * layer: after its attention block; 2 + 2 * layer: after its
  // feed-forward block), then names each row's first flagged checkpoint after the step.
  void flag_nonfinite(const ForwardBatch& batch, int checkpoint);
  void name_nonfinite(int32_t num_logits, const LogitsOut& out);

  const LlamaModel& model_;
  ForwardOps& ops_;
  const ModelConfig& cfg_;
  const LlamaWeights& w_;          // the model's weights in the device's memory
  // This rank's share (tp.h; the whole model without TP): heads, kv heads, ffn rows.
  const int num_heads_;
  const int num_kv_heads_;
  const int ffn_dim_;
  collective::Collective* collective_ = nullptr;  // null without TP
  RecurrentStateCache* states_ = nullptr;          // null without recurrent layers
  uint64_t step_ = 0;                              // run() calls so far
  uint64_t digest_ = 0;                            // this step's batch digest
  uint32_t op_ = 0;                                // collectives issued this step
  Status status_;
  int64_t experts_touched_ = 0;  // summed over this run's MoE layers; -1: unknown
  int32_t moe_layers_run_ = 0;
  std::vector<float> local_logits_;   // TP: [L, vocab_pad] this rank's rows (row stride vocab_rows)
  std::vector<float> gathered_;       // TP, rank 0: [tp, L, vocab_pad]
  // Attention layouts: one per distinct layer window, in order of first appearance.
  std::vector<std::unique_ptr<AttentionPlan>> plans_;  // [num_layouts], refilled every step
  std::vector<int> layout_first_layer_;                // [num_layouts] a layer planning it
  std::vector<int> layer_layout_;  // [num_layers] index into plans_; -1: a recurrent layer
  int32_t cap_tokens_ = 0;
  int32_t cap_logits_ = 0;
  int32_t cap_hidden_ = 0;
  std::vector<std::string> nonfinite_origin_;  // [num_logits], see nonfinite_origin()
  std::vector<uint8_t> flags_host_;            // [checkpoints, num_logits]
  Scratch x_;         // [T, dim] residual stream
  Scratch xb_;        // [T, dim] normed input / projection output
  Scratch q_;         // [T, q_dim]
  Scratch k_;         // [T, kv_dim]
  Scratch v_;         // [T, kv_dim]
  Scratch att_;       // [T, q_dim]
  Scratch qg_;        // [T, 2 * q_dim] gated attention's [q; gate] rows
  Scratch gate_;      // [T, q_dim] its gate
  // Gated DeltaNet layers (C = conv_dim, Hv value heads of dv):
  Scratch ssm_qkv_;    // [T, C]
  Scratch ssm_mixed_;  // [T, C] the conv's output
  Scratch ssm_z_;      // [T, Hv * dv]
  Scratch ssm_beta_;   // [T, Hv]
  Scratch ssm_alpha_;  // [T, Hv]
  Scratch ssm_out_;    // [T, Hv * dv]
  // A speculative run's recurrent-layer inputs of its replay rows (R of them), kept for
  // commit_states: per recurrent layer [R, C] qkv, then [R, Hv] alpha and [R, Hv] beta.
  Scratch saved_;
  std::vector<int32_t> saved_rows_;  // [R] the last run's ForwardBatch::replay_rows (host)
  Scratch hin_;       // [T, dim] an MTP head's input hidden rows
  Scratch mix_;       // [T, 2 * dim] its [e; h] rows
  Scratch hb_;        // [T, ffn_dim], or [T * k, expert_ffn_dim] (MoE: per pair)
  Scratch hb2_;       // likewise
  // Mixture of experts (k = num_experts_used, E = num_experts): ExpertRouting's arrays.
  Scratch router_;         // [T, E]
  Scratch slot_expert_;    // [T, k] int32
  Scratch slot_weight_;    // [T, k]
  Scratch slot_pair_;      // [T, k] int32
  Scratch pair_token_;     // [T * k] int32
  Scratch expert_indptr_;  // [E + 1] int32
  Scratch pair_out_;       // [T * k, dim] each pair's expert output
  Scratch shexp_out_;      // [T, dim] the shared expert's output (Qwen2-MoE)
  // One per RoPE variant of the config (ModelConfig::ropes).
  static constexpr size_t kMaxRopes = 2;
  struct Rope {
    Scratch inv_freq;  // [rope_dim / 2] radians per position, after any scaling
    Scratch cos;       // [T, rope_dim / 2], times the variant's mscale
    Scratch sin;       // [T, rope_dim / 2]
  };
  Rope ropes_[kMaxRopes];
  Scratch xl_;        // [L, dim] normed rows for the output matmul
  Scratch xh_;        // [H, dim] normed hidden rows, when the device is not the host
  Scratch logits_;    // [L, vocab] when the device is not the host
  Scratch argmax_;    // [L] int32 when the device is not the host
  Scratch top_scale_;   // [L] kTopK rows' scales, when the device is not the host
  Scratch top_ids_;     // [L, kMaxDeviceTopK] int32, when the device is not the host
  Scratch top_logits_;  // [L, kMaxDeviceTopK], when the device is not the host
  Scratch flags_;     // [checkpoints, L] bytes
};

}  // namespace arbor::model
