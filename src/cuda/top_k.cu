// launch_top_k_rows (cuda/device_ops.h): each row's k best candidates in Sampler's order, found
// by a radix select over order-preserving 32-bit keys and gathered in id order. Deterministic:
// counts are integers and every output position follows from prefix counts, never from the
// order atomics land in. The score is (x - max) * scale with round-to-nearest intrinsics, which
// nvcc never contracts, so it is the host's float expression bit for bit.
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/device_ops.h"

namespace arbor::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRadixBits = 8;
constexpr int kBins = 1 << kRadixBits;
static_assert(kBins == kThreads, "one histogram bin per thread");

// The float order of `score` as an unsigned order (-0 and +0 equal): the sign bit set for
// non-negative values, every bit flipped for negative ones.
__device__ uint32_t order_key(float score) {
  if (score == 0.0f) score = 0.0f;
  const uint32_t u = __float_as_uint(score);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

__device__ uint32_t key_at(const float* xr, int c, float max, float scale) {
  return order_key(__fmul_rn(__fsub_rn(xr[c], max), scale));
}

// The maximum of v over the block; every thread gets it. shared: [kWarps].
__device__ float block_max(float v, float* shared) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, shared[w]);
  __syncthreads();
  return m;
}

// How many threads below this one have `flag` set; *total = how many have it in the block.
// shared: [kWarps].
__device__ int block_count_before(bool flag, int* shared, int* total) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) shared[threadIdx.x / 32] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u));
  int sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < (int)threadIdx.x / 32) before += shared[w];
    sum += shared[w];
  }
  __syncthreads();
  *total = sum;
  return before;
}

// Launch: one block of kThreads per row. Passes over the row: its maximum (and whether it is
// finite), four 8-bit radix passes that narrow the k-th best key (thread b owns bin b), then
// tiles of kThreads columns in id order, each taking the keys above the k-th and the first
// `need` keys equal to it, placed by block-wide prefix counts.
__global__ void top_k_rows_kernel(const float* x, int cols, int k, const float* scale, int32_t* ids,
                                  float* values) {
  __shared__ unsigned hist[kBins];
  __shared__ float max_shared[kWarps];
  __shared__ int count_shared[kWarps];
  __shared__ uint32_t prefix_shared;
  __shared__ int need_shared;
  const float* xr = x + (int64_t)blockIdx.x * cols;
  int32_t* out_ids = ids + (int64_t)blockIdx.x * k;
  float* out_values = values + (int64_t)blockIdx.x * k;

  float max = -INFINITY;
  int bad = 0;
  for (int c = threadIdx.x; c < cols; c += kThreads) {
    const float e = xr[c];
    bad |= !isfinite(e);
    max = fmaxf(max, e);
  }
  if (__syncthreads_or(bad)) {
    for (int j = threadIdx.x; j < k; j += kThreads) out_ids[j] = -1;
    return;
  }
  max = block_max(max, max_shared);
  const float s = scale[blockIdx.x];

  // Invariant: the k-th best key starts with `prefix` (the bits under `mask`), and it is the
  // need-th best among the keys that do.
  uint32_t prefix = 0, mask = 0;
  int need = k;
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    hist[threadIdx.x] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kThreads) {
      const uint32_t key = key_at(xr, c, max, s);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & (kBins - 1)], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = kBins - 1;
      for (; digit > 0; --digit) {
        if (above + (int)hist[digit] >= need) break;
        above += (int)hist[digit];
      }
      prefix_shared = prefix | ((uint32_t)digit << shift);
      need_shared = need - above;
    }
    __syncthreads();
    prefix = prefix_shared;
    need = need_shared;
    mask |= (uint32_t)(kBins - 1) << shift;
    __syncthreads();
  }

  const uint32_t kth = prefix;
  int equal_seen = 0, written = 0;
  for (int base = 0; base < cols && written < k; base += kThreads) {
    const int c = base + threadIdx.x;
    const uint32_t key = c < cols ? key_at(xr, c, max, s) : 0u;
    const bool above = c < cols && key > kth;
    const bool equal = c < cols && key == kth;
    int equal_total = 0, take_total = 0;
    const int equal_before = block_count_before(equal, count_shared, &equal_total);
    const bool take = above || (equal && equal_seen + equal_before < need);
    const int take_before = block_count_before(take, count_shared, &take_total);
    if (take) {
      out_ids[written + take_before] = c;
      out_values[written + take_before] = xr[c];
    }
    equal_seen += equal_total;
    written += take_total;
  }
}

}  // namespace

void launch_top_k_rows(const float* x, int32_t n, int32_t cols, int32_t k, const float* scale,
                       int32_t* ids, float* values, cudaStream_t stream) {
  if (n <= 0) return;
  ARBOR_CHECK(k >= 1 && k <= cols) << "top_k_rows k " << k << " of " << cols;
  top_k_rows_kernel<<<(unsigned)n, kThreads, 0, stream>>>(x, cols, k, scale, ids, values);
  ARBOR_CUDA_CHECK_LAUNCH();
}

}  // namespace arbor::cuda
