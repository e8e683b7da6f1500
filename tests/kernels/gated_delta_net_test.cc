// kernels::gated_delta_net against a double-precision transcription of the reference recurrence
// (docs/qwen35.md §5.1: llama.cpp's ggml_gated_delta_net and HF's
// torch_recurrent_gated_delta_rule), written independently of the kernel (the state as S[dk][dv],
// not transposed; value head h reading key head h % Hk): three sequences of different lengths
// in one call, then a second call continuing two of them from their slots and restarting the
// third at position 0. Tolerance 2e-5 relative to each row's largest output (f32 against f64).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/gated_delta_net.h"
#include "kernels/thread_pool.h"

namespace arbor::kernels::gdn_testing {
namespace {

struct Shape {
  int hk = 2, hv = 4, dk = 16, dv = 16, K = 4;
  int C() const { return 2 * hk * dk + hv * dv; }
};

// One sequence's state in the reference's own layout.
struct RefState {
  std::vector<double> conv;  // [K-1][C], oldest first
  std::vector<double> S;     // [hv][dk][dv]
};

struct Weights {
  std::vector<float> conv_w, dt_bias, a, norm_w;  // [C, K], [hv], [hv], [dv]
};

double silu(double x) { return x / (1 + std::exp(-x)); }

// The reference over one sequence's rows [r0, r0 + n) of the inputs.
void reference(const Shape& s, const Weights& w, const std::vector<float>& qkv,
               const std::vector<float>& z, const std::vector<float>& alpha,
               const std::vector<float>& beta, int r0, int n, float eps, RefState& st,
               std::vector<double>& out) {
  const int C = s.C();
  for (int t = 0; t < n; ++t) {
    const int r = r0 + t;
    std::vector<double> y(C);
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (int j = 0; j < s.K; ++j) {
        const double x = j == s.K - 1 ? qkv[(size_t)r * C + c] : st.conv[(size_t)j * C + c];
        sum += w.conv_w[(size_t)c * s.K + j] * x;
      }
      y[c] = silu(sum);
    }
    for (int j = 0; j + 1 < s.K - 1; ++j) {
      for (int c = 0; c < C; ++c) st.conv[(size_t)j * C + c] = st.conv[(size_t)(j + 1) * C + c];
    }
    if (s.K > 1) {
      for (int c = 0; c < C; ++c) st.conv[(size_t)(s.K - 2) * C + c] = qkv[(size_t)r * C + c];
    }
    auto l2 = [&](double* x, int d) {
      double ss = 0;
      for (int i = 0; i < d; ++i) ss += x[i] * x[i];
      for (int i = 0; i < d; ++i) x[i] /= std::sqrt(ss + eps);
    };
    for (int h = 0; h < 2 * s.hk; ++h) l2(&y[(size_t)h * s.dk], s.dk);
    for (int h = 0; h < s.hv; ++h) {
      const double* q = &y[(size_t)(h % s.hk) * s.dk];
      const double* k = &y[(size_t)(s.hk + h % s.hk) * s.dk];
      const double* v = &y[(size_t)2 * s.hk * s.dk + (size_t)h * s.dv];
      const double xg = alpha[(size_t)r * s.hv + h] + w.dt_bias[h];
      const double g = (xg > 20 ? xg : std::log1p(std::exp(xg))) * w.a[h];
      const double b = 1 / (1 + std::exp(-(double)beta[(size_t)r * s.hv + h]));
      double* S = &st.S[(size_t)h * s.dk * s.dv];
      for (int i = 0; i < s.dk * s.dv; ++i) S[i] *= std::exp(g);
      std::vector<double> o(s.dv);
      for (int j = 0; j < s.dv; ++j) {
        double kv = 0;
        for (int i = 0; i < s.dk; ++i) kv += S[(size_t)i * s.dv + j] * k[i];
        const double d = (v[j] - kv) * b;
        for (int i = 0; i < s.dk; ++i) S[(size_t)i * s.dv + j] += k[i] * d;
      }
      for (int j = 0; j < s.dv; ++j) {
        double acc = 0;
        for (int i = 0; i < s.dk; ++i) acc += S[(size_t)i * s.dv + j] * q[i];
        o[j] = acc / std::sqrt((double)s.dk);
      }
      double ms = 0;
      for (double x : o) ms += x * x / s.dv;
      for (int j = 0; j < s.dv; ++j) {
        const size_t at = (size_t)r * s.hv * s.dv + (size_t)h * s.dv + j;
        out[at] = o[j] / std::sqrt(ms + eps) * w.norm_w[j] * silu(z[at]);
      }
    }
  }
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(GatedDeltaNet, MatchesTheReferenceRecurrenceAcrossCallsAndSequences) {
  const Shape s;
  const int C = s.C();
  const float eps = 1e-6f;
  std::mt19937 rng(7);
  Weights w{uniform((size_t)C * s.K, rng, -0.5f, 0.5f), uniform(s.hv, rng, -0.5f, 0.5f),
            uniform(s.hv, rng, -0.4f, -0.1f), uniform(s.dv, rng, 0.8f, 1.2f)};
  const int kSlots = 5;
  std::vector<float> conv_state((size_t)kSlots * C * (s.K - 1), 0.0f);
  std::vector<float> ssm_state((size_t)kSlots * s.hv * s.dv * s.dk, 0.0f);
  std::vector<RefState> ref(3, RefState{std::vector<double>((size_t)(s.K - 1) * C, 0.0),
                                        std::vector<double>((size_t)s.hv * s.dk * s.dv, 0.0)});
  const int32_t slots[3] = {4, 0, 2};
  ThreadPool pool(2);
  // Call 1: lengths 5, 1, 9, all fresh. Call 2: 3 more for sequence 0, 1 more for sequence 1,
  // sequence 2 restarting at position 0 with 4 tokens (its slot's state must be ignored).
  const std::vector<std::vector<int32_t>> lens = {{5, 1, 9}, {3, 1, 4}};
  std::vector<int32_t> done = {0, 0, 0};
  for (int call = 0; call < 2; ++call) {
    if (call == 1) {
      done[2] = 0;
      ref[2] = RefState{std::vector<double>((size_t)(s.K - 1) * C, 0.0),
                        std::vector<double>((size_t)s.hv * s.dk * s.dv, 0.0)};
    }
    std::vector<int32_t> qo = {0}, kv_len;
    for (int b = 0; b < 3; ++b) {
      qo.push_back(qo.back() + lens[call][b]);
      kv_len.push_back(done[b] + lens[call][b]);
    }
    const int T = qo.back();
    const std::vector<float> qkv = uniform((size_t)T * C, rng, -2, 2);
    const std::vector<float> z = uniform((size_t)T * s.hv * s.dv, rng, -2, 2);
    const std::vector<float> alpha = uniform((size_t)T * s.hv, rng, -2, 2);
    const std::vector<float> beta = uniform((size_t)T * s.hv, rng, -3, 3);
    std::vector<float> mixed((size_t)T * C), out((size_t)T * s.hv * s.dv);
    GatedDeltaNetParams p;
    p.num_seqs = 3;
    p.qo_indptr = qo.data();
    p.kv_len = kv_len.data();
    p.state_slots = slots;
    p.num_k_heads = s.hk;
    p.num_v_heads = s.hv;
    p.head_k_dim = s.dk;
    p.head_v_dim = s.dv;
    p.conv_kernel = s.K;
    p.eps = eps;
    p.qkv = qkv.data();
    p.z = z.data();
    p.alpha = alpha.data();
    p.beta = beta.data();
    p.conv_w = w.conv_w.data();
    p.dt_bias = w.dt_bias.data();
    p.a = w.a.data();
    p.norm_w = w.norm_w.data();
    p.conv_state = conv_state.data();
    p.ssm_state = ssm_state.data();
    p.mixed = mixed.data();
    p.out = out.data();
    if (call == 1) {  // garbage in sequence 2's slot: a fresh sequence must not read it
      std::fill_n(ssm_state.begin() + (size_t)slots[2] * s.hv * s.dv * s.dk,
                  (size_t)s.hv * s.dv * s.dk, 3.0f);
    }
    gated_delta_net(p, pool);
    std::vector<double> want(out.size(), 0.0);
    for (int b = 0; b < 3; ++b) {
      reference(s, w, qkv, z, alpha, beta, qo[b], lens[call][b], eps, ref[b], want);
      done[b] += lens[call][b];
    }
    for (int r = 0; r < T; ++r) {
      double scale = 0;
      for (int j = 0; j < s.hv * s.dv; ++j) {
        scale = std::max(scale, std::abs(want[(size_t)r * s.hv * s.dv + j]));
      }
      for (int j = 0; j < s.hv * s.dv; ++j) {
        const size_t at = (size_t)r * s.hv * s.dv + j;
        ASSERT_NEAR(out[at], want[at], 2e-5 * scale) << "call " << call << " row " << r << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace arbor::kernels::gdn_testing
