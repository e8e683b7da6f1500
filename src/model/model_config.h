// ModelConfig: the hyperparameters of a decoder-only transformer, read from GGUF metadata as
// llama.cpp (de3ff81) reads them for the architecture's row of the table (arch.h).
//
// Keys read, with <a> the architecture (docs/architectures.md has the whole list per row):
//   required: <a>.embedding_length, <a>.feed_forward_length, <a>.block_count,
//             <a>.attention.head_count, <a>.attention.layer_norm_rms_epsilon,
//             <a>.context_length, tensor token_embd.weight (vocab size = its dims[1])
//   optional: <a>.attention.head_count_kv (default head_count), <a>.attention.key_length and
//             .value_length (head_dim; default embedding_length / head_count; must be equal),
//             <a>.rope.dimension_count (default head_dim), <a>.rope.freq_base (default 10000),
//             <a>.rope.scaling.{type (none | linear | yarn | longrope | llama3), factor,
//             attn_factor, original_context_length, low_freq_factor, high_freq_factor},
//             <a>.attention.sliding_window[_pattern], <a>.rope.freq_base_swa, and the row's own
//             keys (soft-caps, Granite's multipliers, Mistral 3's temperature and YaRN betas),
//             <a>.pooling_type and <a>.classifier.output_labels (embedding and rank files).
//   experts (ArchSpec::experts): <a>.expert_count, <a>.expert_used_count (required with
//             experts), <a>.expert_feed_forward_length (Qwen3-MoE; default
//             feed_forward_length / expert_used_count; Mixtral's experts are
//             feed_forward_length wide).
// A key arbor cannot honour (per-layer head counts, expert groups, a different head size or
// rotary size for sliding layers, ...) is refused by name: nothing that changes the function is
// ignored. A missing required key or an unsupported value is an error that names the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "model/arch.h"

namespace arbor::model {

enum class RopeScaling : uint8_t {
  kNone,
  kLinear,    // positions (angles) times freq_scale
  kYarn,      // YaRN: per-pair blend of interpolated and extrapolated angles, magnitude mscale
  kLongRope,  // per-pair divisors (rope_factors_long/short.weight) and attn_factor (Phi-3)
  kLlama3,    // Llama 3 frequency bands from keys (arbor's own; llama.cpp uses rope_freqs)
};

// One RoPE variant. The angle of pair i at position p is p * inv_freq[i] with
//   inv_freq[i] = theta^(-2i / rope_dim) / factors[i] (factors: a divisor table or 1),
// then scaled per `scaling`; cos and sin are multiplied by mscale. See model/rope.h.
struct RopeVariant {
  float theta = 10000.0f;
  RopeScaling scaling = RopeScaling::kNone;
  float freq_scale = 1.0f;  // 1 / rope.scaling.factor (kLinear, kYarn)
  // YaRN: the correction band of llama.cpp's ggml_rope_yarn_corr_dims.
  int original_context = 0;  // rope.scaling.original_context_length (default context_length)
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float mscale = 1.0f;  // cos/sin magnitude: YaRN's attention factor times rope.scaling.attn_factor
  // kLlama3.
  float llama3_factor = 0.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  // Divide by the model's frequency-factor table (rope_freqs, or rope_factors_long/short).
  bool use_freq_factors = false;
};

// What differs between layers.
struct LayerSpec {
  int window = 0;  // 0: full attention; W > 0: position p sees keys at p - W + 1 .. p
  int rope = 0;    // index into ModelConfig::ropes; -1: no RoPE (NoPE layer)
  // A Gated DeltaNet layer (ArchSpec::gated_delta_net): no attention and no KV; its state is
  // per sequence (kernels/gated_delta_net.h). window and rope are then unused.
  bool recurrent = false;
};

// The Gated DeltaNet layers' shape (docs/qwen35.md §2): <a>.ssm.conv_kernel, .state_size (the
// key and value head size), .group_count (key heads), .time_step_rank (value heads) and
// .inner_size (value heads x state_size, checked).
struct SsmConfig {
  int conv_kernel = 0;  // K
  int state_size = 0;   // dk = dv
  int num_k_heads = 0;  // Hk
  int num_v_heads = 0;  // Hv, a multiple of Hk
  int key_dim() const { return num_k_heads * state_size; }
  int value_dim() const { return num_v_heads * state_size; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels of attn_qkv
  // Floats of one sequence's state in one layer: the conv's K-1 inputs per channel and the
  // recurrent state (Hv matrices of dk x dv).
  int64_t conv_state_floats() const { return int64_t{conv_dim()} * (conv_kernel - 1); }
  int64_t ssm_state_floats() const {
    return int64_t{num_v_heads} * state_size * state_size;
  }
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // general.architecture
  const ArchSpec* spec = nullptr;  // the row of the table
  int dim = 0;            // embedding_length
  int ffn_dim = 0;        // feed_forward_length
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rms_eps = 1e-5f;

  int rope_dim = 0;        // leading dims of each head that RoPE rotates (<= head_dim)
  bool rope_neox = false;  // true: pairs (d, d + rope_dim/2); false: pairs (2i, 2i+1)
  // [1 or 2]: ropes[0] is the full-attention layers' variant; ropes[1], when present, the
  // sliding layers' (their own base, no scaling).
  std::vector<RopeVariant> ropes;
  // Phi-3 LongRoPE: rope_factors_long when the serving context exceeds the original context,
  // else rope_factors_short (llama.cpp's get_rope_factors); decided by the forward.
  int longrope_original_context = 0;
  std::vector<LayerSpec> layers;  // [num_layers]

  float embed_scale = 1.0f;      // x = embedding * embed_scale
  float attn_scale = 0.0f;       // score = q.k * attn_scale
  float attn_softcap = 0.0f;     // > 0: score = cap * tanh(score / cap)
  float residual_scale = 1.0f;   // each block's output times this before the residual add
  float logit_scale = 1.0f;      // logits times this (Granite: 1 / logit_scale key)
  float final_softcap = 0.0f;    // > 0: logit = cap * tanh(logit / cap), after logit_scale
  // Mistral 3 (Llama 4 scaling): q *= 1 + temp_scale * log(1 + floor(pos / temp_floor)).
  float attn_temp_scale = 0.0f;
  int attn_temp_floor = 0;

  // Embedding and reranking files: <a>.pooling_type as llama.cpp numbers it (-1 unspecified,
  // 0 none, 1 mean, 2 cls, 3 last, 4 rank; step::PoolingType), and
  // <a>.classifier.output_labels, the rank head's classes (one row of cls.output.weight each;
  // Qwen3-Reranker files: "yes", "no").
  int pooling_type = -1;
  std::vector<std::string> classifier_labels;

  // Mixture of experts (num_experts > 0; 0: dense FFN blocks). Every layer's FFN is
  // num_experts experts of expert_ffn_dim, num_experts_used of them per token, chosen and
  // weighted by the router (kernels::route_softmax_top_k: softmax, top-k, renormalised, as
  // llama.cpp runs qwen3moe and Mixtral; not renormalised on rows with
  // ArchSpec::expert_weights_norm false, Qwen2-MoE).
  int num_experts = 0;
  int num_experts_used = 0;
  int expert_ffn_dim = 0;
  // A shared expert every token runs beside the routed ones (ArchSpec::shared_expert): an FFN
  // of this length whose output is added under a per-token sigmoid gate; 0: none.
  int shared_expert_ffn_dim = 0;

  // Gated DeltaNet layers (LayerSpec::recurrent), when the row has them (num_k_heads > 0).
  SsmConfig ssm;
  // Multi-token-prediction blocks after the trunk (<a>.nextn_predict_layers): blk.num_layers ..
  // blk.num_layers + num_nextn_layers - 1 in the file; the trunk never runs them (an MTP head,
  // LlamaModel::mtp_model, does: --spec mtp); <a>.block_count counts them, num_layers does not.
  int num_nextn_layers = 0;
  // attn_q holds [q; gate] per head (ArchSpec::attn_output_gate).
  bool attn_output_gate = false;

  bool is_moe() const { return num_experts > 0; }
  bool has_recurrent_layers() const { return ssm.num_k_heads > 0; }
  int num_recurrent_layers() const;
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // Layer l's sliding window (0: full attention).
  int layer_window(int layer) const { return layers[layer].window; }
  bool has_sliding_layers() const;

  static Result<ModelConfig> from_gguf(const gguf::GgufFile& file);
  // "qwen3: dim 64, ffn 172, 5 layers, 8 heads (4 kv, head_dim 8), vocab 512, ..."
  std::string summary() const;
};

}  // namespace arbor::model
