// The GPU matmul's entry points (cuda/matmul.h): checks, the workspace layout and the choice of
// kernel per weight type. The kernels: matmul_mma.cu (tensor cores) and matmul_simt.cu.
#include "cuda/matmul.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "base/check.h"
#include "cuda/ggml_dequant.h"
#include "cuda/matmul_internal.cuh"

namespace arbor::cuda {

using gguf::GgmlType;

namespace internal {

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  ARBOR_CHECK(err == cudaSuccess) << what << ": " << cudaGetErrorString(err);
}

}  // namespace internal

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The kernels read F32 weights as floats and every other type in 2-byte units.
size_t element_alignment(GgmlType type) { return type == GgmlType::kF32 ? 4 : 2; }

void check_view(const kernels::WeightView& w) {
  ARBOR_CHECK(matmul_supported(w.type))
      << "the GPU matmul does not take " << gguf::ggml_type_name(w.type) << " weights";
  ARBOR_CHECK(w.rows >= 0 && w.cols >= 0) << w.rows << " x " << w.cols;
  // Rows are indexed by int32 and row tiles by gridDim.y (at most 65535).
  ARBOR_CHECK(w.rows <= int64_t{65535} * internal::kRowTile && w.cols < (int64_t{1} << 30))
      << w.rows << " x " << w.cols;
  ARBOR_CHECK_GE(w.row_stride, kernels::weight_row_bytes(w.type, w.cols));
  ARBOR_CHECK(w.data != nullptr || w.rows == 0);
  const size_t align = element_alignment(w.type);
  ARBOR_CHECK(w.row_stride % align == 0 && reinterpret_cast<uintptr_t>(w.data) % align == 0)
      << "weights at " << w.data << ", row stride " << w.row_stride << ": not " << align
      << "-byte aligned";
}

// Workspace layout: F16/BF16: [num_tokens, cols] rounded activations; Q8_0/Q4_0:
// [num_tokens, cols] int8, then (256-byte aligned) [num_tokens, cols / 32] f32 scales; the
// affine types: the same int8, then [num_tokens, cols / 32] ggml::ActSums (16 bytes each).
size_t quant_scales_offset(const kernels::WeightView& w, int32_t num_tokens) {
  return align_up(static_cast<size_t>(num_tokens) * static_cast<size_t>(w.cols));
}

}  // namespace

bool matmul_supported(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
      return true;
    default:
      return ggml::is_affine(type);
  }
}

size_t matmul_workspace_bytes(const kernels::WeightView& w, int32_t num_tokens) {
  ARBOR_CHECK(matmul_supported(w.type))
      << "the GPU matmul does not take " << gguf::ggml_type_name(w.type) << " weights";
  if (num_tokens <= 0) return 0;
  const size_t n = static_cast<size_t>(num_tokens) * static_cast<size_t>(w.cols);
  switch (w.type) {
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return align_up(n * sizeof(uint16_t));
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
      return quant_scales_offset(w, num_tokens) +
             align_up(static_cast<size_t>(num_tokens) * static_cast<size_t>(w.cols / 32) *
                      sizeof(float));
    case GgmlType::kF32:
      return 0;
    default:  // the affine types
      return quant_scales_offset(w, num_tokens) +
             align_up(static_cast<size_t>(num_tokens) * static_cast<size_t>(w.cols / 32) *
                      sizeof(ggml::ActSums));
  }
}

void matmul(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
            void* workspace, cudaStream_t stream) {
  check_view(w);
  ARBOR_CHECK_GE(num_tokens, 0);
  if (num_tokens == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    const cudaError_t err = cudaMemsetAsync(
        y, 0, static_cast<size_t>(num_tokens) * static_cast<size_t>(w.rows) * sizeof(float), stream);
    ARBOR_CHECK(err == cudaSuccess) << cudaGetErrorString(err);
    return;
  }
  ARBOR_CHECK(workspace != nullptr || matmul_workspace_bytes(w, num_tokens) == 0);
  ARBOR_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0) << "workspace at " << workspace;
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  const auto rows = static_cast<int32_t>(w.rows), cols = static_cast<int32_t>(w.cols);
  internal::MmaArgs a;
  a.w = wdata;
  a.row_stride = w.row_stride;
  a.rows = rows;
  a.cols = cols;
  a.num_tokens = num_tokens;
  a.y = y;
  // The K-quants' activations share a scale per super-block: their slices hold whole ones.
  const bool per_unit =
      ggml::is_affine(w.type) && ggml::scales_per_unit(ggml::affine_traits(w.type));
  a.plan = internal::slice_plan(cols, per_unit ? internal::kUnitChunks : internal::kUnroll);
  switch (w.type) {
    case GgmlType::kF32:
      internal::launch_f32(wdata, w.row_stride, rows, cols, x, num_tokens, y, stream);
      return;
    case GgmlType::kF16:
    case GgmlType::kBF16: {
      auto* xh = static_cast<uint16_t*>(workspace);
      internal::launch_round_acts(x, static_cast<int64_t>(num_tokens) * cols,
                                  w.type == GgmlType::kBF16, xh, stream);
      a.acts = xh;
      internal::launch_mma(w.type, a, stream);
      return;
    }
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0: {
      auto* base = static_cast<uint8_t*>(workspace);
      auto* qs = reinterpret_cast<int8_t*>(base);
      auto* d = reinterpret_cast<float*>(base + quant_scales_offset(w, num_tokens));
      internal::launch_quantize_acts(x, num_tokens, cols, qs, d, nullptr, false, stream);
      a.acts = qs;
      a.act_scales = d;
      internal::launch_mma(w.type, a, stream);
      return;
    }
    default: {  // the affine types (check_view: matmul_supported)
      auto* base = static_cast<uint8_t*>(workspace);
      auto* qs = reinterpret_cast<int8_t*>(base);
      auto* sums = reinterpret_cast<ggml::ActSums*>(base + quant_scales_offset(w, num_tokens));
      internal::launch_quantize_acts(x, num_tokens, cols, qs, nullptr, sums, per_unit, stream);
      a.acts = qs;
      a.act_sums = sums;
      internal::launch_affine(w.type, a, stream);
      return;
    }
  }
}

void matmul_ref(const kernels::WeightView& w, const float* x, float* y, int32_t num_tokens,
                cudaStream_t stream) {
  check_view(w);
  ARBOR_CHECK_GE(num_tokens, 0);
  if (num_tokens == 0 || w.rows == 0) return;
  internal::launch_ref(w.type, static_cast<const uint8_t*>(w.data), w.row_stride,
                       static_cast<int32_t>(w.rows), static_cast<int32_t>(w.cols), x, num_tokens,
                       y, stream);
}

void get_rows(const kernels::WeightView& w, const int32_t* ids, int32_t n, float* out,
              cudaStream_t stream) {
  check_view(w);
  ARBOR_CHECK_GE(n, 0);
  if (n == 0 || w.cols == 0) return;
  internal::launch_get_rows(w.type, static_cast<const uint8_t*>(w.data), w.row_stride,
                            static_cast<int32_t>(w.rows), static_cast<int32_t>(w.cols), ids, n,
                            out, stream);
}

}  // namespace arbor::cuda
