#include "kernels/peak.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/avx512_target.h"  // GCC 12's false -Wuninitialized in AVX-512 intrinsics
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace arbor::kernels {
namespace {

// Each loop runs `iters` iterations of 12 independent chains (enough to cover FMA latency x
// throughput on current cores) and returns a value that depends on every chain, so nothing is
// optimised away. Returns the multiply-adds done.

__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters, float* sink) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  *sink += _mm512_reduce_add_ps(s);
  return 12.0 * 16 * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters, float* sink) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  alignas(32) float lanes[8];
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  _mm256_store_ps(lanes, s);
  for (float v : lanes) *sink += v;
  return 12.0 * 8 * static_cast<double>(iters);
}

double fma_loop_scalar(int64_t iters, float* sink) {
  float a[12];
  for (int i = 0; i < 12; ++i) a[i] = 1.0f + i * 1e-3f;
  for (int64_t k = 0; k < iters; ++k) {
    for (int i = 0; i < 12; ++i) a[i] = a[i] * 0.999999f + 1e-7f;
  }
  for (float v : a) *sink += v;
  return 12.0 * static_cast<double>(iters);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double dot_loop_vnni(int64_t iters,
                                                                           float* sink) {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
  }
  __m512i t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, a[i]);
  *sink += static_cast<float>(_mm512_reduce_add_epi32(t));
  return 12.0 * 64 * static_cast<double>(iters);
}

__attribute__((target("avx2,avxvnni"))) double dot_loop_avxvnni(int64_t iters, float* sink) {
  __m256i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_epi32(i);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_dpbusd_avx_epi32(a[i], u, s);
  }
  __m256i t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm256_add_epi32(t, a[i]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  for (int32_t v : lanes) *sink += static_cast<float>(v);
  return 12.0 * 32 * static_cast<double>(iters);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) double bf16_loop_avx512(int64_t iters,
                                                                              float* sink) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512bh u = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], u, v);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  *sink += _mm512_reduce_add_ps(s);
  return 12.0 * 32 * static_cast<double>(iters);
}

__attribute__((target("avx2"))) double dot_loop_avx2(int64_t iters, float* sink) {
  __m256i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_epi32(i);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
    }
  }
  __m256i t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm256_add_epi32(t, a[i]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  for (int32_t v : lanes) *sink += static_cast<float>(v);
  return 12.0 * 32 * static_cast<double>(iters);
}

double dot_loop_scalar(int64_t iters, float* sink) {
  int32_t a[12] = {};
  for (int64_t k = 0; k < iters; ++k) {
    for (int i = 0; i < 12; ++i) a[i] += static_cast<int8_t>(k) * 3;
  }
  for (int32_t v : a) *sink += static_cast<float>(v);
  return 12.0 * static_cast<double>(iters);
}

using Loop = double (*)(int64_t, float*);

// Multiply-adds per second of `loop` on all threads: iterations sized on one thread first.
double rate(ThreadPool& pool, Loop loop, double seconds) {
  float sink = 0;
  int64_t iters = 1 << 12;
  for (;;) {  // calibrate to about `seconds` on one thread
    const auto t0 = std::chrono::steady_clock::now();
    loop(iters, &sink);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt >= seconds / 4 || iters > (int64_t{1} << 40)) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(dt, 1e-9));
      break;
    }
    iters *= 4;
  }
  // 16 chunks per thread, claimed dynamically, so every thread stays busy to the end even if
  // one wakes late.
  constexpr int kChunks = 16;
  iters = std::max<int64_t>(1, iters / kChunks);
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<double> macs{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(
        int64_t{kChunks} * pool.num_threads(),
        [&](int64_t begin, int64_t end, int) {
          float local = 0;
          double m = 0;
          for (int64_t i = begin; i < end; ++i) m += loop(iters, &local);
          macs.fetch_add(m + (local == 12345.678f ? 1 : 0));
        },
        1);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(macs.load() / dt);
  }
  return *std::max_element(rates.begin(), rates.end()) + (sink == 12345.678f ? 1 : 0);
}

}  // namespace

ComputePeak measure_compute_peak(ThreadPool& pool, double seconds) {
  const Isa isa = active_isa();
  const Loop fma = isa >= Isa::kAvx512 ? fma_loop_avx512
                   : isa >= Isa::kAvx2 ? fma_loop_avx2
                                       : fma_loop_scalar;
  const Loop dot = isa >= Isa::kAvx512      ? dot_loop_vnni
                   : !(isa >= Isa::kAvx2)     ? dot_loop_scalar
                   : cpu_features().avxvnni   ? dot_loop_avxvnni
                                              : dot_loop_avx2;
  ComputePeak p;
  p.f32_gflops = 2 * rate(pool, fma, seconds) / 1e9;
  p.int8_gops = 2 * rate(pool, dot, seconds) / 1e9;
  if (rounds_acts_to_bf16(gguf::GgmlType::kBF16)) {
    p.bf16_gflops = 2 * rate(pool, bf16_loop_avx512, seconds) / 1e9;
  }
  return p;
}

}  // namespace arbor::kernels
