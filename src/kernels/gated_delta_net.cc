#include "kernels/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "base/check.h"
#include "kernels/avx2_target.h"
#include "kernels/cpu_features.h"

namespace arbor::kernels {
namespace {

constexpr int kLanes = 8;           // partial sums of the dot products (vectorisable, fixed order)
constexpr int64_t kConvChunk = 64;  // channels per conv work item

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// ggml's softplus: x above 20 as is, else log1p(exp(x)).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// sum_i a[i] * b[i] over n (a multiple of kLanes) in kLanes partial sums, then a fixed tree.
float dot(const float* a, const float* b, int n) {
  float acc[kLanes] = {};
  for (int i = 0; i < n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

float sum_squares(const float* x, int n) { return dot(x, x, n); }

// Sequence b's new token t reads the state of slot src(t) (-1: zero) and writes slot dst(t).
struct Slots {
  const GatedDeltaNetParams& p;
  int32_t b, r0, n;
  bool fresh;
  Slots(const GatedDeltaNetParams& params, int32_t seq)
      : p(params), b(seq), r0(params.qo_indptr[seq]), n(params.qo_indptr[seq + 1] - r0),
        fresh(params.state_src == nullptr && params.kv_len[seq] == n) {}
  int32_t src(int32_t t) const {
    if (p.state_src != nullptr) return p.state_src[r0 + t];
    return t == 0 && fresh ? -1 : p.state_slots[b];
  }
  int32_t dst(int32_t t) const {
    return p.state_dst != nullptr ? p.state_dst[r0 + t] : p.state_slots[b];
  }
};

// The conv over channels [c0, c1) of sequence b, and its conv states. In place, the last K-1
// inputs stay in `window` from token to token; with per-token slots (a token tree: a node's
// state may be read after its siblings ran) each token loads its source and stores its
// destination.
void conv_channels(const GatedDeltaNetParams& p, int32_t b, int64_t c0, int64_t c1) {
  const int64_t C = p.conv_dim();
  const int K = p.conv_kernel;
  const Slots sl(p, b);
  float window[64];  // the K-1 previous inputs, then the current one (K <= 64, CHECKed)
  const auto state = [&](int32_t slot, int64_t c) {
    return p.conv_state + (static_cast<int64_t>(slot) * C + c) * (K - 1);
  };
  for (int64_t c = c0; c < c1; ++c) {
    const float* w = p.conv_w + c * K;
    for (int32_t t = 0; t < sl.n; ++t) {
      const int32_t src = sl.src(t), dst = sl.dst(t);
      const bool routed = p.state_src != nullptr;
      if (t == 0 || routed) {
        if (src < 0) {
          std::fill(window, window + (K - 1), 0.0f);
        } else {
          std::copy_n(state(src, c), K - 1, window);
        }
      }
      window[K - 1] = p.qkv[(sl.r0 + t) * C + c];
      float sum = 0.0f;
      for (int j = 0; j < K; ++j) sum += w[j] * window[j];
      p.mixed[(sl.r0 + t) * C + c] = silu(sum);
      std::memmove(window, window + 1, (K - 1) * sizeof(float));
      if (t == sl.n - 1 || routed) std::copy_n(window, K - 1, state(dst, c));
    }
  }
}

// q and k of row t L2-normalised per head, q times 1 / sqrt(dk).
void normalize_qk(const GatedDeltaNetParams& p, int64_t t) {
  const int dk = p.head_k_dim;
  float* row = p.mixed + t * p.conv_dim();
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int h = 0; h < 2 * p.num_k_heads; ++h) {
    float* x = row + static_cast<int64_t>(h) * dk;
    const float inv = 1.0f / std::sqrt(sum_squares(x, dk) + p.eps);
    const float s = h < p.num_k_heads ? inv * q_scale : inv;
    for (int i = 0; i < dk; ++i) x[i] *= s;
  }
}

// One token's delta rule for one head, row by row (row j = value column j of S, dk floats):
// m = from * decay (zeros when from is null), d = (v[j] - m . k) * beta, m += k d, and, when o
// is given, o[j] = m . q. Two passes over each row. dk: a multiple of kLanes.
struct DeltaRows {
  float* S;           // [dv, dk] destination
  const float* from;  // [dv, dk] source (may equal S), or null: zero
  const float* k;     // [dk]
  const float* q;     // [dk]
  const float* v;     // [dv]
  float decay, beta;
  int dk, dv;
  float* o;           // [dv] or null
};

void delta_rows(const DeltaRows& r) {
  for (int j = 0; j < r.dv; ++j) {
    float* m = r.S + static_cast<int64_t>(j) * r.dk;
    const float* f = r.from == nullptr ? nullptr : r.from + static_cast<int64_t>(j) * r.dk;
    float acc[kLanes] = {};
    for (int i = 0; i < r.dk; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        m[i + l] = f == nullptr ? 0.0f : f[i + l] * r.decay;
        acc[l] += m[i + l] * r.k[i + l];
      }
    }
    const float kv = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    const float d = (r.v[j] - kv) * r.beta;
    float out[kLanes] = {};
    for (int i = 0; i < r.dk; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        m[i + l] += r.k[i + l] * d;
        out[l] += m[i + l] * r.q[i + l];
      }
    }
    if (r.o != nullptr) {
      r.o[j] = ((out[0] + out[4]) + (out[2] + out[6])) + ((out[1] + out[5]) + (out[3] + out[7]));
    }
  }
}

ARBOR_AVX2 float hsum_avx2(__m256 v) {
  // Lanes (l, l + 4) first, then as the scalar path: ((0 + 2) + (1 + 3)) of those.
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));      // (0+2, 1+3, ...)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// delta_rows with AVX2 + FMA: the same passes, 8 lanes a vector (rounding differs from the
// scalar path by FMA; each is deterministic and batch invariant).
ARBOR_AVX2 void delta_rows_avx2(const DeltaRows& r) {
  const __m256 decay = _mm256_set1_ps(r.decay);
  for (int j = 0; j < r.dv; ++j) {
    float* m = r.S + static_cast<int64_t>(j) * r.dk;
    const float* f = r.from == nullptr ? nullptr : r.from + static_cast<int64_t>(j) * r.dk;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < r.dk; i += 8) {
      const __m256 x = f == nullptr ? _mm256_setzero_ps() : _mm256_mul_ps(_mm256_loadu_ps(f + i), decay);
      _mm256_storeu_ps(m + i, x);
      acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(r.k + i), acc);
    }
    const float d = (r.v[j] - hsum_avx2(acc)) * r.beta;
    const __m256 dd = _mm256_set1_ps(d);
    __m256 out = _mm256_setzero_ps();
    for (int i = 0; i < r.dk; i += 8) {
      const __m256 x = _mm256_fmadd_ps(_mm256_loadu_ps(r.k + i), dd, _mm256_loadu_ps(m + i));
      _mm256_storeu_ps(m + i, x);
      out = _mm256_fmadd_ps(x, _mm256_loadu_ps(r.q + i), out);
    }
    if (r.o != nullptr) r.o[j] = hsum_avx2(out);
  }
}

// Value head h of sequence b through its tokens: the delta rule, then the gated norm. Each
// token's decay reads its source state and writes its destination (in place when they agree).
void recur_head(const GatedDeltaNetParams& p, int32_t b, int h) {
  const int64_t C = p.conv_dim();
  const int dk = p.head_k_dim, dv = p.head_v_dim, hv = p.num_v_heads;
  const Slots sl(p, b);
  const auto state = [&](int32_t slot) {
    return p.ssm_state + (static_cast<int64_t>(slot) * hv + h) * dv * dk;
  };
  const int kh = h % p.num_k_heads;
  const bool avx2 = active_isa() >= Isa::kAvx2;
  float o[1024];  // dv <= 1024 (CHECKed)
  for (int32_t t = 0; t < sl.n; ++t) {
    const int64_t r = sl.r0 + t;
    const float* row = p.mixed + r * C;
    const float* q = row + static_cast<int64_t>(kh) * dk;
    const float* k = row + static_cast<int64_t>(p.num_k_heads + kh) * dk;
    const float* v = row + 2 * static_cast<int64_t>(p.num_k_heads) * dk +
                     static_cast<int64_t>(h) * dv;
    const float g = softplus(p.alpha[r * hv + h] + p.dt_bias[h]) * p.a[h];
    const float decay = std::exp(g);
    const float beta = sigmoid(p.beta[r * hv + h]);
    const int32_t src = sl.src(t);
    const DeltaRows rows{state(sl.dst(t)), src < 0 ? nullptr : state(src), k, q, v, decay, beta,
                         dk, dv, p.out != nullptr ? o : nullptr};
    if (avx2) {
      delta_rows_avx2(rows);
    } else {
      delta_rows(rows);
    }
    if (p.out == nullptr) continue;
    const float inv = 1.0f / std::sqrt(sum_squares(o, dv) / static_cast<float>(dv) + p.eps);
    const float* z = p.z + r * hv * dv + static_cast<int64_t>(h) * dv;
    float* out = p.out + r * hv * dv + static_cast<int64_t>(h) * dv;
    for (int j = 0; j < dv; ++j) out[j] = o[j] * inv * p.norm_w[j] * silu(z[j]);
  }
}

}  // namespace

void gated_delta_net(const GatedDeltaNetParams& p, ThreadPool& pool) {
  ARBOR_CHECK(p.num_k_heads > 0 && p.num_v_heads % p.num_k_heads == 0 &&
              p.head_k_dim % kLanes == 0 && p.head_k_dim > 0 && p.head_v_dim % kLanes == 0 &&
              p.head_v_dim > 0 && p.head_v_dim <= 1024 && p.conv_kernel >= 1 &&
              p.conv_kernel <= 64)
      << "gated delta net shape: heads " << p.num_k_heads << "/" << p.num_v_heads << ", dims "
      << p.head_k_dim << "/" << p.head_v_dim << ", conv kernel " << p.conv_kernel;
  const int32_t B = p.num_seqs;
  if (B == 0) return;
  const int64_t T = p.qo_indptr[B];
  const int64_t C = p.conv_dim();
  const int64_t chunks = (C + kConvChunk - 1) / kConvChunk;
  pool.parallel_for(B * chunks, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t c0 = (i % chunks) * kConvChunk;
      conv_channels(p, static_cast<int32_t>(i / chunks), c0, std::min(C, c0 + kConvChunk));
    }
  });
  pool.parallel_for(T, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) normalize_qk(p, t);
  });
  pool.parallel_for(int64_t{B} * p.num_v_heads, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      recur_head(p, static_cast<int32_t>(i / p.num_v_heads), static_cast<int>(i % p.num_v_heads));
    }
  }, 1);
}

}  // namespace arbor::kernels
