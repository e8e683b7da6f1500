#include "kernels/bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "base/check.h"
#include "kernels/cpu_features.h"

namespace arbor::kernels {
namespace {

// Sums [p, p + bytes) as 32-bit integers with four independent accumulators so
// the loads, not the adds, are the limit. bytes is a multiple of 128.
__attribute__((target("avx2"))) uint32_t read_reduce_avx2(const uint8_t *p,
                                                          size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 128) {
    a0 = _mm256_add_epi32(
        a0, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i)));
    a1 = _mm256_add_epi32(
        a1, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 32)));
    a2 = _mm256_add_epi32(
        a2, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 64)));
    a3 = _mm256_add_epi32(
        a3, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 96)));
  }
  const __m256i s =
      _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), s);
  uint32_t r = 0;
  for (uint32_t v : lanes)
    r += v;
  return r;
}

uint32_t read_reduce_scalar(const uint8_t *p, size_t bytes) {
  uint64_t a0 = 0, a1 = 0;
  for (size_t i = 0; i < bytes; i += 16) {
    uint64_t v0, v1;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p + i + 8, 8);
    a0 += v0;
    a1 += v1;
  }
  return static_cast<uint32_t>(a0 ^ a1);
}

} // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool &pool, size_t bytes)
    : pool_(pool) {
  constexpr size_t kPage = 4096;
  bytes_ = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  data_ = static_cast<uint8_t *>(std::aligned_alloc(kPage, bytes_));
  ARBOR_CHECK(data_ != nullptr) << "cannot allocate " << bytes_ << " bytes";
  sink_ = std::make_unique<uint32_t[]>(static_cast<size_t>(pool.num_threads()) *
                                       16);
  // Each thread first-touches the pages it later reads (NUMA-local where it
  // matters).
  uint8_t *data = data_;
  pool_.parallel_for(static_cast<int64_t>(bytes_ / kPage),
                     [data](int64_t begin, int64_t end, int) {
                       std::memset(data + begin * kPage, 1,
                                   static_cast<size_t>(end - begin) * kPage);
                     });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(data_); }

double ReadBandwidthProbe::measure(int reps) {
  ARBOR_CHECK_GE(reps, 1);
  constexpr size_t kPage = 4096;
  const bool avx2 = active_isa() >= Isa::kAvx2;
  double best = 0.0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool_.parallel_for(
        static_cast<int64_t>(bytes_ / kPage),
        [&](int64_t begin, int64_t end, int tid) {
          const uint8_t *p = data_ + begin * kPage;
          const size_t n = static_cast<size_t>(end - begin) * kPage;
          sink_[static_cast<size_t>(tid) * 16] +=
              avx2 ? read_reduce_avx2(p, n) : read_reduce_scalar(p, n);
        });
    const std::chrono::duration<double> dt =
        std::chrono::steady_clock::now() - start;
    // The best run: a limit is what the machine can do, and on a shared host
    // (this VM) single runs vary by 2x with other tenants' memory traffic.
    best = std::max(best, static_cast<double>(bytes_) / dt.count() / 1e9);
  }
  // The sums must be observable or the reads could be optimised away.
  volatile uint32_t keep = 0;
  for (int i = 0; i < pool_.num_threads(); ++i)
    keep = keep + sink_[static_cast<size_t>(i) * 16];
  return best;
}

double measure_read_bandwidth_gbs(ThreadPool &pool, size_t bytes, int reps) {
  return ReadBandwidthProbe(pool, bytes).measure(reps);
}

} // namespace arbor::kernels
