#include "model/synth_model.h"

#include <algorithm>
#include <cmath>

#include "base/bits.h"
#include "base/check.h"
#include "gguf/quants.h"
#include "model/arch.h"

namespace arbor::model {
namespace {

using gguf::GgmlType;
using gguf::Value;
using Init = SynthTensor::Init;

std::vector<SynthShape> make_presets() {
  std::vector<SynthShape> p;
  auto add = [&](SynthShape s) { p.push_back(std::move(s)); };
  add({.name = "tinyllama-1.1b", .dim = 2048, .ffn = 5632, .layers = 22, .heads = 32,
       .kv_heads = 4, .context = 2048});
  add({.name = "stories110m", .dim = 768, .ffn = 2048, .layers = 12, .heads = 12, .kv_heads = 12,
       .context = 1024});
  add({.name = "stories15m", .dim = 288, .ffn = 768, .layers = 6, .heads = 6, .kv_heads = 6,
       .context = 256});
  add({.name = "qwen2.5-0.5b", .arch = "qwen2", .dim = 896, .ffn = 4864, .layers = 24,
       .heads = 14, .kv_heads = 2, .context = 32768, .vocab = 151936, .tied = true,
       .qkv_bias = true, .rope_theta = 1e6f, .rms_eps = 1e-6f});
  add({.name = "qwen3-0.6b", .arch = "qwen3", .dim = 1024, .ffn = 3072, .layers = 28,
       .heads = 16, .kv_heads = 8, .context = 40960, .head_dim = 128, .vocab = 151936,
       .tied = true, .rope_theta = 1e6f, .rms_eps = 1e-6f});
  add({.name = "qwen3-30b-a3b", .arch = "qwen3moe", .dim = 2048, .ffn = 6144, .layers = 48,
       .heads = 32, .kv_heads = 4, .context = 40960, .head_dim = 128, .vocab = 151936,
       .rope_theta = 1e6f, .rms_eps = 1e-6f, .experts = 128, .experts_used = 8,
       .expert_ffn = 768});
  add({.name = "gemma3-1b", .arch = "gemma3", .dim = 1152, .ffn = 6912, .layers = 26, .heads = 4,
       .kv_heads = 1, .context = 32768, .head_dim = 256, .vocab = 262144, .tied = true,
       .rope_theta = 1e6f, .rms_eps = 1e-6f, .window = 512, .swa_pattern = 6,
       .rope_theta_swa = 10000.0f});
  add({.name = "gemma3-270m", .arch = "gemma3", .dim = 640, .ffn = 2048, .layers = 18,
       .heads = 4, .kv_heads = 1, .context = 32768, .head_dim = 256, .vocab = 262144,
       .tied = true, .rope_theta = 1e6f, .rms_eps = 1e-6f, .window = 512, .swa_pattern = 6,
       .rope_theta_swa = 10000.0f});
  add({.name = "gemma2-2b", .arch = "gemma2", .dim = 2304, .ffn = 9216, .layers = 26, .heads = 8,
       .kv_heads = 4, .context = 8192, .head_dim = 256, .vocab = 256000, .tied = true,
       .rms_eps = 1e-6f, .window = 4096, .attn_softcap = 50.0f, .final_softcap = 30.0f});
  add({.name = "ministral3-3b", .arch = "mistral3", .dim = 3072, .ffn = 9216, .layers = 26,
       .heads = 32, .kv_heads = 8, .context = 262144, .head_dim = 128, .vocab = 131072,
       .tied = true, .rope_theta = 1e6f, .rms_eps = 1e-5f, .rope_scaling = "yarn",
       .rope_factor = 16.0f, .rope_original_context = 16384, .yarn_beta_fast = 32.0f,
       .yarn_beta_slow = 1.0f, .yarn_log_mul = 1.0f, .attn_temp_scale = 0.1f});
  add({.name = "phi4-mini", .arch = "phi3", .dim = 3072, .ffn = 8192, .layers = 32, .heads = 24,
       .kv_heads = 8, .context = 131072, .rope_dim = 96, .vocab = 200064, .tied = true,
       .fused_qkv = true, .rope_scaling = "longrope", .rope_original_context = 4096,
       .rope_attn_factor = 1.1902f});
  add({.name = "smollm3-3b", .arch = "smollm3", .dim = 2048, .ffn = 11008, .layers = 36,
       .heads = 16, .kv_heads = 4, .context = 65536, .vocab = 128256, .tied = true,
       .rope_theta = 5e6f, .rms_eps = 1e-6f});
  add({.name = "olmo2-1b", .arch = "olmo2", .dim = 2048, .ffn = 8192, .layers = 16, .heads = 16,
       .kv_heads = 16, .context = 4096, .vocab = 100352, .rope_theta = 500000.0f,
       .rms_eps = 1e-6f});
  add({.name = "granite3.3-2b", .arch = "granite", .dim = 2048, .ffn = 8192, .layers = 40,
       .heads = 32, .kv_heads = 8, .context = 131072, .vocab = 49159, .tied = true,
       .rope_theta = 1e7f, .rms_eps = 1e-5f, .embedding_scale = 12.0f, .residual_scale = 0.22f,
       .logit_scale = 8.0f, .attention_scale = 0.015625f});
  add({.name = "mixtral-8x7b", .dim = 4096, .ffn = 14336, .layers = 32, .heads = 32,
       .kv_heads = 8, .context = 32768, .vocab = 32000, .rope_theta = 1e6f, .experts = 8,
       .experts_used = 2});
  // Tiny mixtures of experts for tests (tests/model/arch_reference_test.cc): several experts,
  // top-k >= 2, widths every quantisation type takes.
  add({.name = "tiny-qwen3moe", .arch = "qwen3moe", .dim = 256, .ffn = 512, .layers = 4,
       .heads = 4, .kv_heads = 2, .context = 4096, .head_dim = 128, .rope_theta = 1e6f,
       .rms_eps = 1e-6f, .experts = 16, .experts_used = 4, .expert_ffn = 64});
  // Qwen1.5-MoE-A2.7B's proportions at test size: 8 experts of 64 (top-4; the real file: 60 of
  // 1408, top-4) and a shared expert 4x as wide.
  add({.name = "tiny-qwen2moe", .arch = "qwen2moe", .dim = 256, .ffn = 512, .layers = 4,
       .heads = 4, .kv_heads = 4, .context = 4096, .qkv_bias = true, .rope_theta = 1e6f,
       .rms_eps = 1e-6f, .experts = 8, .experts_used = 4, .expert_ffn = 64, .shared_ffn = 256});
  add({.name = "tiny-mixtral", .dim = 256, .ffn = 512, .layers = 4, .heads = 4, .kv_heads = 2,
       .context = 4096, .rope_theta = 1e6f, .experts = 8, .experts_used = 2});
  // gpt-oss (OpenAI's config.json: 2880 wide, 64 heads of 64 with 8 kv heads, 128-token windows
  // on even layers, YaRN x32 over 4096, experts as wide as the model, 4 per token; o200k vocab).
  add({.name = "gpt-oss-20b", .arch = "gpt-oss", .dim = 2880, .ffn = 2880, .layers = 24,
       .heads = 64, .kv_heads = 8, .context = 131072, .head_dim = 64, .vocab = 201088,
       .qkv_bias = true, .out_bias = true, .rope_theta = 150000.0f, .window = 128,
       .rope_scaling = "yarn", .rope_factor = 32.0f, .rope_original_context = 4096,
       .experts = 32, .experts_used = 4, .expert_ffn = 2880});
  add({.name = "gpt-oss-120b", .arch = "gpt-oss", .dim = 2880, .ffn = 2880, .layers = 36,
       .heads = 64, .kv_heads = 8, .context = 131072, .head_dim = 64, .vocab = 201088,
       .qkv_bias = true, .out_bias = true, .rope_theta = 150000.0f, .window = 128,
       .rope_scaling = "yarn", .rope_factor = 32.0f, .rope_original_context = 4096,
       .experts = 128, .experts_used = 4, .expert_ffn = 2880});
  // The test shape: 8 experts, top-4; windows of 16 and YaRN over an original context of 16, so
  // a 64-token prompt runs both.
  add({.name = "tiny-gpt-oss", .arch = "gpt-oss", .dim = 256, .ffn = 256, .layers = 4,
       .heads = 4, .kv_heads = 2, .context = 4096, .head_dim = 64, .qkv_bias = true,
       .out_bias = true, .rope_theta = 150000.0f, .window = 16, .rope_scaling = "yarn",
       .rope_factor = 4.0f, .rope_original_context = 16, .experts = 8, .experts_used = 4,
       .expert_ffn = 128});
  // Qwen3.5 (docs/qwen35.md: the 2B and 35B-A3B files' metadata): 3 of 4 layers Gated DeltaNet
  // (16 key heads, 16 or 32 value heads, of 128), gated attention with 256-wide heads rotating
  // 64 dims, and the one multi-token-prediction block the real files carry.
  add({.name = "qwen3.5-2b", .arch = "qwen35", .dim = 2048, .ffn = 6144, .layers = 24,
       .heads = 8, .kv_heads = 2, .context = 262144, .head_dim = 256, .rope_dim = 64,
       .vocab = 248320, .tied = true, .rope_theta = 1e7f, .rms_eps = 1e-6f, .ssm_state = 128,
       .ssm_k_heads = 16, .ssm_v_heads = 16, .nextn = 1});
  add({.name = "qwen3.5-35b-a3b", .arch = "qwen35moe", .dim = 2048, .ffn = 512, .layers = 40,
       .heads = 16, .kv_heads = 2, .context = 262144, .head_dim = 256, .rope_dim = 64,
       .vocab = 248320, .rope_theta = 1e7f, .rms_eps = 1e-6f, .experts = 256, .experts_used = 8,
       .expert_ffn = 512, .shared_ffn = 512, .ssm_state = 128, .ssm_k_heads = 16,
       .ssm_v_heads = 32, .nextn = 1});
  // Test shapes: twice as many value heads as key heads (the tiled head map shows), layer 3
  // full attention with a partial rotary of 16 of 64 dims.
  add({.name = "tiny-qwen35", .arch = "qwen35", .dim = 256, .ffn = 512, .layers = 4,
       .heads = 4, .kv_heads = 2, .context = 4096, .head_dim = 64, .rope_dim = 16,
       .rope_theta = 1e7f, .rms_eps = 1e-6f, .ssm_state = 32, .ssm_k_heads = 2,
       .ssm_v_heads = 4, .nextn = 1});
  add({.name = "tiny-qwen35moe", .arch = "qwen35moe", .dim = 256, .ffn = 128, .layers = 4,
       .heads = 4, .kv_heads = 2, .context = 4096, .head_dim = 64, .rope_dim = 16,
       .rope_theta = 1e7f, .rms_eps = 1e-6f, .experts = 8, .experts_used = 4,
       .expert_ffn = 64, .shared_ffn = 128, .ssm_state = 32, .ssm_k_heads = 2,
       .ssm_v_heads = 4, .nextn = 1});
  add({.name = "custom", .context = 2048});
  return p;
}

// xoshiro256** seeded by splitmix64 (sampling::Rng's generator, so llama / qwen2 shapes keep the
// bytes they always had).
class RowRng {
 public:
  explicit RowRng(uint64_t seed) {
    for (uint64_t& s : s_) s = splitmix64(seed);
  }
  uint64_t next() { return xoshiro256ss_next(s_); }

 private:
  uint64_t s_[4];
};

// One row: uniform in [-a, a] with a = stddev * sqrt(3) (kUniform, kNearOne around 1 with
// stddev 0.2 / sqrt(3), kFactors in [1, 4]), or ones.
void fill_row(float* row, int64_t n, const SynthTensor& t, uint64_t seed, size_t tensor,
              int64_t r) {
  if (t.init == Init::kOnes || t.init == Init::kZero || t.init == Init::kEye) {
    std::fill(row, row + n, t.init == Init::kOnes ? 1.0f : 0.0f);
    if (t.init == Init::kEye && r < n) row[r] = 1.0f;
    return;
  }
  RowRng rng(mix64(mix64(seed) ^ (uint64_t(tensor) << 40)) ^ uint64_t(r));
  const float stddev = t.init == Init::kUniform ? t.stddev : 0.2f / std::sqrt(3.0f);
  // (kDecay: row in [-0.2, 0.2] mapped to [-0.4, -0.1] below)
  const float scale = stddev * std::sqrt(3.0f) * 0x1.0p-23f;  // 24-bit ints in [-2^23, 2^23)
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t bits = rng.next();
    row[i] = (static_cast<float>(bits >> 40) - 0x1.0p23f) * scale;
    if (i + 1 < n) row[i + 1] = (static_cast<float>((bits >> 8) & 0xffffff) - 0x1.0p23f) * scale;
  }
  if (t.init == Init::kNearOne) {
    for (int64_t i = 0; i < n; ++i) row[i] += 1.0f;
  } else if (t.init == Init::kFactors) {  // LongRoPE-like divisors in [1, 4]
    for (int64_t i = 0; i < n; ++i) row[i] = 2.5f + row[i] * 7.5f;
  } else if (t.init == Init::kDecay) {
    for (int64_t i = 0; i < n; ++i) row[i] = -0.25f + row[i] * 0.75f;
  }
}

int64_t head_dim_of(const SynthShape& s) { return s.head_dim > 0 ? s.head_dim : s.dim / s.heads; }

// The tensors of one layer, as model/arch.h's row binds them.
// An MTP block (l >= s.layers) is a full-attention layer; with mtp_echo its attention and FFN
// outputs are zero. The trunk's residual writers take residual_damp.
void plan_layer(const SynthShape& s, const ArchSpec& a, GgmlType type, int64_t l, Init norm,
                std::vector<SynthTensor>& t) {
  const bool mtp = l >= s.layers;
  const int64_t hd = head_dim_of(s), qd = s.heads * hd, kvd = s.kv_heads * hd;
  auto fan_in = [](int64_t n) { return static_cast<float>(1.0 / std::sqrt(double(n))); };
  const std::string p = "blk." + std::to_string(l) + ".";
  auto vec = [&](const std::string& name, int64_t n, Init init, float sd = 0.0f) {
    t.push_back({p + name, {n}, GgmlType::kF32, init, sd});
  };
  auto mat = [&](const std::string& name, int64_t cols, int64_t rows) {
    t.push_back({p + name, {cols, rows}, type, Init::kUniform, fan_in(cols)});
  };
  // A matrix writing into the residual stream ([dim] rows).
  const bool echo = mtp && s.mtp_echo;
  const float damp = mtp ? 1.0f : s.residual_damp;
  auto out_mat = [&](const std::string& name, int64_t cols, int64_t experts = 0) {
    std::vector<int64_t> dims{cols, s.dim};
    if (experts > 0) dims.push_back(experts);
    t.push_back({p + name, dims, type, echo ? Init::kZero : Init::kUniform, damp * fan_in(cols)});
  };
  if (a.pre_norms) vec("attn_norm.weight", s.dim, norm);
  const bool recurrent = !mtp && a.gated_delta_net && (l + 1) % s.full_attention_interval != 0;
  if (recurrent) {  // llama.cpp's order (src/llama-arch.cpp's qwen35 tensors)
    const int64_t kd = s.ssm_k_heads * s.ssm_state, vd = s.ssm_v_heads * s.ssm_state;
    const int64_t conv = 2 * kd + vd;
    mat("attn_qkv.weight", s.dim, conv);
    mat("attn_gate.weight", s.dim, vd);
    t.push_back({p + "ssm_conv1d.weight", {s.ssm_conv, conv}, GgmlType::kF32, Init::kUniform,
                 fan_in(s.ssm_conv)});
    vec("ssm_dt.bias", s.ssm_v_heads, Init::kUniform, 0.5f);
    vec("ssm_a", s.ssm_v_heads, Init::kDecay);
    mat("ssm_beta.weight", s.dim, s.ssm_v_heads);
    mat("ssm_alpha.weight", s.dim, s.ssm_v_heads);
    vec("ssm_norm.weight", s.ssm_state, Init::kNearOne);
    out_mat("ssm_out.weight", vd);
  } else if (a.attn_output_gate) {  // [q; gate] per head
    mat("attn_q.weight", s.dim, 2 * qd);
    mat("attn_k.weight", s.dim, kvd);
    mat("attn_v.weight", s.dim, kvd);
  } else if (s.fused_qkv) {
    mat("attn_qkv.weight", s.dim, qd + 2 * kvd);
    if (s.qkv_bias) vec("attn_qkv.bias", qd + 2 * kvd, Init::kUniform, 0.02f);
  } else {
    mat("attn_q.weight", s.dim, qd);
    mat("attn_k.weight", s.dim, kvd);
    mat("attn_v.weight", s.dim, kvd);
    if (s.qkv_bias) {
      vec("attn_q.bias", qd, Init::kUniform, 0.02f);
      vec("attn_k.bias", kvd, Init::kUniform, 0.02f);
      vec("attn_v.bias", kvd, Init::kUniform, 0.02f);
    }
  }
  if (a.qk_norm != QkNorm::kNone && !recurrent) {
    const bool whole = a.qk_norm == QkNorm::kWhole;
    vec("attn_q_norm.weight", whole ? qd : hd, norm);
    vec("attn_k_norm.weight", whole ? kvd : hd, norm);
  }
  if (!recurrent) out_mat("attn_output.weight", qd);
  if (s.out_bias) vec("attn_output.bias", s.dim, Init::kUniform, 0.02f);
  if (a.post_norms) vec("post_attention_norm.weight", s.dim, norm);
  // gpt-oss: a sink logit per head, of the scores' scale, so it takes a real share.
  if (a.attn_sinks) vec("attn_sinks.weight", s.heads, Init::kUniform, 1.0f);
  if (a.pre_norms) vec(std::string(a.ffn_norm_name) + ".weight", s.dim, norm);
  if (s.experts > 0) {  // llama.cpp's order: router, gate, down, up
    const int64_t eff = s.expert_ffn > 0 ? s.expert_ffn : s.ffn;
    // gpt-oss's clamped SwiGLU: gate and up 3x wider than fan-in, so that a few per cent of them
    // reach the clamps (|x| > 7) and a test sees where they bite.
    const float wide = a.activation == Activation::kSwigluOai ? 3.0f : 1.0f;
    t.push_back({p + "ffn_gate_inp.weight", {s.dim, s.experts}, GgmlType::kF32, Init::kUniform,
                 fan_in(s.dim)});
    t.push_back({p + "ffn_gate_exps.weight", {s.dim, eff, s.experts}, type, Init::kUniform,
                 wide * fan_in(s.dim)});
    out_mat("ffn_down_exps.weight", eff, s.experts);
    t.push_back({p + "ffn_up_exps.weight", {s.dim, eff, s.experts}, type, Init::kUniform,
                 wide * fan_in(s.dim)});
    if (a.expert_biases) {  // the router's bias wide enough to move the choice of experts
      t.push_back({p + "ffn_gate_inp.bias", {s.experts}, GgmlType::kF32, Init::kUniform, 0.5f});
      t.push_back({p + "ffn_gate_exps.bias", {eff, s.experts}, GgmlType::kF32, Init::kUniform,
                   0.5f});
      t.push_back({p + "ffn_down_exps.bias", {s.dim, s.experts}, GgmlType::kF32, Init::kUniform,
                   0.1f});
      t.push_back({p + "ffn_up_exps.bias", {eff, s.experts}, GgmlType::kF32, Init::kUniform,
                   0.5f});
    }
    if (a.shared_expert) {  // llama.cpp's order: gate_inp, gate, down, up
      const int64_t sffn = s.shared_ffn > 0 ? s.shared_ffn : s.ffn;
      vec("ffn_gate_inp_shexp.weight", s.dim, Init::kUniform, fan_in(s.dim));
      mat("ffn_gate_shexp.weight", s.dim, sffn);
      out_mat("ffn_down_shexp.weight", sffn);
      mat("ffn_up_shexp.weight", s.dim, sffn);
    }
    if (a.post_norms) vec("post_ffw_norm.weight", s.dim, norm);
    return;
  }
  if (a.fused_gate_up) {
    mat("ffn_up.weight", s.dim, 2 * s.ffn);
  } else {
    mat("ffn_gate.weight", s.dim, s.ffn);
    mat("ffn_up.weight", s.dim, s.ffn);
  }
  out_mat("ffn_down.weight", s.ffn);
  if (s.ffn_bias) {
    if (!a.fused_gate_up) vec("ffn_gate.bias", s.ffn, Init::kUniform, 0.02f);
    vec("ffn_up.bias", s.ffn, Init::kUniform, 0.02f);
    vec("ffn_down.bias", s.dim, Init::kUniform, 0.02f);
  }
  if (a.post_norms) vec("post_ffw_norm.weight", s.dim, norm);
}

uint32_t file_type_of(GgmlType type) {  // llama.cpp's llama_ftype
  switch (type) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kIQ4_NL: return 25;
    case GgmlType::kIQ4_XS: return 30;
    case GgmlType::kMXFP4: return 38;
    default: return 7;  // Q8_0
  }
}

// <arch>.* keys beyond the common ones.
void set_arch_keys(gguf::GgufWriter& w, const SynthShape& s) {
  const std::string a = s.arch;
  auto f32 = [&](const std::string& key, float v) {
    if (v != 0.0f) w.set(a + key, Value::f32(v));
  };
  auto u32 = [&](const std::string& key, int64_t v) {
    if (v != 0) w.set(a + key, Value::u32(static_cast<uint32_t>(v)));
  };
  u32(".attention.sliding_window", s.window);
  u32(".attention.sliding_window_pattern", s.swa_pattern);
  f32(".rope.freq_base_swa", s.rope_theta_swa);
  if (!s.rope_scaling.empty() && s.rope_scaling != "longrope") {
    w.set(a + ".rope.scaling.type", Value::str(s.rope_scaling));
  }
  f32(".rope.scaling.factor", s.rope_factor);
  u32(".rope.scaling.original_context_length", s.rope_original_context);
  f32(".rope.scaling.attn_factor", s.rope_attn_factor);
  f32(".rope.scaling.yarn_beta_fast", s.yarn_beta_fast);
  f32(".rope.scaling.yarn_beta_slow", s.yarn_beta_slow);
  f32(".rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
  f32(".attention.temperature_scale", s.attn_temp_scale);
  f32(".attn_logit_softcapping", s.attn_softcap);
  f32(".final_logit_softcapping", s.final_softcap);
  f32(".embedding_scale", s.embedding_scale);
  f32(".residual_scale", s.residual_scale);
  f32(".attention.scale", s.attention_scale);
  if (s.arch == "granite") w.set(a + ".logit_scale", Value::f32(s.logit_scale > 0 ? s.logit_scale : 1.0f));
  if (s.pooling_type >= 0) w.set(a + ".pooling_type", Value::u32(uint32_t(s.pooling_type)));
  if (s.rank_classes > 0) {
    std::vector<std::string> labels;
    for (int64_t i = 0; i < s.rank_classes; ++i) {
      labels.push_back(s.rank_classes == 2 ? (i == 0 ? "yes" : "no") : "label_" + std::to_string(i));
    }
    w.set(a + ".classifier.output_labels", Value::string_array(labels));
  }
  u32(".expert_count", s.experts);
  u32(".expert_used_count", s.experts > 0 ? s.experts_used : 0);
  if (s.experts > 0 && (s.arch == "qwen3moe" || s.arch == "gpt-oss" || s.arch == "qwen2moe")) {
    u32(".expert_feed_forward_length", s.expert_ffn > 0 ? s.expert_ffn : s.ffn);
  }
  if (s.experts > 0 && (s.arch == "qwen2moe" || s.arch == "qwen35moe")) {
    u32(".expert_shared_feed_forward_length", s.shared_ffn > 0 ? s.shared_ffn : s.ffn);
  }
  if (s.experts > 0 && s.arch == "qwen35moe") {
    u32(".expert_feed_forward_length", s.expert_ffn > 0 ? s.expert_ffn : s.ffn);
  }
  if (s.ssm_state > 0) {
    u32(".ssm.conv_kernel", s.ssm_conv);
    u32(".ssm.state_size", s.ssm_state);
    u32(".ssm.group_count", s.ssm_k_heads);
    u32(".ssm.time_step_rank", s.ssm_v_heads);
    u32(".ssm.inner_size", s.ssm_v_heads * s.ssm_state);
    u32(".full_attention_interval", s.full_attention_interval);
    // IMRoPE's sections in rotary pairs (text positions make them irrelevant; llama.cpp
    // requires the key): as the converter's default [11, 11, 10, 0] for 32 pairs.
    const int64_t half = (s.rope_dim > 0 ? s.rope_dim : head_dim_of(s)) / 2;
    const int64_t third = half / 3;
    w.set(a + ".rope.dimension_sections",
          Value::i32_array({static_cast<int32_t>(half - 2 * third), static_cast<int32_t>(third),
                            static_cast<int32_t>(third), 0}));
  }
}

}  // namespace

const std::vector<SynthShape>& synth_presets() {
  static const std::vector<SynthShape> kShapes = make_presets();
  return kShapes;
}

const SynthShape* find_synth_preset(const std::string& name) {
  for (const SynthShape& s : synth_presets()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const SynthShape* default_preset_for_arch(const std::string& arch) {
  for (const SynthShape& s : synth_presets()) {
    if (s.arch == arch && s.name != "custom") return &s;
  }
  return nullptr;
}

SynthShape with_arch(const SynthShape& shape, const std::string& arch) {
  if (shape.arch == arch) return shape;
  const SynthShape* d = default_preset_for_arch(arch);
  SynthShape s = d != nullptr ? *d : SynthShape{};
  s.arch = arch;
  s.name = shape.name;
  s.dim = shape.dim;
  s.ffn = shape.ffn;
  s.layers = shape.layers;
  s.heads = shape.heads;
  s.kv_heads = shape.kv_heads;
  s.context = shape.context;
  s.head_dim = shape.head_dim;
  s.rope_dim = shape.rope_dim;
  s.vocab = shape.vocab;
  s.tied = s.tied || shape.tied;
  s.qkv_bias = s.qkv_bias || shape.qkv_bias || arch == "qwen2";
  if (shape.ssm_state > 0) {
    s.ssm_state = shape.ssm_state;
    s.ssm_k_heads = shape.ssm_k_heads;
    s.ssm_v_heads = shape.ssm_v_heads;
    s.ssm_conv = shape.ssm_conv;
    s.full_attention_interval = shape.full_attention_interval;
    s.nextn = shape.nextn;
  }
  s.residual_damp = shape.residual_damp;
  s.mtp_echo = shape.mtp_echo;
  if (shape.experts > 0) {  // the shape's experts, else the architecture preset's (qwen3moe)
    s.experts = shape.experts;
    s.experts_used = shape.experts_used;
    s.expert_ffn = shape.expert_ffn;
    s.shared_ffn = shape.shared_ffn;
  }
  return s;
}

namespace {

Status validate_experts(const SynthShape& s, const ArchSpec& a) {
  if (s.experts == 0 && a.experts == Experts::kRequired) {
    return invalid_argument(s.arch, " is a mixture of experts: give --experts and --experts-used");
  }
  if (s.experts > 0 && a.experts == Experts::kNone) {
    return invalid_argument(s.arch,
                            " has no experts (mixtures of experts: qwen2moe, qwen3moe, gpt-oss, "
                            "llama)");
  }
  if (s.experts < 0 || s.experts > 512 || s.expert_ffn < 0 ||
      (s.experts > 0 && (s.experts_used < 1 || s.experts_used > s.experts))) {
    return invalid_argument("--experts ", s.experts, " must be in [0, 512] and --experts-used ",
                            s.experts_used, " in [1, --experts]");
  }
  return ok_status();
}

}  // namespace

Status validate_synth_shape(const SynthShape& s, GgmlType type) {
  const ArchSpec* a = find_arch(s.arch);
  if (a == nullptr) {
    return invalid_argument("--arch is ", s.arch, ", must be one of ", supported_arch_names());
  }
  if (s.dim <= 0 || s.ffn <= 0 || s.layers <= 0 || s.heads <= 0 || s.context <= 0) {
    return invalid_argument("shape ", s.name, " needs --dim, --ffn, --layers and --heads > 0 (got ",
                            s.dim, ", ", s.ffn, ", ", s.layers, ", ", s.heads, ")");
  }
  const int64_t hd = head_dim_of(s);
  if (s.head_dim == 0 && s.dim % s.heads != 0) {
    return invalid_argument("--dim ", s.dim, " must be a multiple of --heads ", s.heads,
                            " (or give --head-dim)");
  }
  if (hd % 2 != 0 || (s.rope_dim != 0 && (s.rope_dim % 2 != 0 || s.rope_dim > hd))) {
    return invalid_argument("head_dim ", hd, " and --rope-dim ", s.rope_dim,
                            " must be even, rope_dim <= head_dim");
  }
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) {
    return invalid_argument("--heads ", s.heads, " must be a multiple of --kv-heads ", s.kv_heads);
  }
  if (a->qkv_bias_required && !s.qkv_bias) {
    return invalid_argument(s.arch, " needs q/k/v biases");
  }
  if ((s.out_bias && !a->attn_out_bias) || (s.ffn_bias && !a->ffn_bias) ||
      (s.rope_freqs && !a->rope_freqs)) {
    return invalid_argument(s.arch, " has no attention-output / FFN biases or rope_freqs");
  }
  if (s.rank_classes < 0 || (s.rank_classes > 0 && !a->rank_head)) {
    return invalid_argument(s.arch, " has no rank head (cls.output.weight); rank_classes is ",
                            s.rank_classes);
  }
  if (s.pooling_type < -1 || s.pooling_type > 4) {
    return invalid_argument("pooling_type is ", s.pooling_type, ", must be in [-1, 4]");
  }
  if (a->swa_key_required && s.window <= 0) {
    return invalid_argument(s.arch, " needs a sliding window (--window)");
  }
  if (a->gated_delta_net &&
      (s.ssm_state <= 0 || s.ssm_state % 8 != 0 || s.ssm_k_heads <= 0 ||
       s.ssm_v_heads % std::max<int64_t>(1, s.ssm_k_heads) != 0 || s.ssm_v_heads <= 0 ||
       s.ssm_conv < 1 || s.full_attention_interval < 1)) {
    return invalid_argument(s.arch, " needs Gated DeltaNet dims: a state size that is a multiple "
                            "of 8 (", s.ssm_state, "), key heads (", s.ssm_k_heads,
                            ") dividing value heads (", s.ssm_v_heads, "), a conv kernel (",
                            s.ssm_conv, ") and an attention interval (",
                            s.full_attention_interval, ") >= 1");
  }
  if (s.nextn < 0 || s.nextn > 1 || (s.nextn > 0 && !a->gated_delta_net)) {
    return invalid_argument("--nextn is ", s.nextn, ": one multi-token-prediction block, on "
                            "qwen35 / qwen35moe only");
  }
  if (s.mtp_echo && (s.nextn == 0 || s.tied)) {
    return invalid_argument("--mtp-echo needs an MTP block (--nextn 1) and an untied classifier "
                            "(--untied)");
  }
  if (!(s.residual_damp > 0.0f && s.residual_damp <= 1.0f)) {
    return invalid_argument("--residual-damp is ", s.residual_damp, ", must be in (0, 1]");
  }
  if (!a->gated_delta_net && s.ssm_state != 0) {
    return invalid_argument(s.arch, " has no Gated DeltaNet layers (ssm_state ", s.ssm_state, ")");
  }
  if (a->output == OutputTensor::kRequired && s.tied) {
    return invalid_argument(s.arch, " cannot tie its classifier to the embedding");
  }
  const int64_t block = gguf::ggml_traits(type).block_size;
  for (const int64_t n : {s.dim, s.ffn, s.heads * hd, s.expert_ffn, s.shared_ffn,
                          s.ssm_v_heads * s.ssm_state}) {
    if (n % block != 0) {
      return invalid_argument("--dim ", s.dim, ", --ffn ", s.ffn, ", --expert-ffn ", s.expert_ffn,
                              " and heads x head_dim ", s.heads * hd, " must be multiples of ",
                              block, " for type ", gguf::ggml_type_name(type));
    }
  }
  return validate_experts(s, *a);
}

std::vector<SynthTensor> plan_synth_tensors(const SynthShape& s, GgmlType type, int64_t vocab) {
  const ArchSpec& a = *find_arch(s.arch);
  const Init norm = a.arch == Arch::kLlama || a.arch == Arch::kQwen2 ? Init::kOnes : Init::kNearOne;
  auto fan_in = [](int64_t n) { return static_cast<float>(1.0 / std::sqrt(double(n))); };
  std::vector<SynthTensor> t;
  t.push_back({"token_embd.weight", {s.dim, vocab}, type, Init::kUniform, fan_in(s.dim)});
  const int64_t half = (s.rope_dim > 0 ? s.rope_dim : head_dim_of(s)) / 2;
  if (s.rope_freqs) t.push_back({"rope_freqs.weight", {half}, GgmlType::kF32, Init::kFactors});
  if (s.rope_scaling == "longrope") {
    t.push_back({"rope_factors_long.weight", {half}, GgmlType::kF32, Init::kFactors});
    t.push_back({"rope_factors_short.weight", {half}, GgmlType::kF32, Init::kFactors});
  }
  for (int64_t l = 0; l < s.layers; ++l) plan_layer(s, a, type, l, norm, t);
  for (int64_t l = s.layers; l < s.layers + s.nextn; ++l) {
    plan_layer(s, a, type, l, norm, t);
    const std::string p = "blk." + std::to_string(l) + ".nextn.";
    t.push_back({p + "eh_proj.weight", {2 * s.dim, s.dim}, type,
                 s.mtp_echo ? Init::kEye : Init::kUniform, fan_in(2 * s.dim)});
    t.push_back({p + "enorm.weight", {s.dim}, GgmlType::kF32, s.mtp_echo ? Init::kOnes : norm});
    t.push_back({p + "hnorm.weight", {s.dim}, GgmlType::kF32, norm});
    if (!s.mtp_echo) t.push_back({p + "shared_head_norm.weight", {s.dim}, GgmlType::kF32, norm});
  }
  t.push_back({"output_norm.weight", {s.dim}, GgmlType::kF32, norm});
  if (!s.tied && a.output != OutputTensor::kTied) {
    t.push_back({"output.weight", {s.dim, vocab}, type, Init::kUniform, fan_in(s.dim)});
  }
  if (s.rank_classes > 0) {
    t.push_back({"cls.output.weight", {s.dim, s.rank_classes}, type, Init::kUniform,
                 fan_in(s.dim)});
  }
  return t;
}

void set_synth_metadata(gguf::GgufWriter& w, const SynthShape& s, GgmlType type, uint64_t seed,
                        int64_t vocab) {
  const std::string a = s.arch;
  const int64_t hd = head_dim_of(s);
  w.set("general.architecture", Value::str(a));
  w.set("general.name", Value::str("arbor-synth " + s.name + " seed " + std::to_string(seed)));
  w.set("general.file_type", Value::u32(file_type_of(type)));
  if (type != GgmlType::kF32 && type != GgmlType::kF16) {
    w.set("general.quantization_version", Value::u32(2));
  }
  w.set(a + ".context_length", Value::u32(uint32_t(s.context)));
  w.set(a + ".embedding_length", Value::u32(uint32_t(s.dim)));
  w.set(a + ".block_count", Value::u32(uint32_t(s.layers + s.nextn)));
  if (s.nextn > 0) w.set(a + ".nextn_predict_layers", Value::u32(uint32_t(s.nextn)));
  w.set(a + ".feed_forward_length", Value::u32(uint32_t(s.ffn)));
  w.set(a + ".rope.dimension_count", Value::u32(uint32_t(s.rope_dim > 0 ? s.rope_dim : hd)));
  w.set(a + ".rope.freq_base", Value::f32(s.rope_theta));
  w.set(a + ".attention.head_count", Value::u32(uint32_t(s.heads)));
  w.set(a + ".attention.head_count_kv", Value::u32(uint32_t(s.kv_heads)));
  if (hd * s.heads != s.dim) {
    w.set(a + ".attention.key_length", Value::u32(uint32_t(hd)));
    w.set(a + ".attention.value_length", Value::u32(uint32_t(hd)));
  }
  w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(s.rms_eps));
  w.set(a + ".vocab_size", Value::u32(uint32_t(vocab)));
  set_arch_keys(w, s);
}

std::vector<uint8_t> make_synth_tensor(const SynthTensor& t, uint64_t seed, size_t index,
                                       kernels::ThreadPool& pool) {
  const int64_t n = t.dims[0];
  int64_t rows = 1;
  for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
  const uint64_t row_bytes = gguf::ggml_row_size(t.type, n);
  std::vector<uint8_t> data(row_bytes * rows);
  pool.parallel_for(rows, [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(n);
    for (int64_t r = begin; r < end; ++r) {
      fill_row(row.data(), n, t, seed, index, r);
      // Type and row length were validated (validate_synth_shape), so this cannot fail.
      const Status st = gguf::quantize_row(t.type, row.data(), data.data() + r * row_bytes, n);
      ARBOR_CHECK(st.ok()) << st.to_string();
    }
  });
  return data;
}

Result<gguf::GgufWriter> synth_model(const SynthShape& s, GgmlType type, uint64_t seed,
                                     int64_t vocab, std::vector<gguf::KeyValue> tokenizer_keys,
                                     kernels::ThreadPool& pool) {
  ARBOR_RETURN_IF_ERROR(validate_synth_shape(s, type));
  gguf::GgufWriter w;
  set_synth_metadata(w, s, type, seed, vocab);
  for (gguf::KeyValue& kv : tokenizer_keys) w.set(kv.key, std::move(kv.value));
  const std::vector<SynthTensor> tensors = plan_synth_tensors(s, type, vocab);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SynthTensor& t = tensors[i];
    w.add_tensor_owned(t.name, t.type, t.dims, make_synth_tensor(t, seed, i, pool));
  }
  return w;
}

}  // namespace arbor::model
