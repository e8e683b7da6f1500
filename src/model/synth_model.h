// Random-weight models of real shapes for every architecture arbor runs: the library half of
// `arbor synth` (and of the architecture tests, which build tiny ones).
//
// A SynthShape is a row of hyperparameters plus the architecture's own keys (sliding window,
// soft-caps, RoPE scaling, Granite's multipliers, ...). plan_synth_tensors() lists the tensors
// llama.cpp's converter writes for that architecture (with the names the architecture table,
// model/arch.h, binds), and set_synth_metadata() the keys. Weights: every row is drawn from its
// own generator seeded by (seed, tensor index, row), uniform with standard deviation
// 1 / sqrt(row length) (fan-in) so activations stay O(1) through the layers; norm weights are 1
// for llama / qwen2 (as before) and 1 + U(-0.2, 0.2) for the other architectures, so a test sees
// a norm applied to the wrong rows; biases have std 0.02. The bytes depend only on the shape,
// type and seed, not on the thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_type.h"
#include "gguf/gguf.h"
#include "kernels/thread_pool.h"

namespace arbor::model {

struct SynthShape {
  std::string name{};
  std::string arch = "llama";  // general.architecture (a row of model/arch.h)
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, context = 0;
  int64_t head_dim = 0;  // 0: dim / heads (written as attention.key_length when it differs)
  int64_t rope_dim = 0;  // 0: head_dim
  int64_t vocab = 0;     // 0: the tokenizer's size; else padded up to this (Qwen's 151936)
  bool tied = false;
  bool qkv_bias = false;
  bool fused_qkv = false;  // one attn_qkv tensor instead of attn_q/k/v (Phi-3's files)
  bool out_bias = false;   // attn_output.bias (llama, mistral3, granite)
  bool ffn_bias = false;   // ffn_gate/up/down.bias (llama, mistral3, granite)
  bool rope_freqs = false;  // a rope_freqs.weight divisor table (llama, mistral3, granite)
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  // Sliding window (gemma2/gemma3/olmo2): attention.sliding_window, _pattern, freq_base_swa.
  int64_t window = 0;
  int64_t swa_pattern = 0;  // 0: not written (the architecture's default)
  float rope_theta_swa = 0.0f;  // 0: not written
  // RoPE scaling: "" (none written), "linear", "yarn" (mistral3 writes its betas and
  // yarn_log_multiplier), "longrope" (phi3: rope_factors_long/short tensors + attn_factor).
  std::string rope_scaling{};
  float rope_factor = 0.0f;
  int64_t rope_original_context = 0;
  float rope_attn_factor = 0.0f;  // 0: not written
  float yarn_beta_fast = 0.0f, yarn_beta_slow = 0.0f, yarn_log_mul = 0.0f;
  float attn_temp_scale = 0.0f;  // mistral3 attention.temperature_scale
  float attn_softcap = 0.0f, final_softcap = 0.0f;  // 0: not written
  // granite: 0: not written (logit_scale is required: 1 when 0).
  float embedding_scale = 0.0f, residual_scale = 0.0f, logit_scale = 0.0f, attention_scale = 0.0f;
  // Embedding and reranking files: <arch>.pooling_type (llama.cpp's numbers; -1: not written)
  // and a rank head of this many classes (rows with ArchSpec::rank_head): cls.output.weight
  // [classes, dim] with classifier.output_labels ("yes", "no" for 2, as the Qwen3-Reranker
  // converter writes; "label_i" otherwise). 0: none.
  int64_t pooling_type = -1;
  int64_t rank_classes = 0;
  // Mixture of experts (qwen3moe always, llama optionally: Mixtral): expert_count,
  // expert_used_count and (qwen3moe) expert_feed_forward_length; the router ffn_gate_inp stays
  // F32 (llama.cpp's quantizer keeps it) and the experts' 3-D tensors take the matrix type.
  // expert_ffn 0: ffn (Mixtral's experts are feed_forward_length wide).
  int64_t experts = 0, experts_used = 0, expert_ffn = 0;
  // qwen2moe's shared expert: expert_shared_feed_forward_length (0: ffn); its gate
  // ffn_gate_inp_shexp stays F32 (1-D, as llama.cpp's quantizer leaves it).
  int64_t shared_ffn = 0;
  // qwen35 / qwen35moe (docs/qwen35.md): Gated DeltaNet layers of ssm_k_heads key heads and
  // ssm_v_heads value heads of ssm_state dims with a conv of ssm_conv taps, every layer but each
  // full_attention_interval-th; the attention layers' q carries its gate. ssm_state 0: none.
  int64_t ssm_state = 0, ssm_k_heads = 0, ssm_v_heads = 0, ssm_conv = 4;
  int64_t full_attention_interval = 4;
  // Multi-token-prediction blocks after the trunk (<arch>.nextn_predict_layers; qwen35 /
  // qwen35moe): blk.{layers + i} is a full-attention layer plus nextn.eh_proj {2 dim, dim},
  // nextn.enorm, nextn.hnorm and nextn.shared_head_norm, as llama.cpp's converter writes them;
  // block_count counts them.
  int64_t nextn = 0;
  // A constructed file for speculation runs (not a real model's weights): every matrix that
  // writes into the trunk's residual stream (attn_output, ssm_out, ffn_down and the experts'
  // and shared expert's down) has its stddev multiplied by residual_damp, so the trunk's
  // next-token function stays close to a function of the current token alone; with mtp_echo
  // the MTP block computes that function too (eh_proj = [I | 0], its attention and FFN outputs
  // zero, enorm ones, no shared_head_norm): its drafts agree with the target as often as the
  // damped layers leave the argmax alone. mtp_echo needs an untied classifier (a tied one makes
  // that function the identity: the text repeats one token).
  float residual_damp = 1.0f;
  bool mtp_echo = false;
};

// Real shapes: tinyllama-1.1b, stories110m, stories15m, qwen2.5-0.5b, qwen3-0.6b,
// qwen3-30b-a3b (128 experts, 8 per token), gemma3-270m, gemma3-1b, gemma2-2b, ministral3-3b,
// phi4-mini, smollm3-3b, olmo2-1b, granite3.3-2b, mixtral-8x7b; the test shapes tiny-qwen3moe
// (dim 256, 4 layers, 16 experts of 64, top-4), tiny-qwen2moe (8 experts of 64, top-4, a
// shared expert of 256), tiny-mixtral (llama, 8 experts of 512, top-2), tiny-qwen35 and
// tiny-qwen35moe (3 Gated DeltaNet layers of 2 key / 4 value heads, then gated attention);
// qwen3.5-2b, qwen3.5-35b-a3b (the Qwen3.5 shapes with their one MTP block);
// and "custom" (dims from flags).
const std::vector<SynthShape>& synth_presets();
// The preset `name`, or null.
const SynthShape* find_synth_preset(const std::string& name);
// The real shape `arbor synth --arch ARCH` writes: the architecture's first preset.
const SynthShape* default_preset_for_arch(const std::string& arch);
// `shape` with the architecture-specific fields (window, soft-caps, scaling, fused tensors,
// Granite's multipliers, ...) of `arch`'s default preset, its dims kept.
SynthShape with_arch(const SynthShape& shape, const std::string& arch);

// Checks the shape against the architecture table and `type`'s block size (messages name the
// flag or field).
Status validate_synth_shape(const SynthShape& s, gguf::GgmlType type);

struct SynthTensor {
  std::string name{};
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row length
  gguf::GgmlType type = gguf::GgmlType::kF32;
  // kDecay: in [-0.4, -0.1] (a Gated DeltaNet's ssm_a, -exp(A_log): decays of 0.3 .. 0.99 per
  // token with the synthetic gates).
  // kZero: zeros; kEye: row r is 1 at column r, 0 elsewhere (mtp_echo's eh_proj).
  enum class Init : uint8_t {
    kUniform, kOnes, kNearOne, kFactors, kDecay, kZero, kEye
  } init = Init::kUniform;
  float stddev = 0.0f;  // kUniform
};

// The tensors, in llama.cpp's order (token_embd, per layer, output_norm, output).
std::vector<SynthTensor> plan_synth_tensors(const SynthShape& s, gguf::GgmlType type,
                                            int64_t vocab);
// general.* and <arch>.* keys (not the tokenizer's).
void set_synth_metadata(gguf::GgufWriter& w, const SynthShape& s, gguf::GgmlType type,
                        uint64_t seed, int64_t vocab);
// One tensor's bytes in its type, rows in parallel on `pool`. `index` is its position in the
// plan (part of every row's seed).
std::vector<uint8_t> make_synth_tensor(const SynthTensor& t, uint64_t seed, size_t index,
                                       kernels::ThreadPool& pool);

// A whole model: metadata, `tokenizer_keys` (tokenizer.* from a GGUF or tokenizer.json, padded
// to `vocab` entries by the caller) and every tensor. For tests and `arbor synth`.
Result<gguf::GgufWriter> synth_model(const SynthShape& s, gguf::GgmlType type, uint64_t seed,
                                     int64_t vocab, std::vector<gguf::KeyValue> tokenizer_keys,
                                     kernels::ThreadPool& pool);

}  // namespace arbor::model
