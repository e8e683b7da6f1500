#include "model/llama_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/ops.h"

namespace arbor::model {

using kernels::ThreadPool;

LlamaForward::LlamaForward(const LlamaModel& model, int32_t reserve_tokens)
    : model_(model), cfg_(model.config()) {
  kernels::RopeParams rope;
  rope.theta = cfg_.rope_theta;
  rope.neox = cfg_.rope_neox;
  if (cfg_.rope_scaling == RopeScaling::kLlama3) {
    rope.factor = cfg_.rope_factor;
    rope.low_freq_factor = cfg_.rope_low_freq_factor;
    rope.high_freq_factor = cfg_.rope_high_freq_factor;
    rope.original_context = cfg_.rope_original_context;
  }
  inv_freq_.resize(cfg_.rope_dim / 2);
  kernels::rope_inv_freqs(rope, cfg_.rope_dim, inv_freq_.data());
  if (const float* factors = model.weights().rope_freqs) {
    for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= factors[i];
  }
  if (reserve_tokens > 0) reserve(reserve_tokens, reserve_tokens);
}

void LlamaForward::reserve(int32_t t, int32_t l) {
  if (t > cap_tokens_) {
    cap_tokens_ = std::max(t, cap_tokens_ * 2);
    const size_t n = cap_tokens_;
    x_.resize(n * cfg_.dim);
    xb_.resize(n * cfg_.dim);
    q_.resize(n * cfg_.q_dim());
    k_.resize(n * cfg_.kv_dim());
    v_.resize(n * cfg_.kv_dim());
    att_.resize(n * cfg_.q_dim());
    hb_.resize(n * cfg_.ffn_dim);
    hb2_.resize(n * cfg_.ffn_dim);
    rope_cos_.resize(n * (cfg_.rope_dim / 2));
    rope_sin_.resize(n * (cfg_.rope_dim / 2));
  }
  if (l > cap_logits_) {
    cap_logits_ = std::max(l, cap_logits_ * 2);
    xl_.resize((size_t)cap_logits_ * cfg_.dim);
  }
}

void LlamaForward::norm_rows(const float* in, const float* weight, float* out, int32_t rows,
                             ThreadPool& pool) {
  const int dim = cfg_.dim;
  const float eps = cfg_.rms_eps;
  pool.parallel_for(rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::rms_norm(in + t * dim, weight, out + t * dim, dim, eps);
    }
  });
}

void LlamaForward::embed(const ForwardBatch& batch, ThreadPool& pool) {
  const int dim = cfg_.dim;
  const int half = cfg_.rope_dim / 2;
  const kernels::WeightView& embd = model_.weights().token_embd;
  pool.parallel_for(batch.num_tokens(), [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::get_row(embd, batch.tokens[t], x_.data() + t * dim);
      // Positions are the same in every layer: compute the rotation once per step.
      const float pos = (float)batch.positions[t];
      for (int i = 0; i < half; ++i) {
        const float angle = pos * inv_freq_[i];
        rope_cos_[t * half + i] = std::cos(angle);
        rope_sin_[t * half + i] = std::sin(angle);
      }
    }
  });
}

void LlamaForward::qkv_rope_store(int layer, const ForwardBatch& batch, PagedKvCache& cache,
                                  ThreadPool& pool) {
  const LayerWeights& w = model_.weights().layers[layer];
  const int32_t nt = batch.num_tokens();
  const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), half = cfg_.rope_dim / 2;
  const kernels::WeightView* qkv[] = {&w.wq, &w.wk, &w.wv};
  float* qkv_out[] = {q_.data(), k_.data(), v_.data()};
  kernels::matmul_multi(qkv, xb_.data(), qkv_out, nt, pool);
  pool.parallel_for(nt, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float* q = q_.data() + t * qd;
      float* k = k_.data() + t * kvd;
      float* v = v_.data() + t * kvd;
      if (w.bq != nullptr) kernels::add(q, w.bq, qd);
      if (w.bk != nullptr) kernels::add(k, w.bk, kvd);
      if (w.bv != nullptr) kernels::add(v, w.bv, kvd);
      const float* c = rope_cos_.data() + t * half;
      const float* s = rope_sin_.data() + t * half;
      kernels::rope_apply(q, cfg_.num_heads, cfg_.head_dim, cfg_.rope_dim, cfg_.rope_neox, c, s);
      kernels::rope_apply(k, cfg_.num_kv_heads, cfg_.head_dim, cfg_.rope_dim, cfg_.rope_neox, c, s);
      // Distinct tokens have distinct slots, so concurrent writes never overlap.
      cache.write_token(layer, batch.slot_mapping[t], k, v);
    }
  });
}

void LlamaForward::attention_block(int layer, const ForwardBatch& batch, PagedKvCache& cache,
                                   ThreadPool& pool) {
  const LayerWeights& w = model_.weights().layers[layer];
  const int32_t nt = batch.num_tokens();
  norm_rows(x_.data(), w.attn_norm, xb_.data(), nt, pool);
  qkv_rope_store(layer, batch, cache, pool);

  kernels::PagedAttentionParams p;
  p.num_seqs = batch.num_seqs();
  p.num_q_heads = cfg_.num_heads;
  p.num_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.block_size = cache.block_size();
  p.scale = 1.0f / std::sqrt((float)cfg_.head_dim);
  p.q = q_.data();
  p.out = att_.data();
  p.kv_dtype = cache.shape().dtype;
  p.k_cache = cache.k_pool(layer);
  p.v_cache = cache.v_pool(layer);
  p.qo_indptr = batch.qo_indptr.data();
  p.kv_indptr = batch.kv_indptr.data();
  p.kv_page_indices = batch.kv_page_indices.data();
  p.kv_len = batch.kv_len.data();
  if (!batch.mask_indptr.empty()) {
    p.mask_indptr = batch.mask_indptr.data();
    p.mask_bits = batch.mask_bits.data();
  }
  kernels::paged_attention(p, pool);

  kernels::matmul(w.wo, att_.data(), xb_.data(), nt, pool);
  kernels::add(x_.data(), xb_.data(), (int64_t)nt * cfg_.dim);
}

void LlamaForward::ffn_block(int layer, int32_t nt, ThreadPool& pool) {
  const LayerWeights& w = model_.weights().layers[layer];
  norm_rows(x_.data(), w.ffn_norm, xb_.data(), nt, pool);
  const kernels::WeightView* gate_up[] = {&w.w_gate, &w.w_up};
  float* gate_up_out[] = {hb_.data(), hb2_.data()};
  kernels::matmul_multi(gate_up, xb_.data(), gate_up_out, nt, pool);
  kernels::silu_mul(hb_.data(), hb2_.data(), (int64_t)nt * cfg_.ffn_dim);
  kernels::matmul(w.w_down, hb_.data(), xb_.data(), nt, pool);
  kernels::add(x_.data(), xb_.data(), (int64_t)nt * cfg_.dim);
}

void LlamaForward::compute_logits(const ForwardBatch& batch, ThreadPool& pool, float* logits) {
  const int32_t nl = batch.num_logits();
  if (nl == 0) return;
  const int dim = cfg_.dim;
  const LlamaWeights& w = model_.weights();
  for (int32_t i = 0; i < nl; ++i) {
    kernels::rms_norm(x_.data() + (size_t)batch.logits_indices[i] * dim, w.output_norm,
                      xl_.data() + (size_t)i * dim, dim, cfg_.rms_eps);
  }
  kernels::matmul(w.output, xl_.data(), logits, nl, pool);
}

void LlamaForward::run(const ForwardBatch& batch, PagedKvCache& cache, ThreadPool& pool,
                       float* logits) {
  const KvCacheShape& s = cache.shape();
  ARBOR_CHECK(s.num_layers == cfg_.num_layers && s.num_kv_heads == cfg_.num_kv_heads &&
              s.head_dim == cfg_.head_dim)
      << "KV cache shape does not match the model";
  const int32_t nt = batch.num_tokens();
  if (nt == 0) return;
  reserve(nt, batch.num_logits());
  nonfinite_origin_.assign(static_cast<size_t>(batch.num_logits()), std::string());
  embed(batch, pool);
  note_nonfinite(batch, -1, "");
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    attention_block(layer, batch, cache, pool);
    note_nonfinite(batch, layer, "attention");
    ffn_block(layer, nt, pool);
    note_nonfinite(batch, layer, "feed-forward");
  }
  compute_logits(batch, pool, logits);
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  for (int32_t i = 0; i < batch.num_logits(); ++i) {
    if (!nonfinite_origin_[i].empty()) continue;
    const float* row = logits + static_cast<size_t>(i) * vocab;
    if (!std::all_of(row, row + vocab, [](float v) { return std::isfinite(v); })) {
      nonfinite_origin_[i] = "the output norm or classifier";
    }
  }
}

void LlamaForward::note_nonfinite(const ForwardBatch& batch, int layer, const char* block) {
  const int dim = cfg_.dim;
  for (int32_t i = 0; i < batch.num_logits(); ++i) {
    if (!nonfinite_origin_[i].empty()) continue;
    const float* row = x_.data() + static_cast<size_t>(batch.logits_indices[i]) * dim;
    uint32_t bad = 0;  // an all-ones exponent: Inf or NaN (integer ops, so it vectorises)
    for (int c = 0; c < dim; ++c) {
      uint32_t bits;
      std::memcpy(&bits, row + c, sizeof(bits));
      bad |= (bits & 0x7F800000u) == 0x7F800000u;
    }
    if (bad == 0) continue;
    nonfinite_origin_[i] =
        layer < 0 ? std::string("the token embedding")
                  : str_cat("layer ", layer, "'s ", block, " block");
  }
}

}  // namespace arbor::model
