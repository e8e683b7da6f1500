#include "model/llama_model.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "base/log.h"
#include "base/mapped_file.h"
#include "base/progress.h"
#include "base/status.h"
#include "gguf/quants.h"
#include "model/weight_check.h"

namespace arbor::model {
namespace {

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

// Finds tensors by name, checks their dims and types, and remembers which ones the architecture
// used, so that check_all_used() can refuse the rest.
class Binder {
 public:
  explicit Binder(const gguf::GgufFile& f) : f_(f) {}

  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }
  const std::string& file_name() const { return f_.name(); }

  // `name` with ggml-order `dims`; null when absent and not required.
  Result<const gguf::TensorInfo*> find(const std::string& name, const std::vector<int64_t>& dims,
                                       bool required) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) {
      if (required) return not_found(f_.name(), ": tensor ", name, " is missing");
      return static_cast<const gguf::TensorInfo*>(nullptr);
    }
    if (t->dims != dims) {
      return invalid_argument(f_.name(), ": tensor ", name, " has dims ", dims_string(t->dims),
                              ", expected ", dims_string(dims), " from the model config");
    }
    used_.insert(name);
    return t;
  }

  // A matrix [rows, cols] (ggml dims [cols, rows]) of a type matmul supports.
  Result<kernels::WeightView> matrix(const std::string& name, int64_t rows, int64_t cols) {
    ARBOR_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(name, {cols, rows}, true));
    if (!kernels::matmul_supported(t->type)) {
      return unimplemented(f_.name(), ": tensor ", name, " has type ",
                           gguf::ggml_type_name(t->type),
                           ", which the matmul kernels do not support");
    }
    return kernels::make_weight_view(t->type, t->data, rows, cols);
  }

  // A 3-D tensor of `experts` matrices [rows, cols] (ggml dims [cols, rows, experts]) of a type
  // matmul supports, as one view per expert.
  Result<std::vector<kernels::WeightView>> experts(const std::string& name, int64_t experts,
                                                   int64_t rows, int64_t cols) {
    ARBOR_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(name, {cols, rows, experts}, true));
    if (!kernels::matmul_supported(t->type)) {
      return unimplemented(f_.name(), ": tensor ", name, " has type ",
                           gguf::ggml_type_name(t->type),
                           ", which the matmul kernels do not support");
    }
    std::vector<kernels::WeightView> views;
    const size_t bytes = kernels::weight_row_bytes(t->type, cols) * rows;
    for (int64_t e = 0; e < experts; ++e) {
      views.push_back(kernels::make_weight_view(
          t->type, static_cast<const uint8_t*>(t->data) + e * bytes, rows, cols));
    }
    return views;
  }

  // An F32 vector [n] (or, with `rows`, an F32 matrix [rows, n]: ggml dims [n, rows]); null
  // when absent and not required.
  Result<const float*> vector(const std::string& name, int64_t n, bool required,
                              int64_t rows = 0) {
    const std::vector<int64_t> dims = rows > 0 ? std::vector<int64_t>{n, rows}
                                               : std::vector<int64_t>{n};
    ARBOR_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(name, dims, required));
    if (t == nullptr) return static_cast<const float*>(nullptr);
    if (t->type != gguf::GgmlType::kF32) {
      return unimplemented(f_.name(), ": tensor ", name, " has type ",
                           gguf::ggml_type_name(t->type), ", expected f32");
    }
    return reinterpret_cast<const float*>(t->data);
  }

  // `base`.scale ({1}, F32) when present and `allowed`, else 1.
  Result<float> scale(const std::string& base, bool allowed) {
    const std::string name = base + ".scale";
    if (!allowed || !has(name)) return 1.0f;
    ARBOR_ASSIGN_OR_RETURN(const float* s, vector(name, 1, true));
    return *s;
  }

  // Marks every tensor whose name starts with `prefix` as used (parts of the file the model
  // knows and does not run). Returns how many.
  int skip_prefix(const std::string& prefix) {
    int n = 0;
    for (const gguf::TensorInfo& t : f_.tensors()) {
      if (t.name.starts_with(prefix)) used_.insert(t.name), ++n;
    }
    return n;
  }

  // Every tensor of the file was used, or kUnimplemented naming the first that was not.
  Status check_all_used(const std::string& arch) const {
    for (const gguf::TensorInfo& t : f_.tensors()) {
      if (used_.contains(t.name)) continue;
      return unimplemented(f_.name(), ": tensor ", t.name, " is not used by architecture ", arch,
                           " as arbor (and llama.cpp) runs it; refusing the file rather than "
                           "computing a different function from the one it describes");
    }
    return ok_status();
  }

 private:
  const gguf::GgufFile& f_;
  std::unordered_set<std::string> used_;
};

// Rows [r0, r0 + n) of `w` as a matrix of their own.
kernels::WeightView row_slice(const kernels::WeightView& w, int64_t r0, int64_t n) {
  kernels::WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + r0 * w.row_stride;
  s.rows = n;
  return s;
}

// `base`.weight [rows, cols] with its bias (optional unless bias_required) and scale.
Result<Linear> linear(Binder& b, const std::string& base, int64_t rows, int64_t cols,
                      bool bias_allowed, bool scale_allowed, bool bias_required = false) {
  Linear l;
  ARBOR_ASSIGN_OR_RETURN(l.w, b.matrix(base + ".weight", rows, cols));
  if (bias_allowed) {
    ARBOR_ASSIGN_OR_RETURN(l.bias, b.vector(base + ".bias", rows, bias_required));
  }
  ARBOR_ASSIGN_OR_RETURN(l.scale, b.scale(base, scale_allowed));
  return l;
}

// q, k and v: separate tensors or one fused attn_qkv ([q; k; v] rows; its bias likewise, or
// separate q/k/v biases beside it), as llama.cpp's create_tensor_qkv accepts them.
Status bind_qkv(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights& w) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  const bool need_bias = c.spec->qkv_bias_required;
  if (b.has(p + "attn_qkv.weight")) {
    ARBOR_ASSIGN_OR_RETURN(Linear qkv, linear(b, p + "attn_qkv", qd + 2 * kvd, c.dim, true, true));
    w.q = {row_slice(qkv.w, 0, qd), nullptr, qkv.scale};
    w.k = {row_slice(qkv.w, qd, kvd), nullptr, qkv.scale};
    w.v = {row_slice(qkv.w, qd + kvd, kvd), nullptr, qkv.scale};
    if (qkv.bias != nullptr) {
      w.q.bias = qkv.bias;
      w.k.bias = qkv.bias + qd;
      w.v.bias = qkv.bias + qd + kvd;
      return ok_status();
    }
    ARBOR_ASSIGN_OR_RETURN(w.q.bias, b.vector(p + "attn_q.bias", qd, need_bias));
    ARBOR_ASSIGN_OR_RETURN(w.k.bias, b.vector(p + "attn_k.bias", kvd, need_bias));
    ARBOR_ASSIGN_OR_RETURN(w.v.bias, b.vector(p + "attn_v.bias", kvd, need_bias));
    return ok_status();
  }
  ARBOR_ASSIGN_OR_RETURN(w.q, linear(b, p + "attn_q", qd, c.dim, true, true, need_bias));
  ARBOR_ASSIGN_OR_RETURN(w.k, linear(b, p + "attn_k", kvd, c.dim, true, true, need_bias));
  ARBOR_ASSIGN_OR_RETURN(w.v, linear(b, p + "attn_v", kvd, c.dim, true, true, need_bias));
  return ok_status();
}

// A mixture-of-experts FFN: the router and the experts' 3-D tensors, with the router's and the
// experts' biases where the row has them (gpt-oss; no scales: a file with per-expert .scale
// tensors, or biases on another row, is refused as holding unused tensors).
Status bind_experts(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights& w) {
  const int64_t n = c.num_experts, ffn = c.expert_ffn_dim;
  ARBOR_ASSIGN_OR_RETURN(w.router, b.matrix(p + "ffn_gate_inp.weight", n, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.gate_exps, b.experts(p + "ffn_gate_exps.weight", n, ffn, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.up_exps, b.experts(p + "ffn_up_exps.weight", n, ffn, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.down_exps, b.experts(p + "ffn_down_exps.weight", n, c.dim, ffn));
  if (c.spec->shared_expert) {
    const int64_t sffn = c.shared_expert_ffn_dim;
    ARBOR_ASSIGN_OR_RETURN(w.shexp_gate, linear(b, p + "ffn_gate_shexp", sffn, c.dim, false, false));
    ARBOR_ASSIGN_OR_RETURN(w.shexp_up, linear(b, p + "ffn_up_shexp", sffn, c.dim, false, false));
    ARBOR_ASSIGN_OR_RETURN(w.shexp_down, linear(b, p + "ffn_down_shexp", c.dim, sffn, false, false));
    ARBOR_ASSIGN_OR_RETURN(const float* gate, b.vector(p + "ffn_gate_inp_shexp.weight", c.dim, true));
    w.shexp_gate_inp = kernels::make_weight_view(gguf::GgmlType::kF32, gate, 1, c.dim);
  }
  if (!c.spec->expert_biases) return ok_status();
  ARBOR_ASSIGN_OR_RETURN(w.router_bias, b.vector(p + "ffn_gate_inp.bias", n, true));
  ARBOR_ASSIGN_OR_RETURN(w.gate_exps_bias, b.vector(p + "ffn_gate_exps.bias", ffn, true, n));
  ARBOR_ASSIGN_OR_RETURN(w.up_exps_bias, b.vector(p + "ffn_up_exps.bias", ffn, true, n));
  ARBOR_ASSIGN_OR_RETURN(w.down_exps_bias, b.vector(p + "ffn_down_exps.bias", c.dim, true, n));
  return ok_status();
}

Status bind_ffn(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights& w) {
  const ArchSpec& s = *c.spec;
  if (c.is_moe()) return bind_experts(b, c, p, w);
  if (s.fused_gate_up) {  // Phi-3: ffn_up is [gate; up]; llama.cpp applies no scale or bias
    ARBOR_ASSIGN_OR_RETURN(Linear up, linear(b, p + "ffn_up", 2 * int64_t{c.ffn_dim}, c.dim,
                                             false, false));
    w.gate = {row_slice(up.w, 0, c.ffn_dim)};
    w.up = {row_slice(up.w, c.ffn_dim, c.ffn_dim)};
  } else {
    ARBOR_ASSIGN_OR_RETURN(w.gate,
                           linear(b, p + "ffn_gate", c.ffn_dim, c.dim, s.ffn_bias, s.ffn_scales));
    ARBOR_ASSIGN_OR_RETURN(w.up,
                           linear(b, p + "ffn_up", c.ffn_dim, c.dim, s.ffn_bias, s.ffn_scales));
  }
  ARBOR_ASSIGN_OR_RETURN(w.down,
                         linear(b, p + "ffn_down", c.dim, c.ffn_dim, s.ffn_bias, s.ffn_scales));
  return ok_status();
}

// A Gated DeltaNet layer's mixer (docs/qwen35.md §3.3).
Status bind_gated_delta_net(Binder& b, const ModelConfig& c, const std::string& p,
                            LayerWeights& w) {
  const SsmConfig& s = c.ssm;
  ARBOR_ASSIGN_OR_RETURN(w.ssm_qkv, linear(b, p + "attn_qkv", s.conv_dim(), c.dim, false, false));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_z, linear(b, p + "attn_gate", s.value_dim(), c.dim, false, false));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_beta, b.matrix(p + "ssm_beta.weight", s.num_v_heads, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_alpha, b.matrix(p + "ssm_alpha.weight", s.num_v_heads, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_dt_bias, b.vector(p + "ssm_dt.bias", s.num_v_heads, true));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_a, b.vector(p + "ssm_a", s.num_v_heads, true));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_conv,
                         b.vector(p + "ssm_conv1d.weight", s.conv_kernel, true, s.conv_dim()));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_norm, b.vector(p + "ssm_norm.weight", s.state_size, true));
  ARBOR_ASSIGN_OR_RETURN(w.ssm_out, linear(b, p + "ssm_out", c.dim, s.value_dim(), false, false));
  return ok_status();
}

// Layer `l` of the file (an MTP block: l >= num_layers, a full-attention layer).
Status bind_layer(Binder& b, const ModelConfig& c, int l, LayerWeights& w) {
  const ArchSpec& s = *c.spec;
  const std::string p = str_cat("blk.", l, ".");
  const bool recurrent = l < c.num_layers && c.layers[l].recurrent;
  if (s.pre_norms) {
    ARBOR_ASSIGN_OR_RETURN(w.attn_norm, b.vector(p + "attn_norm.weight", c.dim, true));
    ARBOR_ASSIGN_OR_RETURN(w.ffn_norm, b.vector(str_cat(p, s.ffn_norm_name, ".weight"), c.dim,
                                                true));
  }
  if (recurrent) {
    ARBOR_RETURN_IF_ERROR(bind_gated_delta_net(b, c, p, w));
    return bind_ffn(b, c, p, w);
  }
  if (c.attn_output_gate) {  // attn_q: [q; gate] per head, 2 x q_dim rows; no biases
    ARBOR_ASSIGN_OR_RETURN(w.q, linear(b, p + "attn_q", 2 * int64_t{c.q_dim()}, c.dim, false,
                                       false));
    ARBOR_ASSIGN_OR_RETURN(w.k, linear(b, p + "attn_k", c.kv_dim(), c.dim, false, false));
    ARBOR_ASSIGN_OR_RETURN(w.v, linear(b, p + "attn_v", c.kv_dim(), c.dim, false, false));
  } else {
    ARBOR_RETURN_IF_ERROR(bind_qkv(b, c, p, w));
  }
  if (s.attn_sinks) {
    ARBOR_ASSIGN_OR_RETURN(w.attn_sinks, b.vector(p + "attn_sinks.weight", c.num_heads, true));
  }
  if (s.qk_norm != QkNorm::kNone) {
    const bool whole = s.qk_norm == QkNorm::kWhole;
    ARBOR_ASSIGN_OR_RETURN(w.q_norm, b.vector(p + "attn_q_norm.weight",
                                              whole ? c.q_dim() : c.head_dim, true));
    ARBOR_ASSIGN_OR_RETURN(w.k_norm, b.vector(p + "attn_k_norm.weight",
                                              whole ? c.kv_dim() : c.head_dim, true));
  }
  ARBOR_ASSIGN_OR_RETURN(w.o, linear(b, p + "attn_output", c.dim, c.q_dim(), s.attn_out_bias,
                                     true));
  if (s.post_norms) {
    ARBOR_ASSIGN_OR_RETURN(w.post_attn_norm,
                           b.vector(p + "post_attention_norm.weight", c.dim, true));
    ARBOR_ASSIGN_OR_RETURN(w.post_ffn_norm, b.vector(p + "post_ffw_norm.weight", c.dim, true));
  }
  return bind_ffn(b, c, p, w);
}

// The file's one MTP block: its layer and nextn.* tensors (docs/qwen35.md §3.6).
Status bind_mtp(Binder& b, const ModelConfig& c, LlamaWeights& w) {
  if (c.num_nextn_layers != 1) {
    return invalid_argument(b.file_name(), ": ", c.arch_name, ".nextn_predict_layers is ",
                            c.num_nextn_layers, "; MTP speculation runs a file's single "
                            "multi-token-prediction block (llama.cpp's qwen35 mode)");
  }
  const int l = c.num_layers;
  ARBOR_RETURN_IF_ERROR(bind_layer(b, c, l, w.mtp_layers.emplace_back()));
  const std::string p = str_cat("blk.", l, ".nextn.");
  ARBOR_ASSIGN_OR_RETURN(w.mtp_input.eh_proj,
                         linear(b, p + "eh_proj", c.dim, 2 * int64_t{c.dim}, false, false));
  ARBOR_ASSIGN_OR_RETURN(w.mtp_input.enorm, b.vector(p + "enorm.weight", c.dim, true));
  ARBOR_ASSIGN_OR_RETURN(w.mtp_input.hnorm, b.vector(p + "hnorm.weight", c.dim, true));
  ARBOR_ASSIGN_OR_RETURN(w.mtp_head_norm, b.vector(p + "shared_head_norm.weight", c.dim, false));
  if (b.has(p + "shared_head_head.weight")) {
    ARBOR_ASSIGN_OR_RETURN(w.mtp_head.w,
                           b.matrix(p + "shared_head_head.weight", c.vocab_size, c.dim));
  }
  if (b.has(p + "embed_tokens.weight")) {
    ARBOR_ASSIGN_OR_RETURN(w.mtp_embed, b.matrix(p + "embed_tokens.weight", c.vocab_size, c.dim));
  }
  return ok_status();
}

// The full-attention layers' frequency divisors: rope_freqs.weight, or (LongRoPE) the long or
// short factors by the serving context, as llama.cpp's get_rope_factors chooses.
Result<const float*> bind_rope_factors(Binder& b, const ModelConfig& c, int64_t serving_context) {
  if (!c.spec->rope_freqs) return static_cast<const float*>(nullptr);
  const int64_t half = c.rope_dim / 2;
  ARBOR_ASSIGN_OR_RETURN(const float* freqs, b.vector("rope_freqs.weight", half, false));
  const RopeScaling scaling = c.ropes[0].scaling;
  if (freqs != nullptr && scaling == RopeScaling::kLlama3) {
    return invalid_argument(c.arch_name, ": both rope_freqs.weight and ", c.arch_name,
                            ".rope.scaling.type llama3 are set; use one");
  }
  const bool longrope = scaling == RopeScaling::kLongRope || c.arch == Arch::kPhi3;
  if (!longrope) return freqs;
  ARBOR_ASSIGN_OR_RETURN(const float* lng, b.vector("rope_factors_long.weight", half, false));
  ARBOR_ASSIGN_OR_RETURN(const float* shrt, b.vector("rope_factors_short.weight", half, false));
  if (freqs != nullptr) return freqs;
  return serving_context > c.longrope_original_context ? lng : shrt;
}

}  // namespace

void for_each_weight(LlamaWeights& w, const ModelConfig& c,
                     const std::function<void(const MatrixRef&)>& matrix,
                     const std::function<void(const VectorRef&)>& vector) {
  auto mat = [&](const std::string& name, kernels::WeightView& v) {
    if (v.data != nullptr) matrix({name, &v});
  };
  auto vec = [&](const std::string& name, const float*& v, int64_t n) {
    if (v != nullptr) vector({name, &v, n});
  };
  const bool whole = c.spec != nullptr && c.spec->qk_norm == QkNorm::kWhole;
  mat("token_embd.weight", w.token_embd);
  const auto layer = [&](LayerWeights& lw, const std::string& p) {
    vec(p + "attn_norm.weight", lw.attn_norm, c.dim);
    mat(p + "attn_q.weight", lw.q.w);
    mat(p + "attn_k.weight", lw.k.w);
    mat(p + "attn_v.weight", lw.v.w);
    vec(p + "attn_q.bias", lw.q.bias, c.q_dim());
    vec(p + "attn_k.bias", lw.k.bias, c.kv_dim());
    vec(p + "attn_v.bias", lw.v.bias, c.kv_dim());
    vec(p + "attn_q_norm.weight", lw.q_norm, whole ? c.q_dim() : c.head_dim);
    vec(p + "attn_k_norm.weight", lw.k_norm, whole ? c.kv_dim() : c.head_dim);
    mat(p + "attn_output.weight", lw.o.w);
    vec(p + "attn_output.bias", lw.o.bias, c.dim);
    vec(p + "post_attention_norm.weight", lw.post_attn_norm, c.dim);
    vec(str_cat(p, c.spec != nullptr ? c.spec->ffn_norm_name : "ffn_norm", ".weight"),
        lw.ffn_norm, c.dim);
    vec(p + "attn_sinks.weight", lw.attn_sinks, c.num_heads);
    mat(p + "ffn_gate.weight", lw.gate.w);
    mat(p + "ffn_up.weight", lw.up.w);
    mat(p + "ffn_down.weight", lw.down.w);
    vec(p + "ffn_gate.bias", lw.gate.bias, c.ffn_dim);
    vec(p + "ffn_up.bias", lw.up.bias, c.ffn_dim);
    vec(p + "ffn_down.bias", lw.down.bias, c.dim);
    vec(p + "post_ffw_norm.weight", lw.post_ffn_norm, c.dim);
    mat(p + "ffn_gate_inp.weight", lw.router);
    const std::pair<const char*, std::vector<kernels::WeightView>*> sets[] = {
        {"ffn_gate_exps.weight", &lw.gate_exps},
        {"ffn_up_exps.weight", &lw.up_exps},
        {"ffn_down_exps.weight", &lw.down_exps}};
    for (const auto& [name, views] : sets) {
      for (size_t e = 0; e < views->size(); ++e) mat(str_cat(p, name, "[", e, "]"), (*views)[e]);
    }
    mat(p + "ffn_gate_shexp.weight", lw.shexp_gate.w);
    mat(p + "ffn_up_shexp.weight", lw.shexp_up.w);
    mat(p + "ffn_down_shexp.weight", lw.shexp_down.w);
    mat(p + "ffn_gate_inp_shexp.weight", lw.shexp_gate_inp);
    const int64_t ne = c.num_experts, eff = c.expert_ffn_dim;
    vec(p + "ffn_gate_inp.bias", lw.router_bias, ne);
    vec(p + "ffn_gate_exps.bias", lw.gate_exps_bias, ne * eff);
    vec(p + "ffn_up_exps.bias", lw.up_exps_bias, ne * eff);
    vec(p + "ffn_down_exps.bias", lw.down_exps_bias, ne * c.dim);
    const SsmConfig& ssm = c.ssm;
    mat(p + "attn_qkv.weight", lw.ssm_qkv.w);
    mat(p + "attn_gate.weight", lw.ssm_z.w);
    mat(p + "ssm_beta.weight", lw.ssm_beta);
    mat(p + "ssm_alpha.weight", lw.ssm_alpha);
    vec(p + "ssm_dt.bias", lw.ssm_dt_bias, ssm.num_v_heads);
    vec(p + "ssm_a", lw.ssm_a, ssm.num_v_heads);
    vec(p + "ssm_conv1d.weight", lw.ssm_conv, int64_t{ssm.conv_dim()} * ssm.conv_kernel);
    vec(p + "ssm_norm.weight", lw.ssm_norm, ssm.state_size);
    mat(p + "ssm_out.weight", lw.ssm_out.w);
  };
  for (size_t l = 0; l < w.layers.size(); ++l) layer(w.layers[l], str_cat("blk.", l, "."));
  // The MTP block (a target loaded with load_mtp) and its head's tensors, or an MTP view's mix.
  const size_t mtp = w.layers.size();
  for (size_t l = 0; l < w.mtp_layers.size(); ++l) {
    layer(w.mtp_layers[l], str_cat("blk.", mtp + l, "."));
  }
  const std::string n = str_cat("blk.", w.is_mtp_view ? 0 : mtp, ".nextn.");
  mat(n + "eh_proj.weight", w.mtp_input.eh_proj.w);
  vec(n + "enorm.weight", w.mtp_input.enorm, c.dim);
  vec(n + "hnorm.weight", w.mtp_input.hnorm, c.dim);
  if (!w.is_mtp_view) {  // the view's are its token_embd / output_norm / output
    vec(n + "shared_head_norm.weight", w.mtp_head_norm, c.dim);
    mat(n + "shared_head_head.weight", w.mtp_head.w);
    mat(n + "embed_tokens.weight", w.mtp_embed);
  }
  vec("output_norm.weight", w.output_norm, c.dim);
  if (!w.tied_output) mat("output.weight", w.output.w);
  vec("rope_freqs.weight", w.rope_freqs, c.rope_dim / 2);
}

Result<std::vector<float>> dequantize_rows(const kernels::WeightView& w,
                                           std::span<const int64_t> rows) {
  const auto cols = static_cast<size_t>(w.cols);
  std::vector<float> out(rows.size() * cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= w.rows) {
      return invalid_argument("row ", rows[i], " of a matrix of ", w.rows, " rows");
    }
    const auto* src = static_cast<const uint8_t*>(w.data) + rows[i] * w.row_stride;
    ARBOR_RETURN_IF_ERROR(gguf::dequantize_row(w.type, src, out.data() + i * cols, w.cols));
  }
  return out;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path,
                                                     const ModelLoadOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  return from_file(std::move(file), options);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_file(gguf::GgufFile file,
                                                          const ModelLoadOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::from_gguf(file));
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(file), std::move(config)));
  ARBOR_RETURN_IF_ERROR(model->bind_weights(options));
  ARBOR_RETURN_IF_ERROR(model->check_cheap_weights());
  ARBOR_RETURN_IF_ERROR(model->shard_and_segment(options));
  if (options.pack_for_cpu) ARBOR_RETURN_IF_ERROR(model->pack_matrices());
  return model;
}

namespace {

// Columns [c0, c0 + n) of `w` as a matrix of their own (same rows and row stride).
kernels::WeightView col_slice(const kernels::WeightView& w, int64_t c0, int64_t n) {
  kernels::WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + kernels::weight_row_bytes(w.type, c0);
  s.cols = n;
  s.packed = nullptr;
  return s;
}

Linear rows_of(const Linear& l, int64_t r0, int64_t n) {
  Linear s = l;
  s.w = row_slice(l.w, r0, n);
  if (l.bias != nullptr) s.bias = l.bias + r0;
  return s;
}

std::vector<kernels::WeightView> segments_of(const kernels::WeightView& w, int n) {
  std::vector<kernels::WeightView> segs;
  const int64_t cols = w.cols / n;
  for (int i = 0; i < n; ++i) segs.push_back(col_slice(w, i * cols, cols));
  return segs;
}

}  // namespace

Status LlamaModel::shard_and_segment(const ModelLoadOptions& options) {
  const ModelConfig& c = config_;
  num_segments_ = std::min(canonical_segments(c, weights_), std::max(1, options.max_segments));
  tp_rank_ = options.tp_rank;
  tp_size_ = options.tp_size;
  ARBOR_RETURN_IF_ERROR(check_tp(c, num_segments_, tp_size_));
  if (tp_rank_ < 0 || tp_rank_ >= tp_size_) {
    return invalid_argument("tensor-parallel rank ", tp_rank_, " of ", tp_size_, " ranks");
  }
  tp_shape_ = model::tp_shape(c, tp_rank_, tp_size_);
  const TpShape& t = tp_shape_;
  const int64_t hd = c.head_dim, q0 = tp_rank_ * t.num_heads * hd,
                kv0 = tp_rank_ * t.num_kv_heads * hd, f0 = int64_t{tp_rank_} * t.ffn_dim;
  const int local_segments = num_segments_ / tp_size_;
  for (LayerWeights& l : weights_.layers) {
    if (tp_size_ > 1) {
      l.q = rows_of(l.q, q0, t.num_heads * hd);
      l.k = rows_of(l.k, kv0, t.num_kv_heads * hd);
      l.v = rows_of(l.v, kv0, t.num_kv_heads * hd);
      l.o.w = col_slice(l.o.w, q0, t.num_heads * hd);
      l.gate = rows_of(l.gate, f0, t.ffn_dim);
      l.up = rows_of(l.up, f0, t.ffn_dim);
      l.down.w = col_slice(l.down.w, f0, t.ffn_dim);
    }
    if (num_segments_ > 1) {
      l.o_segs = segments_of(l.o.w, local_segments);
      l.down_segs = segments_of(l.down.w, local_segments);
    }
  }
  if (!weights_.mtp_layers.empty() && tp_size_ > 1) {
    return unimplemented(file_.name(), ": MTP speculation with tensor parallelism (", tp_size_,
                         " ranks)");
  }
  for (LayerWeights& l : weights_.mtp_layers) {
    if (num_segments_ > 1) {
      l.o_segs = segments_of(l.o.w, local_segments);
      l.down_segs = segments_of(l.down.w, local_segments);
    }
  }
  if (tp_size_ > 1) weights_.output.w = row_slice(weights_.output.w, t.vocab_begin, t.vocab_rows);
  return ok_status();
}

uint64_t LlamaModel::resident_weight_bytes() const {
  uint64_t bytes = 0;
  bytes += packed_.size();
  // (the dense segment copies are counted below as the segments' views)
  const auto view = [&](const kernels::WeightView& v) {
    if (v.packed == nullptr) bytes += v.rows * kernels::weight_row_bytes(v.type, v.cols);
  };
  view(weights_.token_embd);
  if (!weights_.tied_output) view(weights_.output.w);
  for (const kernels::WeightView* v : {&weights_.mtp_input.eh_proj.w, &weights_.mtp_head.w,
                                       &weights_.mtp_embed}) {
    if (v->data != nullptr) view(*v);
  }
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : weights_.layers) layers.push_back(&l);
  for (const LayerWeights& l : weights_.mtp_layers) layers.push_back(&l);
  for (const LayerWeights* lp : layers) {
    const LayerWeights& l = *lp;
    for (const Linear* m : {&l.q, &l.k, &l.v, &l.gate, &l.up}) view(m->w);
    if (l.o_segs.empty()) view(l.o.w);
    if (l.down_segs.empty()) view(l.down.w);
    for (const auto* segs : {&l.o_segs, &l.down_segs}) {
      for (const kernels::WeightView& s : *segs) view(s);
    }
    for (const auto* e : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      for (const kernels::WeightView& v : *e) view(v);
    }
    if (l.router.data != nullptr) view(l.router);
    for (const Linear* m : {&l.shexp_gate, &l.shexp_up, &l.shexp_down}) {
      if (m->w.data != nullptr) view(m->w);
    }
    if (l.shexp_gate_inp.data != nullptr) view(l.shexp_gate_inp);
    for (const kernels::WeightView* v : {&l.ssm_qkv.w, &l.ssm_z.w, &l.ssm_beta, &l.ssm_alpha,
                                         &l.ssm_out.w}) {
      if (v->data != nullptr) view(*v);
    }
  }
  return bytes;
}

Status LlamaModel::pack_matrices() {
  std::vector<kernels::WeightView*> views;
  // o and down are read as their segments when they have them (LayerWeights::o_segs).
  std::vector<const kernels::WeightView*> segmented;
  std::vector<LayerWeights*> layers;
  for (LayerWeights& l : weights_.layers) layers.push_back(&l);
  for (LayerWeights& l : weights_.mtp_layers) layers.push_back(&l);
  for (LayerWeights* lp : layers) {
    LayerWeights& l = *lp;
    if (!l.o_segs.empty()) segmented.push_back(&l.o.w);
    if (!l.down_segs.empty()) segmented.push_back(&l.down.w);
    for (auto* segs : {&l.o_segs, &l.down_segs}) {
      for (kernels::WeightView& s : *segs) {
        if (kernels::packing_available(s.type)) {
          views.push_back(&s);
          continue;
        }
        // A type without a packed kernel: the segment's rows copied out densely, so its kernel
        // streams one contiguous range instead of a quarter of every row of the matrix.
        const size_t row = kernels::weight_row_bytes(s.type, s.cols);
        auto& copy = segment_copies_.emplace_back(s.rows * row);
        for (int64_t r = 0; r < s.rows; ++r) {
          std::memcpy(copy.data() + r * row, static_cast<const uint8_t*>(s.data) + r * s.row_stride,
                      row);
        }
        s.data = copy.data();
        s.row_stride = row;
      }
    }
  }
  for_each_weight(
      weights_, config_,
      [&](const MatrixRef& m) {
        if (m.w != &weights_.token_embd && m.w != &weights_.mtp_embed &&
            kernels::packing_available(m.w->type) &&
            std::find(segmented.begin(), segmented.end(), m.w) == segmented.end()) {
          views.push_back(m.w);
        }
      },
      [](const VectorRef&) {});
  if (weights_.tied_output && kernels::packing_available(weights_.output.w.type)) {
    views.push_back(&weights_.output.w);
  }
  if (views.empty()) {
    for (const kernels::WeightView* whole : segmented) {
      release_mapped_pages(whole->data, static_cast<size_t>(whole->rows) * whole->row_stride);
    }
    return ok_status();
  }
  // The bytes a view spans in the mapping (a column slice's last row ends before the stride).
  const auto span_bytes = [](const kernels::WeightView& v) {
    return v.rows == 0 ? size_t{0}
                       : static_cast<size_t>(v.rows - 1) * v.row_stride +
                             kernels::weight_row_bytes(v.type, v.cols);
  };
  uint64_t total = 0, done = 0;  // bytes (an expert's slice is often under 1 MiB)
  // Each matrix's offset in the one buffer, 64-byte aligned (a cache line).
  std::vector<size_t> offsets;
  size_t packed_bytes = 0;
  for (const kernels::WeightView* v : views) {
    total += span_bytes(*v);
    offsets.push_back(packed_bytes);
    packed_bytes += (kernels::packed_weight_bytes(*v) + 63) / 64 * 64;
  }
  ARBOR_ASSIGN_OR_RETURN(packed_, HugePageBuffer::allocate(packed_bytes));
  // Reads the whole file once (page faults on a cold cache dominate), so it shows progress.
  ProgressBar bar("packing weights", total >> 20, "MiB");
  for (size_t i = 0; i < views.size(); ++i) {
    kernels::WeightView* v = views[i];
    kernels::pack_weights_into(*v, packed_.data() + offsets[i]);
    v->packed = packed_.data() + offsets[i];
    // The embedding's rows are still read from the mapping when the classifier is tied to it;
    // a segment's rows interleave with its neighbours': released with the whole matrix below.
    const bool segment = kernels::weight_row_bytes(v->type, v->cols) != v->row_stride;
    if (!(v == &weights_.output.w && weights_.tied_output) && !segment) {
      release_mapped_pages(v->data, span_bytes(*v));
    }
    done += span_bytes(*v);
    bar.set(done >> 20);
  }
  for (const kernels::WeightView* whole : segmented) release_mapped_pages(whole->data, span_bytes(*whole));
  bar.finish();
  ARBOR_LOG(kDebug) << "packed weights: " << (packed_bytes >> 20) << " MiB, "
                    << (packed_.advised() ? "advised as transparent huge pages"
                                          : "in 4 KiB pages (the kernel refused THP advice)");
  return ok_status();
}

// The weights every load checks (weight_check.h): the 1-D F32 tensors (norms, biases, scales)
// and the classifier (token_embd when tied), which every logit reads, and the rank head.
Status LlamaModel::check_cheap_weights() const {
  for (const gguf::TensorInfo& t : file_.tensors()) {
    // 1-D F32 tensors, and the 2-D per-expert biases (gpt-oss).
    const bool vector = t.type == gguf::GgmlType::kF32 &&
                        (t.dims.size() == 1 || t.name.ends_with(".bias"));
    const bool classifier =
        t.name == (weights_.tied_output ? "token_embd.weight" : "output.weight") ||
        t.name == "cls.output.weight";
    if (vector || classifier) ARBOR_RETURN_IF_ERROR(check_finite_tensor(file_, t));
  }
  return ok_status();
}

Status LlamaModel::bind_weights(const ModelLoadOptions& options) {
  const ModelConfig& c = config_;
  Binder b(file_);
  ARBOR_ASSIGN_OR_RETURN(weights_.token_embd, b.matrix("token_embd.weight", c.vocab_size, c.dim));
  ARBOR_ASSIGN_OR_RETURN(weights_.output_norm, b.vector("output_norm.weight", c.dim, true));
  const bool has_output = b.has("output.weight");
  if (c.spec->output == OutputTensor::kRequired && !has_output) {
    return not_found(file_.name(), ": tensor output.weight is missing (", c.arch_name,
                     " has no tied classifier)");
  }
  weights_.tied_output = !has_output || c.spec->output == OutputTensor::kTied;
  if (weights_.tied_output) {
    weights_.output.w = weights_.token_embd;
  } else {
    ARBOR_ASSIGN_OR_RETURN(weights_.output.w, b.matrix("output.weight", c.vocab_size, c.dim));
  }
  ARBOR_ASSIGN_OR_RETURN(weights_.output.scale, b.scale("output", true));
  if (c.spec->rank_head && b.has("cls.output.weight")) {
    const auto classes = static_cast<int64_t>(std::max<size_t>(1, c.classifier_labels.size()));
    ARBOR_ASSIGN_OR_RETURN(weights_.cls_out, b.matrix("cls.output.weight", classes, c.dim));
  }
  const int64_t serving = options.serving_context > 0 ? options.serving_context : c.context_length;
  ARBOR_ASSIGN_OR_RETURN(weights_.rope_freqs, bind_rope_factors(b, c, serving));
  weights_.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    ARBOR_RETURN_IF_ERROR(bind_layer(b, c, l, weights_.layers[l]));
  }
  if (options.load_mtp) {
    ARBOR_RETURN_IF_ERROR(bind_mtp(b, c, weights_));
  } else {
    for (int l = c.num_layers; l < c.num_layers + c.num_nextn_layers; ++l) {
      const int n = b.skip_prefix(str_cat("blk.", l, "."));
      ARBOR_LOG(kInfo) << file_.name() << ": multi-token-prediction block " << l << " (" << n
                       << " tensors) is not run";
    }
  }
  return b.check_all_used(c.arch_name);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::mtp_model() const {
  const LlamaWeights& w = weights_;
  if (w.mtp_layers.empty()) {
    return failed_precondition(file_.name(), ": the MTP head was not loaded (load_mtp)");
  }
  if (tp_size_ > 1) return unimplemented("an MTP head under tensor parallelism");
  // The MTP block is one full-attention layer with the trunk's attention layers' RoPE.
  const auto attn = std::find_if(config_.layers.begin(), config_.layers.end(),
                                 [](const LayerSpec& l) { return !l.recurrent; });
  ModelConfig c = config_;
  c.num_layers = 1;
  c.layers = {LayerSpec{.window = 0, .rope = attn != config_.layers.end() ? attn->rope : 0}};
  c.ssm = SsmConfig{};
  c.num_nextn_layers = 0;
  std::unique_ptr<LlamaModel> m(new LlamaModel(file_, std::move(c)));
  LlamaWeights& v = m->weights_;
  v.token_embd = w.mtp_embed.data != nullptr ? w.mtp_embed : w.token_embd;
  v.layers = w.mtp_layers;
  v.output_norm = w.mtp_head_norm != nullptr ? w.mtp_head_norm : w.output_norm;
  v.output = w.mtp_head.w.data != nullptr ? w.mtp_head : w.output;
  v.tied_output = w.mtp_head.w.data == nullptr && w.tied_output;
  v.rope_freqs = w.rope_freqs;
  v.mtp_input = w.mtp_input;
  v.is_mtp_view = true;
  m->num_segments_ = num_segments_;
  m->tp_shape_ = tp_shape_;
  return m;
}

}  // namespace arbor::model
