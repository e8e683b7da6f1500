#include "model/cpu_forward_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "collective/collective.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"

namespace arbor::model {

void CpuForwardOps::embed(const kernels::WeightView &table,
                          const int32_t *tokens, int32_t n, float *x) {
  const int64_t dim = table.cols;
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t)
      kernels::get_row(table, tokens[t], x + t * dim);
  });
}

void CpuForwardOps::rope_tables(const int32_t *positions, int32_t n,
                                const float *inv_freq, int half, float mscale,
                                float *cos, float *sin) {
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float pos = (float)positions[t];
      for (int i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos[t * half + i] = std::cos(angle);
        sin[t * half + i] = std::sin(angle);
      }
      if (mscale != 1.0f) {
        kernels::scale(cos + t * half, mscale, half);
        kernels::scale(sin + t * half, mscale, half);
      }
    }
  });
}

void CpuForwardOps::rms_norm_rows(const float *x, const int32_t *rows,
                                  int32_t n, const float *weight, float *y,
                                  int dim, float eps) {
  if (rows != nullptr) { // the few logits rows: not worth waking the pool
    for (int32_t r = 0; r < n; ++r) {
      kernels::rms_norm(x + (size_t)rows[r] * dim, weight, y + (size_t)r * dim,
                        dim, eps);
    }
    return;
  }
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::rms_norm(x + t * dim, weight, y + t * dim, dim, eps);
    }
  });
}

void CpuForwardOps::matmul_multi(std::span<const kernels::WeightView *const> ws,
                                 const float *x, std::span<float *const> ys,
                                 int32_t num_tokens) {
  kernels::matmul_multi(ws, x, ys, num_tokens, pool_);
}

void CpuForwardOps::matmul_segmented(const kernels::WeightView &whole,
                                     std::span<const kernels::WeightView> segs,
                                     const float *x, float *y,
                                     int32_t num_tokens) {
  if (segs.size() <= 1) {
    kernels::matmul(segs.empty() ? whole : segs[0], x, y, num_tokens, pool_);
    return;
  }
  const size_t n = static_cast<size_t>(num_tokens) * whole.rows;
  segment_out_.resize((segs.size() - 1) * n);
  const kernels::WeightView *ws[kMaxSegments];
  float *ys[kMaxSegments];
  ARBOR_CHECK_LE(segs.size(), static_cast<size_t>(kMaxSegments));
  for (size_t i = 0; i < segs.size(); ++i) {
    ws[i] = &segs[i];
    ys[i] = i == 0 ? y : segment_out_.data() + (i - 1) * n;
  }
  kernels::matmul_segments({ws, segs.size()}, x, {ys, segs.size()}, num_tokens,
                           pool_);
  const float *parts[kMaxSegments];
  std::copy_n(ys, segs.size(), parts);
  collective::tree_sum({parts, segs.size()}, y, static_cast<int64_t>(n));
}

namespace {

// The optional steps of an epilogue before RoPE for one token: scales, biases and QK-norm on
// q ([num_q_heads, head_dim]), k and v ([num_kv_heads, head_dim]).
void pre_rope(const QkvEpilogue &p, float *q, float *k, float *v) {
  const int qd = p.num_q_heads * p.head_dim, kvd = p.num_kv_heads * p.head_dim;
  if (p.q_scale != 1.0f)
    kernels::scale(q, p.q_scale, qd);
  if (p.k_scale != 1.0f)
    kernels::scale(k, p.k_scale, kvd);
  if (p.v_scale != 1.0f)
    kernels::scale(v, p.v_scale, kvd);
  if (p.bq != nullptr)
    kernels::add(q, p.bq, qd);
  if (p.bk != nullptr)
    kernels::add(k, p.bk, kvd);
  if (p.bv != nullptr)
    kernels::add(v, p.bv, kvd);
  if (p.q_norm == nullptr)
    return;
  if (p.qk_norm_whole) {
    kernels::rms_norm(q, p.q_norm, q, qd, p.norm_eps);
    kernels::rms_norm(k, p.k_norm, k, kvd, p.norm_eps);
    return;
  }
  for (int h = 0; h < p.num_q_heads; ++h)
    kernels::rms_norm(q + h * p.head_dim, p.q_norm, q + h * p.head_dim,
                      p.head_dim, p.norm_eps);
  for (int h = 0; h < p.num_kv_heads; ++h)
    kernels::rms_norm(k + h * p.head_dim, p.k_norm, k + h * p.head_dim,
                      p.head_dim, p.norm_eps);
}

} // namespace

void CpuForwardOps::qkv_epilogue(const QkvEpilogue &p) {
  const int qd = p.num_q_heads * p.head_dim, kvd = p.num_kv_heads * p.head_dim;
  const int half = p.rope_dim / 2;
  KvCacheShape shape;
  shape.num_kv_heads = p.num_kv_heads;
  shape.head_dim = p.head_dim;
  shape.block_size = p.block_size;
  shape.dtype = p.kv_dtype;
  pool_.parallel_for(p.num_tokens, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float *q = p.q + t * qd;
      float *k = p.k + t * kvd;
      float *v = p.v + t * kvd;
      pre_rope(p, q, k, v);
      if (half > 0) {
        const float *c = p.cos + t * half;
        const float *s = p.sin + t * half;
        kernels::rope_apply(q, p.num_q_heads, p.head_dim, p.rope_dim,
                            p.rope_neox, c, s);
        kernels::rope_apply(k, p.num_kv_heads, p.head_dim, p.rope_dim,
                            p.rope_neox, c, s);
      }
      if (p.temp_scale != 0.0f) { // Llama 4 / Mistral 3 attention temperature
        const double steps = std::floor((double)p.positions[t] / p.temp_floor);
        kernels::scale(q, (float)(std::log(steps + 1.0) * p.temp_scale + 1.0),
                       qd);
      }
      // Distinct tokens have distinct slots, so concurrent writes never
      // overlap.
      store_kv_token(shape, p.k_cache, p.v_cache, p.slot_mapping[t], k, v);
    }
  });
}

namespace {

struct CpuAttentionPlan final : AttentionPlan {
  kernels::PagedAttentionPlan plan;
};

} // namespace

std::unique_ptr<AttentionPlan> CpuForwardOps::new_attention_plan() {
  return std::make_unique<CpuAttentionPlan>();
}

void CpuForwardOps::plan_attention(const kernels::PagedAttentionParams &p,
                                   AttentionPlan &plan) {
  auto *cpu = dynamic_cast<CpuAttentionPlan *>(&plan);
  ARBOR_CHECK(cpu != nullptr) << "an attention plan of another device";
  kernels::plan_paged_attention(p, pool_.num_threads(), cpu->plan);
}

void CpuForwardOps::attention(const kernels::PagedAttentionParams &p,
                              const AttentionPlan &plan) {
  const auto *cpu = dynamic_cast<const CpuAttentionPlan *>(&plan);
  ARBOR_CHECK(cpu != nullptr) << "an attention plan of another device";
  kernels::paged_attention(p, cpu->plan, pool_);
}

int32_t CpuForwardOps::route_experts(const ExpertRouting &r) {
  const int k = r.num_used;
  auto route = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::route_softmax_top_k(r.logits + t * r.num_experts, r.num_experts,
                                   k, r.slot_expert + t * k,
                                   r.slot_weight + t * k, r.renormalize);
    }
  };
  if (r.num_tokens < 2 * pool_.num_threads()) {
    route(0, r.num_tokens, 0);
  } else {
    pool_.parallel_for(r.num_tokens, route);
  }
  kernels::sort_pairs_by_expert(r.slot_expert, r.num_tokens, k, r.num_experts,
                                r.expert_indptr, r.pair_token, r.slot_pair);
  int32_t touched = 0;
  for (int e = 0; e < r.num_experts; ++e) {
    touched += r.expert_indptr[e + 1] > r.expert_indptr[e] ? 1 : 0;
  }
  return touched;
}

void CpuForwardOps::matmul_experts(std::span<const kernels::ExpertMatmul> mats,
                                   const float *x,
                                   const kernels::ExpertRows &rows) {
  kernels::matmul_experts(mats, x, rows, pool_);
}

void CpuForwardOps::combine_experts(const float *pairs,
                                    const int32_t *slot_pair,
                                    const float *slot_weight,
                                    int32_t num_tokens, int k, int dim,
                                    float *y) {
  auto combine = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float *out = y + t * dim;
      const int32_t *at = slot_pair + t * k;
      const float *w = slot_weight + t * k;
      std::memcpy(out, pairs + (int64_t)at[0] * dim, dim * sizeof(float));
      kernels::scale(out, w[0], dim);
      for (int j = 1; j < k; ++j) {
        kernels::axpy(out, w[j], pairs + (int64_t)at[j] * dim, dim);
      }
    }
  };
  if (num_tokens < 2 * pool_.num_threads()) {
    combine(0, num_tokens, 0);
  } else {
    pool_.parallel_for(num_tokens, combine);
  }
}

void CpuForwardOps::gated_delta_net(const kernels::GatedDeltaNetParams &p) {
  kernels::gated_delta_net(p, pool_);
}

void CpuForwardOps::split_q_gate(const float *qg, int32_t num_tokens, int heads,
                                 int head_dim, float *q, float *gate) {
  const int64_t rows = int64_t{num_tokens} * heads;
  const size_t bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(q + r * head_dim, qg + 2 * r * head_dim, bytes);
    std::memcpy(gate + r * head_dim, qg + (2 * r + 1) * head_dim, bytes);
  }
}

void CpuForwardOps::sigmoid_mul(float *x, const float *gate, int64_t n) {
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }, 4096);
}

void CpuForwardOps::add(float *y, const float *x, int64_t n) {
  kernels::add(y, x, n);
}

void CpuForwardOps::add_gated_rows(float *y, const float *x, const float *gate,
                                   int32_t rows, int cols) {
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float s = 1.0f / (1.0f + std::exp(-gate[t]));
      kernels::axpy(y + t * cols, s, x + t * cols, cols);
    }
  };
  if (rows < 2 * pool_.num_threads()) {
    run(0, rows, 0);
  } else {
    pool_.parallel_for(rows, run);
  }
}

// Below this many elements an element-wise op costs less than waking the pool
// (a decode step's FFN activation, 3-8k elements, takes 2-5 us on one core;
// five tokens' took 7 us, 4 split over two).
constexpr int64_t kParallelElements = 8192;

template <class Fn>
void CpuForwardOps::split_elements(int64_t n, const Fn &fn) {
  const int64_t chunks = pool_.num_threads();
  if (n < kParallelElements || chunks < 2) {
    fn(0, n);
    return;
  }
  // One pointer captured, so the pool's std::function stores it inline.
  const struct {
    int64_t n, per;
    const Fn &fn;
  } split{n, ((n + chunks - 1) / chunks + 15) / 16 * 16, fn};
  pool_.parallel_for(chunks, [s = &split](int64_t begin, int64_t end, int) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t i0 = c * s->per, i1 = std::min(s->n, i0 + s->per);
      if (i0 < i1)
        s->fn(i0, i1);
    }
  });
}

void CpuForwardOps::silu_mul(float *gate, const float *up, int64_t n) {
  split_elements(n, [&](int64_t i0, int64_t i1) {
    kernels::silu_mul(gate + i0, up + i0, i1 - i0);
  });
}

void CpuForwardOps::gelu_mul(float *gate, const float *up, int64_t n) {
  split_elements(n, [&](int64_t i0, int64_t i1) {
    kernels::gelu_mul(gate + i0, up + i0, i1 - i0);
  });
}

void CpuForwardOps::swiglu_oai(float *gate, const float *up, int64_t n,
                               float alpha, float limit) {
  split_elements(n, [&](int64_t i0, int64_t i1) {
    kernels::swiglu_oai(gate + i0, up + i0, i1 - i0, alpha, limit);
  });
}

void CpuForwardOps::add_expert_bias(float *y, const kernels::ExpertRows &rows,
                                    const float *bias, int cols) {
  kernels::add_expert_bias(y, rows, bias, cols, pool_);
}

void CpuForwardOps::scale_bias(float *y, int32_t rows, int cols, float scale,
                               const float *bias) {
  pool_.parallel_for(rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      float *row = y + r * cols;
      if (scale != 1.0f)
        kernels::scale(row, scale, cols);
      if (bias != nullptr)
        kernels::add(row, bias, cols);
    }
  });
}

void CpuForwardOps::softcap(float *x, int64_t n, float cap) {
  kernels::softcap(x, n, cap);
}

void CpuForwardOps::flag_nonfinite(const float *x, const int32_t *rows,
                                   int32_t n, int dim, uint8_t *flags) {
  for (int32_t i = 0; i < n; ++i) {
    if (kernels::any_nonfinite(x + static_cast<size_t>(rows[i]) * dim, dim))
      flags[i] = 1;
  }
}

void CpuForwardOps::argmax_rows(const float *x, int32_t n, int32_t cols,
                                int32_t *ids) {
  for (int32_t r = 0; r < n; ++r) {
    const float *row = x + static_cast<size_t>(r) * cols;
    int32_t best = 0;
    bool finite = true;
    for (int32_t c = 0; c < cols; ++c) {
      finite = finite && std::isfinite(row[c]);
      if (row[c] > row[best]) best = c;
    }
    ids[r] = finite ? best : -1;
  }
}

void CpuForwardOps::top_k_rows(const float *x, int32_t n, int32_t cols,
                               int32_t k, const float *scale, int32_t *ids,
                               float *values) {
  kernels::top_k_rows(x, n, cols, k, scale, ids, values);
}

} // namespace arbor::model
