// LlamaModel: a decoder-only transformer's config and weights, viewed in place in the mmapped
// GGUF, for every architecture of the table (arch.h); "Llama" names the family the forward grew
// from.
//
// Tensor names are llama.cpp's (docs/architectures.md lists them per architecture):
//   token_embd, output_norm, output (absent = tied to token_embd where the row allows it),
//   rope_freqs / rope_factors_long / rope_factors_short (rows with ArchSpec::rope_freqs),
//   blk.N.{attn_norm, attn_q, attn_k, attn_v | attn_qkv, attn_q_norm, attn_k_norm,
//          attn_output, post_attention_norm, ffn_norm, ffn_gate, ffn_up, ffn_down,
//          post_ffw_norm, attn_sinks}.weight, Gated DeltaNet layers' blk.N.{attn_qkv, attn_gate,
//          ssm_beta, ssm_alpha, ssm_a, ssm_conv1d, ssm_norm, ssm_out}(.weight) and ssm_dt.bias, the biases (.bias) and per-tensor scales (.scale, {1}) the row
//   allows; in mixture-of-experts layers blk.N.ffn_gate_inp.weight (the router) and the 3-D
//   blk.N.ffn_{gate,up,down}_exps.weight instead of ffn_gate / ffn_up / ffn_down, each bound as
//   one 2-D matrix per expert (a slice of the tensor; packed per expert like any matrix), and
//   with a shared expert blk.N.ffn_{gate,up,down}_shexp.weight and the 1-D
//   blk.N.ffn_gate_inp_shexp.weight (Qwen2-MoE). Fused attn_qkv ([q; k; v] rows) and Phi-3's fused ffn_up ([gate; up] rows) are bound
//   as row slices of one tensor, so the kernels see separate matrices.
// Matrices may be any type kernels::matmul_supported() accepts; norms, biases and scales must be
// F32. load() checks every tensor's dims against the config and names the tensor on mismatch,
// and refuses a file holding any tensor the architecture does not use: nothing in the file is
// silently ignored.
//
// Q8_0, Q4_0, K-quant, Q4_1 and Q5_x matrices are repacked at load for the CPU's packed kernels
// when it has them (kernels::pack_weights_into, all of them into one huge-page buffer: each
// view's `packed` points into this model) and their mmapped pages are released, so the resident
// copy is the packed one. Immutable after load; any thread may read it.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/huge_buffer.h"
#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/model_config.h"
#include "model/tp.h"

namespace arbor::model {

// A matrix and what the reference applies to its product: y = (x W^T) * scale + bias.
struct Linear {
  kernels::WeightView w;        // [rows, cols]
  const float* bias = nullptr;  // [rows] or null
  float scale = 1.0f;           // llama.cpp's per-tensor `.scale`; 1 when absent
};

struct LayerWeights {
  const float* attn_norm = nullptr;       // [dim]; null when the row has no pre-norms
  Linear q;                               // [q_dim, dim]
  Linear k;                               // [kv_dim, dim]
  Linear v;                               // [kv_dim, dim]
  const float* q_norm = nullptr;          // [head_dim] (QkNorm::kPerHead), [q_dim] (kWhole)
  const float* k_norm = nullptr;          // [head_dim] (kPerHead), [kv_dim] (kWhole)
  Linear o;                               // [dim, q_dim]
  const float* post_attn_norm = nullptr;  // [dim] or null
  const float* ffn_norm = nullptr;        // [dim]; null when the row has no pre-norms
  Linear gate;                            // [ffn_dim, dim]
  Linear up;                              // [ffn_dim, dim]
  Linear down;                            // [dim, ffn_dim]
  const float* post_ffn_norm = nullptr;   // [dim] or null
  // The canonical K segments of o and down (LlamaModel::num_segments() > 1; tp.h): column slices
  // of o.w / down.w in order, this rank's only, each packed on its own on the CPU, or copied
  // densely for a type without a packed kernel (o.w and
  // down.w are then left unpacked: the CPU forward reads the segments, a GPU the whole views).
  // Empty with one segment.
  std::vector<kernels::WeightView> o_segs;     // [segments / tp] x [dim, q_dim / segments]
  std::vector<kernels::WeightView> down_segs;  // [segments / tp] x [dim, ffn_dim / segments]
  // Mixture-of-experts layers (ModelConfig::num_experts > 0) instead of gate / up / down:
  kernels::WeightView router;                  // ffn_gate_inp [num_experts, dim]
  std::vector<kernels::WeightView> gate_exps;  // [num_experts] x [expert_ffn_dim, dim]
  std::vector<kernels::WeightView> up_exps;    // [num_experts] x [expert_ffn_dim, dim]
  std::vector<kernels::WeightView> down_exps;  // [num_experts] x [dim, expert_ffn_dim]
  // gpt-oss (ArchSpec::expert_biases): the router's bias and each expert's, or null.
  const float* router_bias = nullptr;     // ffn_gate_inp.bias [num_experts]
  const float* gate_exps_bias = nullptr;  // ffn_gate_exps.bias [num_experts, expert_ffn_dim]
  const float* up_exps_bias = nullptr;    // ffn_up_exps.bias [num_experts, expert_ffn_dim]
  const float* down_exps_bias = nullptr;  // ffn_down_exps.bias [num_experts, dim]
  // Qwen2-MoE's shared expert (ArchSpec::shared_expert), beside the routed ones; data null
  // without one. shexp_gate_inp is the 1-D F32 ffn_gate_inp_shexp.weight [dim] viewed as one
  // row: the gate's logit per token.
  Linear shexp_gate;                   // ffn_gate_shexp [shared_expert_ffn_dim, dim]
  Linear shexp_up;                     // ffn_up_shexp [shared_expert_ffn_dim, dim]
  Linear shexp_down;                   // ffn_down_shexp [dim, shared_expert_ffn_dim]
  kernels::WeightView shexp_gate_inp;  // [1, dim], F32
  // gpt-oss (ArchSpec::attn_sinks): attn_sinks.weight [num_heads], or null.
  const float* attn_sinks = nullptr;
  // A Gated DeltaNet layer (LayerSpec::recurrent; docs/qwen35.md §3.3) instead of q, k, v, o
  // and the QK-norms (Hk, Hv, dk = dv = state_size, C = conv_dim, K = conv_kernel):
  Linear ssm_qkv;                  // attn_qkv [C, dim]: q, k, v before the conv
  Linear ssm_z;                    // attn_gate [Hv * dv, dim]: the output gate's input
  kernels::WeightView ssm_beta;    // ssm_beta [Hv, dim]
  kernels::WeightView ssm_alpha;   // ssm_alpha [Hv, dim]
  const float* ssm_dt_bias = nullptr;  // ssm_dt.bias [Hv]
  const float* ssm_a = nullptr;        // ssm_a [Hv] (-exp(A_log))
  const float* ssm_conv = nullptr;     // ssm_conv1d.weight [C, K]
  const float* ssm_norm = nullptr;     // ssm_norm.weight [dv]
  Linear ssm_out;                  // ssm_out [dim, Hv * dv]
};

// A multi-token-prediction (NextN) head's input mix (docs/qwen35.md §8): before its one layer,
// x = eh_proj [rms_norm(embed(token)) * enorm ; rms_norm(h_prev) * hnorm], h_prev the target's
// final hidden state at the previous position (ForwardBatch::input_hidden).
struct MtpInput {
  Linear eh_proj;                 // [dim, 2 * dim]
  const float* enorm = nullptr;   // [dim]
  const float* hnorm = nullptr;   // [dim]
};

struct LlamaWeights {
  kernels::WeightView token_embd;    // [vocab, dim]
  std::vector<LayerWeights> layers;  // [num_layers]
  const float* output_norm = nullptr;  // [dim]
  Linear output;                     // [vocab, dim]; w equals token_embd when tied
  bool tied_output = false;
  // [rope_dim / 2] or null: the divisors of the full-attention layers' RoPE frequencies
  // (rope_freqs.weight, or Phi-3's rope_factors_long/short chosen for the serving context).
  const float* rope_freqs = nullptr;
  // [classes, dim] (cls.output.weight; classes = classifier.output_labels' count, 1 without
  // them, as llama.cpp) or data null: the rank head (ArchSpec::rank_head). Read on the host by
  // the executor's pooler, so for_each_weight leaves it out (never packed or uploaded).
  kernels::WeightView cls_out;
  // The file's MTP block (ModelLoadOptions::load_mtp; empty otherwise): blk.{num_layers}, a
  // full-attention layer, with its nextn.* tensors; the head's own norm / classifier / embedding
  // where the file has them (data null: output_norm, output, token_embd).
  std::vector<LayerWeights> mtp_layers;  // [0 or 1]
  MtpInput mtp_input;                    // in the target model: the block's; in the MTP view too
  const float* mtp_head_norm = nullptr;  // nextn.shared_head_norm [dim]
  Linear mtp_head;                       // nextn.shared_head_head [vocab, dim]
  kernels::WeightView mtp_embed;         // nextn.embed_tokens [vocab, dim]
  // An MTP view (LlamaModel::mtp_model): layers = {the MTP block}, and the forward mixes
  // mtp_input before it.
  bool is_mtp_view = false;
};

// Every matrix and F32 vector of a LlamaWeights, named, in a fixed order (token_embd, per layer
// in LayerWeights order, output_norm, output, rope_freqs), absent ones skipped: the one walk that
// packing, device uploads and tests share. Vector lengths are in floats.
struct MatrixRef {
  // GGUF name (a row slice of a fused tensor: the unfused tensor's name; expert e of a 3-D
  // tensor: its name + "[e]")
  std::string name;
  kernels::WeightView* w;
};
struct VectorRef {
  std::string name;
  const float** v;
  int64_t n;
};
void for_each_weight(LlamaWeights& w, const ModelConfig& c,
                     const std::function<void(const MatrixRef&)>& matrix,
                     const std::function<void(const VectorRef&)>& vector);

// Rows `rows` of `w` as floats, row-major [rows.size(), w.cols], decoded from the file's
// encoding (never the packed copy; a released page is read back from the file). Errors: a type
// the reference codecs cannot decode, a row outside [0, w.rows). For small host-side heads (the
// rank head, the yes/no rows of a reranker's classifier).
Result<std::vector<float>> dequantize_rows(const kernels::WeightView& w,
                                           std::span<const int64_t> rows);

struct ModelLoadOptions {
  // Repack matrices for the CPU's packed kernels (see above). A model that runs on a GPU skips
  // it: the device reads the GGUF encoding from the mapping.
  bool pack_for_cpu = true;
  // The longest context the model will serve (0: the file's context_length). Phi-3's LongRoPE
  // uses its long factors when this exceeds the original context, as llama.cpp does.
  int64_t serving_context = 0;
  // Tensor parallelism (tp.h): load rank tp_rank's share of a model cut tp_size ways (its rows
  // and columns of the split matrices; only those are packed, so only those stay resident).
  // tp_size 1: the whole model. An unsupported degree is the error check_tp() gives.
  int tp_rank = 0;
  int tp_size = 1;
  // The most canonical segments (tp.h) o and down are cut into: kMaxSegments normally; 1 gives
  // the single f32 matmul over K of a file without segments (tests that compare the dense FFN
  // with a path that has no segments, e.g. one expert of a mixture). TP needs the default.
  int max_segments = kMaxSegments;
  // Bind the file's multi-token-prediction block (nextn_predict_layers = 1; packed like the
  // trunk) for mtp_model(), instead of skipping it. A file without one, or with more, is an error.
  bool load_mtp = false;
};

class LlamaModel {
 public:
  // Opens and maps `path`, reads the config and binds every weight.
  static Result<std::unique_ptr<LlamaModel>> load(const std::string& path,
                                                  const ModelLoadOptions& options = {});
  // Same, from an already opened file (taken over).
  static Result<std::unique_ptr<LlamaModel>> from_file(gguf::GgufFile file,
                                                       const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const gguf::GgufFile& file() const { return file_; }
  // The canonical K segment count of o and down (tp.h), and this rank's share of the model
  // (weights() holds only that share; config() describes the whole model).
  int num_segments() const { return num_segments_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  const TpShape& tp_shape() const { return tp_shape_; }
  // Bytes of weights this process holds for the forward: packed copies plus the mapped views it
  // reads (its slices; token_embd counted whole, one row per token is read).
  uint64_t resident_weight_bytes() const;
  // The model's MTP head as a model of its own (loaded with load_mtp): one full-attention layer
  // (the MTP block) after the input mix, the head's norm and classifier, the config's other
  // fields the target's; its weights point into this model, which must outlive it. A
  // ModelRunner over it keeps the head's own one-layer KV cache. Errors: not loaded with
  // load_mtp, tensor parallelism.
  Result<std::unique_ptr<LlamaModel>> mtp_model() const;

 private:
  LlamaModel(gguf::GgufFile file, ModelConfig config)
      : file_(std::move(file)), config_(std::move(config)) {}
  Status bind_weights(const ModelLoadOptions& options);
  Status check_cheap_weights() const;
  // Cuts the weights to this rank's share (tp_size > 1) and o / down into their segments.
  Status shard_and_segment(const ModelLoadOptions& options);
  // Packs every matrix matmul() reads that has a packed kernel on this CPU, into packed_.
  Status pack_matrices();

  // Every packed matrix, each at a 64-byte aligned offset, in transparent huge pages where the
  // kernel grants them (base/huge_buffer.h): decode streams the whole of it every token.
  HugePageBuffer packed_;
  // Dense copies of the segments of types without a packed kernel (pack_matrices).
  std::vector<std::vector<uint8_t>> segment_copies_;
  gguf::GgufFile file_;
  ModelConfig config_;
  LlamaWeights weights_;
  int num_segments_ = 1;
  int tp_rank_ = 0;
  int tp_size_ = 1;
  TpShape tp_shape_;
};

}  // namespace arbor::model
