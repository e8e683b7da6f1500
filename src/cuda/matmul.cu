// The simple CUDA matmul: one warp per output, obviously correct and batch invariant. A faster
// implementation of the same header (cuda/matmul.h) replaces this file; nothing else in src/cuda
// depends on how it works.
#include "cuda/matmul.h"

#include "cuda/cuda_check.h"
#include "cuda/dequant.cuh"

namespace arbor::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

const uint8_t* row_ptr(const kernels::WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * (int64_t)w.row_stride;
}

// Launch: blocks of kWarpsPerBlock warps; warp o (global) computes y[t, r] for o = t * rows + r.
// Lane l sums cols l, l + 32, ... in order with f32 FMAs; the 32 partial sums meet in a fixed
// xor-butterfly, so y[t, r] depends only on x[t] and row r (batch invariant).
__global__ void matmul_warp_kernel(const uint8_t* w, size_t row_stride, gguf::GgmlType type,
                                   int64_t rows, int64_t cols, const float* x, float* y,
                                   int64_t num_outputs) {
  const int64_t o = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= num_outputs) return;
  const int64_t t = o / rows, r = o % rows;
  const uint8_t* row = w + r * (int64_t)row_stride;
  const float* xt = x + t * cols;
  float acc = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) acc = __fmaf_rn(weight_at(row, type, c), xt[c], acc);
  for (int off = 16; off > 0; off /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
  if (lane == 0) y[t * rows + r] = acc;
}

// Launch: one thread per output y[t, r] (blocks of 256). Double accumulation in column order,
// each product and sum rounded separately, as kernels::matmul_ref does on the host.
__global__ void matmul_ref_kernel(const uint8_t* w, size_t row_stride, gguf::GgmlType type,
                                  int64_t rows, int64_t cols, const float* x, float* y,
                                  int64_t num_outputs) {
  const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= num_outputs) return;
  const int64_t t = o / rows, r = o % rows;
  const uint8_t* row = w + r * (int64_t)row_stride;
  double acc = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    acc = __dadd_rn(acc, __dmul_rn((double)weight_at(row, type, c), (double)x[t * cols + c]));
  }
  y[t * rows + r] = (float)acc;
}

// Launch: one block of 256 threads per id; threads stride over the columns.
__global__ void get_rows_kernel(const uint8_t* w, size_t row_stride, gguf::GgmlType type,
                                int64_t cols, const int32_t* ids, float* out) {
  const uint8_t* row = w + (int64_t)ids[blockIdx.x] * (int64_t)row_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[(int64_t)blockIdx.x * cols + c] = weight_at(row, type, c);
  }
}

void check_view(const kernels::WeightView& w) {
  ARBOR_CHECK(matmul_supported(w.type)) << gguf::ggml_type_name(w.type);
  ARBOR_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0);
  ARBOR_CHECK_GE(w.row_stride, kernels::weight_row_bytes(w.type, w.cols));
}

}  // namespace

bool matmul_supported(gguf::GgmlType type) {
  switch (type) {
    case gguf::GgmlType::kF32:
    case gguf::GgmlType::kF16:
    case gguf::GgmlType::kBF16:
    case gguf::GgmlType::kQ8_0:
    case gguf::GgmlType::kQ4_0:
      return true;
    default:
      return false;
  }
}

size_t matmul_workspace_bytes(const kernels::WeightView& w, int32_t num_tokens) { return 0; }

void matmul(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
            void* workspace, cudaStream_t stream) {
  check_view(w);
  if (num_tokens <= 0) return;
  const int64_t outputs = (int64_t)num_tokens * w.rows;
  const int64_t blocks = (outputs + kWarpsPerBlock - 1) / kWarpsPerBlock;
  matmul_warp_kernel<<<(unsigned)blocks, kWarpsPerBlock * 32, 0, stream>>>(
      row_ptr(w, 0), w.row_stride, w.type, w.rows, w.cols, x, y, outputs);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void matmul_ref(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
                cudaStream_t stream) {
  check_view(w);
  if (num_tokens <= 0) return;
  const int64_t outputs = (int64_t)num_tokens * w.rows;
  matmul_ref_kernel<<<(unsigned)((outputs + 255) / 256), 256, 0, stream>>>(
      row_ptr(w, 0), w.row_stride, w.type, w.rows, w.cols, x, y, outputs);
  ARBOR_CUDA_CHECK_LAUNCH();
}

void get_rows(const kernels::WeightView& w, const int32_t* ids, int32_t n, float* out,
              cudaStream_t stream) {
  check_view(w);
  if (n <= 0) return;
  get_rows_kernel<<<(unsigned)n, 256, 0, stream>>>(row_ptr(w, 0), w.row_stride, w.type, w.cols,
                                                   ids, out);
  ARBOR_CUDA_CHECK_LAUNCH();
}

}  // namespace arbor::cuda
