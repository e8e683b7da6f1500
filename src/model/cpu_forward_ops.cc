#include "model/cpu_forward_ops.h"

#include <cmath>
#include <cstring>

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
                                const float *inv_freq, int half, float *cos,
                                float *sin) {
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float pos = (float)positions[t];
      for (int i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos[t * half + i] = std::cos(angle);
        sin[t * half + i] = std::sin(angle);
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
      if (p.bq != nullptr)
        kernels::add(q, p.bq, qd);
      if (p.bk != nullptr)
        kernels::add(k, p.bk, kvd);
      if (p.bv != nullptr)
        kernels::add(v, p.bv, kvd);
      const float *c = p.cos + t * half;
      const float *s = p.sin + t * half;
      kernels::rope_apply(q, p.num_q_heads, p.head_dim, p.rope_dim, p.rope_neox,
                          c, s);
      kernels::rope_apply(k, p.num_kv_heads, p.head_dim, p.rope_dim,
                          p.rope_neox, c, s);
      // Distinct tokens have distinct slots, so concurrent writes never
      // overlap.
      store_kv_token(shape, p.k_cache, p.v_cache, p.slot_mapping[t], k, v);
    }
  });
}

void CpuForwardOps::attention(const kernels::PagedAttentionParams &p) {
  kernels::paged_attention(p, pool_);
}

void CpuForwardOps::add(float *y, const float *x, int64_t n) {
  kernels::add(y, x, n);
}

void CpuForwardOps::silu_mul(float *gate, const float *up, int64_t n) {
  kernels::silu_mul(gate, up, n);
}

void CpuForwardOps::flag_nonfinite(const float *x, const int32_t *rows,
                                   int32_t n, int dim, uint8_t *flags) {
  for (int32_t i = 0; i < n; ++i) {
    const float *row = x + static_cast<size_t>(rows[i]) * dim;
    uint32_t bad =
        0; // an all-ones exponent: Inf or NaN (integer ops, so it vectorises)
    for (int c = 0; c < dim; ++c) {
      uint32_t bits;
      std::memcpy(&bits, row + c, sizeof(bits));
      bad |= (bits & 0x7F800000u) == 0x7F800000u;
    }
    if (bad != 0)
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
