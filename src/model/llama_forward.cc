#include "model/llama_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops.h"
#include "model/rope.h"

namespace arbor::model {

namespace {
// Checkpoints of the non-finite check: after the embedding, then after each block.
int num_checkpoints(const ModelConfig& cfg) { return 1 + 2 * cfg.num_layers; }
}  // namespace

LlamaForward::LlamaForward(const LlamaModel& model, ForwardOps& ops, int32_t reserve_tokens,
                           collective::Collective* collective)
    : model_(model),
      ops_(ops),
      cfg_(model.config()),
      w_(ops.weights()),
      num_heads_(model.tp_size() > 1 ? model.tp_shape().num_heads : cfg_.num_heads),
      num_kv_heads_(model.tp_size() > 1 ? model.tp_shape().num_kv_heads : cfg_.num_kv_heads),
      ffn_dim_(model.tp_size() > 1 ? model.tp_shape().ffn_dim : cfg_.ffn_dim),
      collective_(model.tp_size() > 1 ? collective : nullptr) {
  if (model.tp_size() > 1) {
    ARBOR_CHECK(collective != nullptr && collective->size() == model.tp_size() &&
                collective->rank() == model.tp_rank() && ops.is_host())
        << "a TP rank needs its group's collective and a host device";
  }
  ARBOR_CHECK(!cfg_.ropes.empty() && cfg_.ropes.size() <= kMaxRopes) << cfg_.ropes.size();
  for (size_t r = 0; r < cfg_.ropes.size(); ++r) {
    const RopeVariant& v = cfg_.ropes[r];
    // The host copy of the frequency divisors (the model's, not the device's).
    const float* factors = v.use_freq_factors ? model.weights().rope_freqs : nullptr;
    const std::vector<float> inv_freq = rope_inv_freq(v, cfg_.rope_dim, factors);
    ensure(ropes_[r].inv_freq, std::max<size_t>(1, inv_freq.size()) * sizeof(float));
    ops_.to_device(ropes_[r].inv_freq.p, inv_freq.data(), inv_freq.size() * sizeof(float));
  }
  // The layers' attention layouts: a plan depends on the window, not on the KV cache group.
  std::vector<int32_t> windows;
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    if (cfg_.layers[layer].recurrent) {
      layer_layout_.push_back(-1);
      continue;
    }
    const int32_t w = cfg_.layers[layer].window;
    auto it = std::find(windows.begin(), windows.end(), w);
    if (it == windows.end()) {
      plans_.push_back(ops_.new_attention_plan());
      layout_first_layer_.push_back(layer);
      it = windows.insert(windows.end(), w);
    }
    layer_layout_.push_back(static_cast<int>(it - windows.begin()));
  }
  if (reserve_tokens > 0) reserve(reserve_tokens, reserve_tokens);
}

LlamaForward::~LlamaForward() {
  for (Scratch* s : {&x_, &xb_, &q_, &k_, &v_, &att_, &hb_, &hb2_, &router_, &slot_expert_,
                     &slot_weight_, &slot_pair_, &pair_token_, &expert_indptr_, &pair_out_, &shexp_out_,
                     &qg_, &gate_, &ssm_qkv_, &ssm_mixed_, &ssm_z_, &ssm_beta_, &ssm_alpha_,
                     &ssm_out_, &saved_, &hin_, &mix_,
                     &xl_, &xh_, &logits_, &argmax_, &top_scale_, &top_ids_, &top_logits_,
                     &flags_}) {
    ops_.release(s->p);
  }
  for (Rope& r : ropes_) {
    for (Scratch* s : {&r.inv_freq, &r.cos, &r.sin}) ops_.release(s->p);
  }
}

void LlamaForward::ensure(Scratch& s, size_t bytes) {
  if (s.bytes >= bytes) return;
  ops_.release(s.p);
  Result<void*> p = ops_.allocate(bytes);
  ARBOR_CHECK(p.ok()) << "forward scratch: " << p.status().message();
  s.p = *p;
  s.bytes = bytes;
}

void LlamaForward::reserve(int32_t t, int32_t l) {
  if (t > cap_tokens_) {
    cap_tokens_ = std::max(t, cap_tokens_ * 2);
    const size_t n = cap_tokens_ * sizeof(float);
    ensure(x_, n * cfg_.dim);
    ensure(xb_, n * cfg_.dim);
    const size_t q_dim = static_cast<size_t>(num_heads_) * cfg_.head_dim;
    const size_t kv_dim = static_cast<size_t>(num_kv_heads_) * cfg_.head_dim;
    ensure(q_, n * q_dim);
    ensure(k_, n * kv_dim);
    ensure(v_, n * kv_dim);
    ensure(att_, n * q_dim);
    const int k = cfg_.num_experts_used;
    const size_t ffn_cols =
        cfg_.is_moe() ? std::max(static_cast<size_t>(k) * cfg_.expert_ffn_dim,
                                 static_cast<size_t>(cfg_.shared_expert_ffn_dim))
                      : static_cast<size_t>(ffn_dim_);
    ensure(hb_, n * ffn_cols);
    ensure(hb2_, n * ffn_cols);
    if (cfg_.is_moe()) {
      ensure(router_, n * cfg_.num_experts);
      ensure(slot_expert_, n * k);  // int32 and float alike: 4 bytes per slot
      ensure(slot_weight_, n * k);
      ensure(slot_pair_, n * k);
      ensure(pair_token_, n * k);
      ensure(expert_indptr_, (cfg_.num_experts + 1) * sizeof(int32_t));
      ensure(pair_out_, n * k * cfg_.dim);
      if (cfg_.shared_expert_ffn_dim > 0) ensure(shexp_out_, n * cfg_.dim);
    }
    if (w_.is_mtp_view) {
      ensure(hin_, n * cfg_.dim);
      ensure(mix_, n * 2 * cfg_.dim);
    }
    if (cfg_.attn_output_gate) {
      ensure(qg_, n * 2 * q_dim);
      ensure(gate_, n * q_dim);
    }
    if (cfg_.has_recurrent_layers()) {
      const SsmConfig& ssm = cfg_.ssm;
      ensure(ssm_qkv_, n * ssm.conv_dim());
      ensure(ssm_mixed_, n * ssm.conv_dim());
      ensure(ssm_z_, n * ssm.value_dim());
      ensure(ssm_beta_, n * ssm.num_v_heads);
      ensure(ssm_alpha_, n * ssm.num_v_heads);
      ensure(ssm_out_, n * ssm.value_dim());
    }
    for (size_t r = 0; r < cfg_.ropes.size(); ++r) {
      ensure(ropes_[r].cos, n * std::max(1, cfg_.rope_dim / 2));
      ensure(ropes_[r].sin, n * std::max(1, cfg_.rope_dim / 2));
    }
  }
  if (l > cap_logits_) {
    cap_logits_ = std::max(l, cap_logits_ * 2);
    const size_t n = static_cast<size_t>(cap_logits_);
    ensure(xl_, n * cfg_.dim * sizeof(float));
    if (!ops_.is_host()) {
      ensure(logits_, n * cfg_.vocab_size * sizeof(float));
      ensure(argmax_, n * sizeof(int32_t));
      ensure(top_scale_, n * sizeof(float));
      ensure(top_ids_, n * kMaxDeviceTopK * sizeof(int32_t));
      ensure(top_logits_, n * kMaxDeviceTopK * sizeof(float));
    }
    ensure(flags_, n * num_checkpoints(cfg_));
  }
}

void LlamaForward::embed(const ForwardBatch& batch) {
  const int32_t nt = batch.num_tokens();
  ops_.embed(w_.token_embd, batch.tokens.data(), nt, x_.f());
  if (cfg_.embed_scale != 1.0f) ops_.scale_bias(x_.f(), nt, cfg_.dim, cfg_.embed_scale, nullptr);
  // Positions are the same in every layer: compute each RoPE variant's rotation once per step.
  if (cfg_.rope_dim == 0) return;
  for (size_t r = 0; r < cfg_.ropes.size(); ++r) {
    ops_.rope_tables(batch.positions.data(), nt, ropes_[r].inv_freq.f(), cfg_.rope_dim / 2,
                     cfg_.ropes[r].mscale, ropes_[r].cos.f(), ropes_[r].sin.f());
  }
}

// An MTP head's input (docs/qwen35.md §8): x = eh_proj [rms_norm(x) * enorm ;
// rms_norm(h_prev) * hnorm], the two halves of each row side by side in mix_.
void LlamaForward::mix_mtp_input(std::span<const float> host_hidden, int32_t nt) {
  const MtpInput& m = w_.mtp_input;
  const auto d = static_cast<size_t>(cfg_.dim);
  ARBOR_CHECK_EQ(host_hidden.size(), d * nt) << "an MTP head's batch carries its hidden rows";
  ops_.to_device(hin_.p, host_hidden.data(), host_hidden.size() * sizeof(float));
  ops_.rms_norm_rows(x_.f(), nullptr, nt, m.enorm, xb_.f(), cfg_.dim, cfg_.rms_eps);
  ops_.rms_norm_rows(hin_.f(), nullptr, nt, m.hnorm, hin_.f(), cfg_.dim, cfg_.rms_eps);
  std::vector<DeviceMemory::Copy> copies;
  copies.reserve(2 * static_cast<size_t>(nt));
  for (int32_t t = 0; t < nt; ++t) {
    copies.push_back({mix_.f() + 2 * d * t, xb_.f() + d * t, d * sizeof(float)});
    copies.push_back({mix_.f() + 2 * d * t + d, hin_.f() + d * t, d * sizeof(float)});
  }
  ops_.copy(copies);
  ops_.matmul(m.eh_proj.w, mix_.f(), x_.f(), nt);
  finish_linear(m.eh_proj, x_.f(), nt);
}

// y = y * l.scale + l.bias over [nt, l.w.rows], when the file gives either.
void LlamaForward::finish_linear(const Linear& l, float* y, int32_t nt) {
  if (l.scale != 1.0f || l.bias != nullptr) {
    ops_.scale_bias(y, nt, static_cast<int>(l.w.rows), l.scale, l.bias);
  }
}

// xb (a block's output, [nt, dim]): the post-norm and residual scale the row asks for, then
// x += xb.
void LlamaForward::residual(const float* post_norm, int32_t nt) {
  if (post_norm != nullptr) {
    ops_.rms_norm_rows(xb_.f(), nullptr, nt, post_norm, xb_.f(), cfg_.dim, cfg_.rms_eps);
  }
  if (cfg_.residual_scale != 1.0f) {
    ops_.scale_bias(xb_.f(), nt, cfg_.dim, cfg_.residual_scale, nullptr);
  }
  ops_.add(x_.f(), xb_.f(), (int64_t)nt * cfg_.dim);
}

// The block's input: x normed by `norm`, in xb; x itself without a pre-norm (OLMo 2).
const float* LlamaForward::block_input(const float* norm, int32_t nt) {
  if (norm == nullptr) return x_.f();
  ops_.rms_norm_rows(x_.f(), nullptr, nt, norm, xb_.f(), cfg_.dim, cfg_.rms_eps);
  return xb_.f();
}

kernels::PagedAttentionParams LlamaForward::attention_params(int layer, const ForwardBatch& batch,
                                                             PagedKvCache& cache) const {
  // The layer's KV cache group: its block tables (docs/batch_layout.md).
  const KvGroupArrays kv = batch.kv_group(cache.shape().group_of(layer));
  kernels::PagedAttentionParams p;
  p.num_seqs = batch.num_seqs();
  p.num_q_heads = num_heads_;
  p.num_kv_heads = num_kv_heads_;
  p.head_dim = cfg_.head_dim;
  p.block_size = cache.block_size();
  p.scale = cfg_.attn_scale;
  p.window = cfg_.layers[layer].window;
  p.softcap = cfg_.attn_softcap;
  p.sinks = w_.layers[layer].attn_sinks;
  p.q = q_.f();
  p.out = att_.f();
  p.kv_dtype = cache.shape().dtype;
  p.k_cache = cache.k_pool(layer);
  p.v_cache = cache.v_pool(layer);
  p.qo_indptr = batch.qo_indptr.data();
  p.kv_indptr = kv.kv_indptr.data();
  p.kv_page_indices = kv.kv_page_indices.data();
  p.kv_len = batch.kv_len.data();
  if (!batch.mask_indptr.empty()) {
    p.mask_indptr = batch.mask_indptr.data();
    p.mask_bits = batch.mask_bits.data();
  }
  return p;
}

// Every layer of a layout shares its plan, so it is made once per step, from the layout's first
// layer (any layer of it gives the same plan: what differs between them is not planned on).
void LlamaForward::plan_attention(const ForwardBatch& batch, PagedKvCache& cache) {
  for (size_t i = 0; i < plans_.size(); ++i) {
    ops_.plan_attention(attention_params(layout_first_layer_[i], batch, cache), *plans_[i]);
  }
}

void LlamaForward::project_qkv(const LayerWeights& w, const float* in, int32_t nt) {
  const kernels::WeightView* qkv[] = {&w.q.w, &w.k.w, &w.v.w};
  float* qkv_out[] = {cfg_.attn_output_gate ? qg_.f() : q_.f(), k_.f(), v_.f()};
  ops_.matmul_multi(qkv, in, qkv_out, nt);
  if (cfg_.attn_output_gate) {
    ops_.split_q_gate(qg_.f(), nt, num_heads_, cfg_.head_dim, q_.f(), gate_.f());
  }
}

void LlamaForward::attention_block(int layer, const ForwardBatch& batch, PagedKvCache& cache) {
  const LayerWeights& w = w_.layers[layer];
  const LayerSpec& spec = cfg_.layers[layer];
  const int32_t nt = batch.num_tokens();
  const float* in = block_input(w.attn_norm, nt);
  project_qkv(w, in, nt);

  QkvEpilogue e;
  e.num_tokens = nt;
  e.num_q_heads = num_heads_;
  e.num_kv_heads = num_kv_heads_;
  e.head_dim = cfg_.head_dim;
  e.rope_dim = spec.rope < 0 ? 0 : cfg_.rope_dim;
  e.rope_neox = cfg_.rope_neox;
  e.q = q_.f();
  e.k = k_.f();
  e.v = v_.f();
  e.q_scale = w.q.scale;
  e.k_scale = w.k.scale;
  e.v_scale = w.v.scale;
  e.bq = w.q.bias;
  e.bk = w.k.bias;
  e.bv = w.v.bias;
  e.q_norm = w.q_norm;
  e.k_norm = w.k_norm;
  e.qk_norm_whole = cfg_.spec->qk_norm == QkNorm::kWhole;
  e.norm_eps = cfg_.rms_eps;
  if (spec.rope >= 0) {
    e.cos = ropes_[spec.rope].cos.f();
    e.sin = ropes_[spec.rope].sin.f();
  }
  e.temp_scale = cfg_.attn_temp_scale;
  e.temp_floor = cfg_.attn_temp_floor;
  if (e.temp_scale != 0.0f) e.positions = batch.positions.data();
  // The layer's KV cache group: its block tables and write slots (docs/batch_layout.md).
  const KvGroupArrays kv = batch.kv_group(cache.shape().group_of(layer));
  e.slot_mapping = kv.slot_mapping.data();
  e.k_cache = cache.k_pool(layer);
  e.v_cache = cache.v_pool(layer);
  e.kv_dtype = cache.shape().dtype;
  e.block_size = cache.block_size();
  ops_.qkv_epilogue(e);
  const int layout = layer_layout_[layer];
  ops_.attention(attention_params(layer, batch, cache), *plans_[layout]);
  if (cfg_.attn_output_gate) {
    ops_.sigmoid_mul(att_.f(), gate_.f(), static_cast<int64_t>(nt) * num_heads_ * cfg_.head_dim);
  }

  ops_.matmul_segmented(w.o.w, w.o_segs, att_.f(), xb_.f(), nt);
  all_reduce(xb_.f(), static_cast<int64_t>(nt) * cfg_.dim);
  finish_linear(w.o, xb_.f(), nt);
  residual(w.post_attn_norm, nt);
}

void LlamaForward::delta_net_block(int layer, const ForwardBatch& batch) {
  const LayerWeights& w = w_.layers[layer];
  const int32_t nt = batch.num_tokens();
  const float* in = block_input(w.attn_norm, nt);
  const kernels::WeightView* proj[] = {&w.ssm_qkv.w, &w.ssm_z.w, &w.ssm_beta, &w.ssm_alpha};
  float* proj_out[] = {ssm_qkv_.f(), ssm_z_.f(), ssm_beta_.f(), ssm_alpha_.f()};
  ops_.matmul_multi(proj, in, proj_out, nt);
  kernels::GatedDeltaNetParams p;
  p.num_seqs = batch.num_seqs();
  p.qo_indptr = batch.qo_indptr.data();
  p.kv_len = batch.kv_len.data();
  p.state_slots = batch.state_slots.data();
  if (!batch.state_src.empty()) {
    p.state_src = batch.state_src.data();
    p.state_dst = batch.state_dst.data();
  }
  if (!saved_rows_.empty()) save_recurrent_inputs(layer);
  set_layer_params(layer, p);
  p.z = ssm_z_.f();
  p.out = ssm_out_.f();
  ops_.gated_delta_net(p);
  ops_.matmul(w.ssm_out.w, ssm_out_.f(), xb_.f(), nt);
  residual(w.post_attn_norm, nt);
}

// The layer's shape, weights, states and the qkv / alpha / beta / mixed scratch.
void LlamaForward::set_layer_params(int layer, kernels::GatedDeltaNetParams& p) {
  const LayerWeights& w = w_.layers[layer];
  const SsmConfig& ssm = cfg_.ssm;
  p.num_k_heads = ssm.num_k_heads;
  p.num_v_heads = ssm.num_v_heads;
  p.head_k_dim = ssm.state_size;
  p.head_v_dim = ssm.state_size;
  p.conv_kernel = ssm.conv_kernel;
  p.eps = cfg_.rms_eps;
  p.qkv = ssm_qkv_.f();
  p.alpha = ssm_alpha_.f();
  p.beta = ssm_beta_.f();
  p.conv_w = w.ssm_conv;
  p.dt_bias = w.ssm_dt_bias;
  p.a = w.ssm_a;
  p.norm_w = w.ssm_norm;
  p.conv_state = states_->conv(layer);
  p.ssm_state = states_->ssm(layer);
  p.mixed = ssm_mixed_.f();
}

int64_t LlamaForward::saved_row_floats() const {
  return cfg_.ssm.conv_dim() + 2 * int64_t{cfg_.ssm.num_v_heads};
}

void LlamaForward::save_recurrent_inputs(int layer) {
  int r = 0;  // the layer's index among the recurrent layers
  for (int l = 0; l < layer; ++l) r += cfg_.layers[l].recurrent;
  const auto n = static_cast<int64_t>(saved_rows_.size());
  const int64_t per_layer = saved_row_floats() * n;
  ensure(saved_, static_cast<size_t>(per_layer * cfg_.num_recurrent_layers()) * sizeof(float));
  float* base = saved_.f() + r * per_layer;
  const int64_t c = cfg_.ssm.conv_dim(), hv = cfg_.ssm.num_v_heads;
  std::vector<DeviceMemory::Copy> copies;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = saved_rows_[static_cast<size_t>(i)];
    copies.push_back({base + i * c, ssm_qkv_.f() + row * c, static_cast<size_t>(c) * sizeof(float)});
    copies.push_back({base + n * c + i * hv, ssm_alpha_.f() + row * hv,
                      static_cast<size_t>(hv) * sizeof(float)});
    copies.push_back({base + n * (c + hv) + i * hv, ssm_beta_.f() + row * hv,
                      static_cast<size_t>(hv) * sizeof(float)});
  }
  ops_.copy(copies);
}

void LlamaForward::commit_states(std::span<const StateCommit> commits) {
  ARBOR_CHECK(ops_.is_host()) << "commit_states runs on the host device";
  ARBOR_CHECK(!saved_rows_.empty()) << "commit_states without a speculative run";
  const int64_t c = cfg_.ssm.conv_dim(), hv = cfg_.ssm.num_v_heads;
  const auto T = static_cast<int64_t>(saved_rows_.size());
  std::vector<int32_t> qo_indptr{0}, slots;
  std::vector<int64_t> at;  // each commit row's index among the saved rows, in commit order
  for (const StateCommit& s : commits) {
    for (int32_t row : s.rows) {
      const auto it = std::lower_bound(saved_rows_.begin(), saved_rows_.end(), row);
      ARBOR_CHECK(it != saved_rows_.end() && *it == row) << "row " << row << " was not kept";
      at.push_back(it - saved_rows_.begin());
    }
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(s.rows.size()));
    slots.insert(slots.end(), s.rows.size(), s.slot);
  }
  const int32_t n = qo_indptr.back();
  if (n == 0) return;
  int r = 0;
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    if (!cfg_.layers[layer].recurrent) continue;
    const float* base = saved_.f() + r++ * saved_row_floats() * T;
    for (size_t i = 0; i < at.size(); ++i) {
      std::copy_n(base + at[i] * c, c, ssm_qkv_.f() + i * c);
      std::copy_n(base + T * c + at[i] * hv, hv, ssm_alpha_.f() + i * hv);
      std::copy_n(base + T * (c + hv) + at[i] * hv, hv, ssm_beta_.f() + i * hv);
    }
    kernels::GatedDeltaNetParams p;
    p.num_seqs = static_cast<int32_t>(commits.size());
    p.qo_indptr = qo_indptr.data();
    p.state_src = slots.data();
    p.state_dst = slots.data();
    set_layer_params(layer, p);  // out stays null: states only
    ops_.gated_delta_net(p);
  }
}

// The gated activation over n elements: gate = act(gate) * up (gpt-oss's clamped variant:
// act(gate) * (up + 1), clamped; llama.cpp's fixed alpha and limit).
void LlamaForward::activation(float* gate, const float* up, int64_t n) {
  switch (cfg_.spec->activation) {
    case Activation::kSilu: ops_.silu_mul(gate, up, n); break;
    case Activation::kGeluTanh: ops_.gelu_mul(gate, up, n); break;
    case Activation::kSwigluOai:
      ops_.swiglu_oai(gate, up, n, kSwigluOaiAlpha, kSwigluOaiLimit);
      break;
  }
}

// The mixture-of-experts FFN: every (token, slot) pair through its expert, then each token's
// pairs weighted and summed into xb. gpt-oss adds the router's bias to its logits and each
// expert's biases to its gate, up and down outputs (llama.cpp's ggml_add_id), the down bias
// before the routing weight.
void LlamaForward::moe_block(int layer, int32_t nt) {
  const LayerWeights& w = w_.layers[layer];
  const float* in = block_input(w.ffn_norm, nt);
  const int k = cfg_.num_experts_used;
  ops_.matmul(w.router, in, router_.f(), nt);
  if (w.router_bias != nullptr) {
    ops_.scale_bias(router_.f(), nt, cfg_.num_experts, 1.0f, w.router_bias);
  }
  ExpertRouting r;
  r.num_tokens = nt;
  r.num_experts = cfg_.num_experts;
  r.num_used = k;
  r.renormalize = cfg_.spec->expert_weights_norm;
  r.logits = router_.f();
  r.slot_expert = static_cast<int32_t*>(slot_expert_.p);
  r.slot_weight = slot_weight_.f();
  r.expert_indptr = static_cast<int32_t*>(expert_indptr_.p);
  r.pair_token = static_cast<int32_t*>(pair_token_.p);
  r.slot_pair = static_cast<int32_t*>(slot_pair_.p);
  const int32_t touched = ops_.route_experts(r);
  if (touched >= 0 && experts_touched_ >= 0) {
    experts_touched_ += touched;
  } else {
    experts_touched_ = -1;
  }
  ++moe_layers_run_;
  kernels::ExpertRows rows{cfg_.num_experts, r.expert_indptr, r.pair_token};
  const kernels::ExpertMatmul gate_up[] = {{w.gate_exps, hb_.f()}, {w.up_exps, hb2_.f()}};
  ops_.matmul_experts(gate_up, in, rows);
  rows.src_rows = nullptr;  // from here on the pairs' own rows, already in expert order
  if (w.gate_exps_bias != nullptr) {
    ops_.add_expert_bias(hb_.f(), rows, w.gate_exps_bias, cfg_.expert_ffn_dim);
    ops_.add_expert_bias(hb2_.f(), rows, w.up_exps_bias, cfg_.expert_ffn_dim);
  }
  activation(hb_.f(), hb2_.f(), static_cast<int64_t>(nt) * k * cfg_.expert_ffn_dim);
  const kernels::ExpertMatmul down[] = {{w.down_exps, pair_out_.f()}};
  ops_.matmul_experts(down, hb_.f(), rows);
  if (w.down_exps_bias != nullptr) {
    ops_.add_expert_bias(pair_out_.f(), rows, w.down_exps_bias, cfg_.dim);
  }
  const bool shared = w.shexp_gate.w.data != nullptr;
  if (shared) shared_expert(w, in, nt);  // reads `in` (xb), which the combine overwrites
  ops_.combine_experts(pair_out_.f(), r.slot_pair, r.slot_weight, nt, k, cfg_.dim, xb_.f());
  if (shared) ops_.add_gated_rows(xb_.f(), shexp_out_.f(), router_.f(), nt, cfg_.dim);
  residual(w.post_ffn_norm, nt);
}

// Qwen2-MoE's shared expert of `in`, once the routed experts' outputs are in pair_out_:
// down(silu(gate(in)) * up(in)) into shexp_out_ and its gate's logit in . gate_inp into router_
// (free once routed); moe_block adds it under sigmoid(logit) after the routed sum, as llama.cpp.
void LlamaForward::shared_expert(const LayerWeights& w, const float* in, int32_t nt) {
  const kernels::WeightView* gate_up[] = {&w.shexp_gate.w, &w.shexp_up.w};
  float* gate_up_out[] = {hb_.f(), hb2_.f()};
  ops_.matmul_multi(gate_up, in, gate_up_out, nt);
  ops_.silu_mul(hb_.f(), hb2_.f(), static_cast<int64_t>(nt) * cfg_.shared_expert_ffn_dim);
  ops_.matmul(w.shexp_down.w, hb_.f(), shexp_out_.f(), nt);
  ops_.matmul(w.shexp_gate_inp, in, router_.f(), nt);
}

void LlamaForward::ffn_block(int layer, int32_t nt) {
  if (cfg_.is_moe()) {
    moe_block(layer, nt);
    return;
  }
  const LayerWeights& w = w_.layers[layer];
  const float* in = block_input(w.ffn_norm, nt);
  const kernels::WeightView* gate_up[] = {&w.gate.w, &w.up.w};
  float* gate_up_out[] = {hb_.f(), hb2_.f()};
  ops_.matmul_multi(gate_up, in, gate_up_out, nt);
  finish_linear(w.gate, hb_.f(), nt);
  finish_linear(w.up, hb2_.f(), nt);
  activation(hb_.f(), hb2_.f(), static_cast<int64_t>(nt) * ffn_dim_);
  ops_.matmul_segmented(w.down.w, w.down_segs, hb_.f(), xb_.f(), nt);
  all_reduce(xb_.f(), static_cast<int64_t>(nt) * cfg_.dim);
  finish_linear(w.down, xb_.f(), nt);
  residual(w.post_ffn_norm, nt);
}

namespace {

// Calls fn(first, end, kind) for each maximal run of rows [first, end) that want the same kind.
template <typename Fn>
void for_each_run(std::span<const RowOut> want, int32_t n, Fn fn) {
  for (int32_t first = 0; first < n;) {
    const RowOut kind = want.empty() ? RowOut::kRow : want[first];
    int32_t end = first + 1;
    while (end < n && !want.empty() && want[end] == kind) ++end;
    fn(first, end, kind);
    first = end;
  }
}

}  // namespace

// Every row's logits are computed on the device; what crosses to the host is what `out` asks:
// the argmax and top-k kernels are issued first, then the whole rows, the argmax ids and the
// top-k candidates are read back.
void LlamaForward::compute_logits(const ForwardBatch& batch, const LogitsOut& out) {
  const int32_t nl = batch.num_logits();
  if (nl == 0) return;
  ops_.rms_norm_rows(x_.f(), batch.logits_indices.data(), nl, w_.output_norm, xl_.f(), cfg_.dim,
                     cfg_.rms_eps);
  if (collective_ != nullptr) {
    gather_logits(nl, out);
    return;
  }
  const bool host = ops_.is_host();
  float* logits = host ? out.logits : logits_.f();
  ops_.matmul(w_.output.w, xl_.f(), logits, nl);
  // The architecture's logit transforms, in llama.cpp's order: the tensor's scale, Granite's
  // 1 / logit_scale, Gemma's final soft-cap.
  if (w_.output.scale != 1.0f) {
    ops_.scale_bias(logits, nl, cfg_.vocab_size, w_.output.scale, nullptr);
  }
  if (cfg_.logit_scale != 1.0f) ops_.scale_bias(logits, nl, cfg_.vocab_size, cfg_.logit_scale, nullptr);
  if (cfg_.final_softcap > 0.0f) {
    ops_.softcap(logits, static_cast<int64_t>(nl) * cfg_.vocab_size, cfg_.final_softcap);
  }
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  int32_t* ids = host ? out.argmax : static_cast<int32_t*>(argmax_.p);
  bool any_argmax = false;
  for_each_run(out.want, nl, [&](int32_t first, int32_t end, RowOut kind) {
    if (kind != RowOut::kArgmax) return;
    ARBOR_CHECK(out.argmax != nullptr) << "argmax rows without an argmax array";
    ops_.argmax_rows(logits + first * vocab, end - first, cfg_.vocab_size, ids + first);
    any_argmax = true;
  });
  const bool any_top_k = compute_top_k(out, logits, nl);
  if (host) return;
  for_each_run(out.want, nl, [&](int32_t first, int32_t end, RowOut kind) {
    if (kind != RowOut::kRow) return;
    ops_.to_host(out.logits + first * vocab, logits + first * vocab,
                 (end - first) * vocab * sizeof(float));
  });
  if (any_argmax) ops_.to_host(out.argmax, ids, static_cast<size_t>(nl) * sizeof(int32_t));
  if (any_top_k) {
    const size_t n = static_cast<size_t>(nl) * out.top_k;
    ops_.to_host(out.top_ids, top_ids_.p, n * sizeof(int32_t));
    ops_.to_host(out.top_logits, top_logits_.p, n * sizeof(float));
  }
}

// The hidden_indices rows through the output norm, into out.hidden (host [H, dim]).
void LlamaForward::compute_hidden(const ForwardBatch& batch, const LogitsOut& out) {
  const int32_t nh = batch.num_hidden();
  if (nh == 0) return;
  ARBOR_CHECK(out.hidden != nullptr) << nh << " hidden rows without a hidden array";
  const size_t bytes = static_cast<size_t>(nh) * cfg_.dim * sizeof(float);
  if (ops_.is_host()) {
    ops_.rms_norm_rows(x_.f(), batch.hidden_indices.data(), nh, w_.output_norm, out.hidden,
                       cfg_.dim, cfg_.rms_eps);
    return;
  }
  if (nh > cap_hidden_) {
    cap_hidden_ = std::max(nh, cap_hidden_ * 2);
    ensure(xh_, static_cast<size_t>(cap_hidden_) * cfg_.dim * sizeof(float));
  }
  ops_.rms_norm_rows(x_.f(), batch.hidden_indices.data(), nh, w_.output_norm, xh_.f(), cfg_.dim,
                     cfg_.rms_eps);
  ops_.to_host(out.hidden, xh_.p, bytes);
}

// Issues top_k_rows for each run of kTopK rows of `logits` (device [nl, vocab]); on the host
// straight into `out`, elsewhere into the scratch (the scales uploaded first). Returns whether
// any row is kTopK.
bool LlamaForward::compute_top_k(const LogitsOut& out, const float* logits, int32_t nl) {
  const bool host = ops_.is_host();
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  bool any = false;
  for_each_run(out.want, nl, [&](int32_t first, int32_t end, RowOut kind) {
    if (kind != RowOut::kTopK) return;
    ARBOR_CHECK(out.top_ids != nullptr && out.top_logits != nullptr &&
                static_cast<int32_t>(out.top_k_scale.size()) == nl)
        << "top-k rows without their arrays";
    ARBOR_CHECK(out.top_k >= 1 && out.top_k <= std::min(kMaxDeviceTopK, cfg_.vocab_size))
        << "top_k " << out.top_k;
    if (!any && !host) {
      ops_.to_device(top_scale_.p, out.top_k_scale.data(), static_cast<size_t>(nl) * sizeof(float));
    }
    any = true;
    const float* scale = host ? out.top_k_scale.data() : top_scale_.f();
    int32_t* ids = host ? out.top_ids : static_cast<int32_t*>(top_ids_.p);
    float* values = host ? out.top_logits : top_logits_.f();
    const size_t at = static_cast<size_t>(first) * out.top_k;
    ops_.top_k_rows(logits + first * vocab, end - first, cfg_.vocab_size, out.top_k, scale + first,
                    ids + at, values + at);
  });
  return any;
}

namespace {

// FNV-1a over the batch's arrays (each with its length): the digest every TP collective of the
// step carries, so ranks that were handed different batches notice at the first collective.
template <class T>
void hash_span(uint64_t& h, std::span<const T> v) {
  const auto mix = [&h](const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  const uint64_t n = v.size();
  mix(reinterpret_cast<const uint8_t*>(&n), sizeof(n));
  mix(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

uint64_t batch_digest(const ForwardBatch& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::span<const int32_t> v : {b.tokens, b.positions, b.qo_indptr, b.kv_indptr,
                                     b.kv_page_indices, b.kv_len, b.slot_mapping,
                                     b.logits_indices, b.hidden_indices, b.mask_indptr,
                                     b.state_slots, b.state_src, b.state_dst}) {
    hash_span(h, v);
  }
  hash_span(h, b.mask_bits);
  for (const KvGroupArrays& g : b.more_kv_groups) {
    for (std::span<const int32_t> v : {g.kv_indptr, g.kv_page_indices, g.slot_mapping}) {
      hash_span(h, v);
    }
  }
  return h;
}

// What a rank sends of one greedy row: its vocabulary slice's maximum and argmax.
struct RowBest {
  float max;
  int32_t id;  // global token id; -1: the slice holds an Inf or NaN; -2: the rank has no rows
};

}  // namespace

collective::CollectiveTag LlamaForward::next_tag() {
  return collective::CollectiveTag{step_, digest_, op_++};
}

void LlamaForward::all_reduce(float* y, int64_t n) {
  if (collective_ == nullptr) return;
  const Status s = collective_->all_reduce_sum(y, n, next_tag());
  if (!s.ok() && status_.ok()) status_ = s;
}

// Each rank's [nl, vocab_rows] logits (the architecture's scales and soft-cap applied, which are
// elementwise), then either every row's (max, argmax) when every row wants only its argmax, or
// the whole rows, gathered on rank 0 (which then runs argmax / top-k like compute_logits).
void LlamaForward::gather_logits(int32_t nl, const LogitsOut& out) {
  const TpShape& t = model_.tp_shape();
  const int tp = collective_->size();
  const bool root = collective_->rank() == 0;
  const auto vr = static_cast<int32_t>(t.vocab_rows);
  const size_t vpad = static_cast<size_t>(t.vocab_pad), vocab = cfg_.vocab_size;
  local_logits_.resize(static_cast<size_t>(nl) * vpad);
  float* loc = local_logits_.data();
  if (vr > 0) {
    ops_.matmul(w_.output.w, xl_.f(), loc, nl);
    if (w_.output.scale != 1.0f) ops_.scale_bias(loc, nl, vr, w_.output.scale, nullptr);
    if (cfg_.logit_scale != 1.0f) ops_.scale_bias(loc, nl, vr, cfg_.logit_scale, nullptr);
    if (cfg_.final_softcap > 0.0f) ops_.softcap(loc, (int64_t)nl * vr, cfg_.final_softcap);
  }
  const bool argmax_only =
      !out.want.empty() &&
      std::all_of(out.want.begin(), out.want.end(), [](RowOut k) { return k == RowOut::kArgmax; });
  if (argmax_only) {
    std::vector<RowBest> mine(static_cast<size_t>(nl), RowBest{0.0f, -2});
    if (vr > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(nl));
      ops_.argmax_rows(loc, nl, vr, ids.data());
      for (int32_t i = 0; i < nl; ++i) {
        mine[i] = ids[i] < 0 ? RowBest{0.0f, -1}
                             : RowBest{loc[(size_t)i * vr + ids[i]],
                                       static_cast<int32_t>(t.vocab_begin + ids[i])};
      }
    }
    std::vector<RowBest> all(root ? static_cast<size_t>(tp) * nl : 0);
    const Status s = collective_->gather(mine.data(), mine.size() * sizeof(RowBest),
                                         root ? all.data() : nullptr, next_tag());
    if (!s.ok() && status_.ok()) status_ = s;
    if (!root || !status_.ok()) return;
    ARBOR_CHECK(out.argmax != nullptr) << "argmax rows without an argmax array";
    for (int32_t i = 0; i < nl; ++i) {
      int32_t best = -2;
      float best_max = 0.0f;
      bool finite = true;
      // Ranks hold increasing ids: keeping the first strict maximum keeps the lowest id.
      for (int r = 0; r < tp; ++r) {
        const RowBest& b = all[(size_t)r * nl + i];
        if (b.id == -1) finite = false;
        if (b.id >= 0 && (best < 0 || b.max > best_max)) best = b.id, best_max = b.max;
      }
      out.argmax[i] = finite ? best : -1;
    }
    return;
  }
  gathered_.resize(root ? static_cast<size_t>(tp) * nl * vpad : 0);
  const Status s = collective_->gather(loc, static_cast<size_t>(nl) * vpad * sizeof(float),
                                       root ? gathered_.data() : nullptr, next_tag());
  if (!s.ok() && status_.ok()) status_ = s;
  if (!root || !status_.ok()) return;
  for (int r = 0; r < tp; ++r) {
    const TpShape tr = tp_shape(cfg_, r, tp);
    const float* src = gathered_.data() + (size_t)r * nl * vpad;
    for (int32_t i = 0; i < nl; ++i) {
      std::copy_n(src + (size_t)i * tr.vocab_rows, tr.vocab_rows,
                  out.logits + (size_t)i * vocab + tr.vocab_begin);
    }
  }
  for_each_run(out.want, nl, [&](int32_t first, int32_t end, RowOut kind) {
    if (kind != RowOut::kArgmax) return;
    ARBOR_CHECK(out.argmax != nullptr) << "argmax rows without an argmax array";
    ops_.argmax_rows(out.logits + first * vocab, end - first, cfg_.vocab_size, out.argmax + first);
  });
  compute_top_k(out, out.logits, nl);
}

void LlamaForward::run(const ForwardBatch& host_batch, PagedKvCache& cache,
                       const LogitsOut& out) {
  status_ = ok_status();
  saved_rows_.assign(host_batch.replay_rows.begin(), host_batch.replay_rows.end());
  experts_touched_ = 0;
  moe_layers_run_ = 0;
  const KvCacheShape& s = cache.shape();
  ARBOR_CHECK(s.num_layers == cfg_.num_layers && s.num_kv_heads == num_kv_heads_ &&
              s.head_dim == cfg_.head_dim)
      << "KV cache shape does not match the model";
  const int32_t nt = host_batch.num_tokens();
  if (nt == 0) return;
  const int32_t nl = host_batch.num_logits();
  ARBOR_CHECK(out.want.empty() || static_cast<int32_t>(out.want.size()) == nl)
      << out.want.size() << " row kinds for " << nl << " logits rows";
  reserve(nt, nl);
  ++step_;
  op_ = 0;
  if (collective_ != nullptr) digest_ = batch_digest(host_batch);
  const ForwardBatch batch = ops_.stage(host_batch);
  plan_attention(batch, cache);
  flags_host_.assign((size_t)nl * num_checkpoints(cfg_), 0);
  if (!flags_host_.empty()) ops_.to_device(flags_.p, flags_host_.data(), flags_host_.size());
  embed(batch);
  if (w_.is_mtp_view) mix_mtp_input(host_batch.input_hidden, nt);
  flag_nonfinite(batch, 0);
  ARBOR_CHECK(!cfg_.has_recurrent_layers() ||
              (states_ != nullptr && batch.state_slots.size() == (size_t)batch.num_seqs()))
      << "a model with recurrent layers runs with its states and a state slot per sequence";
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    if (cfg_.layers[layer].recurrent) {
      delta_net_block(layer, batch);
    } else {
      attention_block(layer, batch, cache);
    }
    flag_nonfinite(batch, 1 + 2 * layer);
    ffn_block(layer, nt);
    flag_nonfinite(batch, 2 + 2 * layer);
  }
  compute_logits(batch, out);
  compute_hidden(batch, out);
  name_nonfinite(nl, out);
}

void LlamaForward::flag_nonfinite(const ForwardBatch& batch, int checkpoint) {
  const int32_t nl = batch.num_logits();
  if (nl == 0) return;
  ops_.flag_nonfinite(x_.f(), batch.logits_indices.data(), nl, cfg_.dim,
                      static_cast<uint8_t*>(flags_.p) + (size_t)checkpoint * nl);
}

void LlamaForward::name_nonfinite(int32_t nl, const LogitsOut& out) {
  nonfinite_origin_.assign(static_cast<size_t>(nl), std::string());
  // TP: only rank 0 has the logits (and a broken step's are garbage).
  if (nl == 0 || !status_.ok() || (collective_ != nullptr && collective_->rank() != 0)) return;
  ops_.to_host(flags_host_.data(), flags_.p, flags_host_.size());
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  for (int32_t i = 0; i < nl; ++i) {
    for (int c = 0; c < num_checkpoints(cfg_); ++c) {
      if (flags_host_[(size_t)c * nl + i] == 0) continue;
      nonfinite_origin_[i] =
          c == 0 ? std::string("the token embedding")
                 : str_cat("layer ", (c - 1) / 2, "'s ", c % 2 == 1 ? "attention" : "feed-forward",
                           " block");
      break;
    }
    if (!nonfinite_origin_[i].empty()) continue;
    const float* row = out.logits + static_cast<size_t>(i) * vocab;
    const RowOut kind = out.want.empty() ? RowOut::kRow : out.want[i];
    bool finite = true;
    switch (kind) {
      case RowOut::kRow:
        finite = !kernels::any_nonfinite(row, static_cast<int64_t>(vocab));
        break;
      case RowOut::kArgmax: finite = out.argmax[i] >= 0; break;
      case RowOut::kTopK: finite = out.top_ids[static_cast<size_t>(i) * out.top_k] >= 0; break;
    }
    if (!finite) {
      nonfinite_origin_[i] = "the output norm or classifier";
    }
  }
}

}  // namespace arbor::model
