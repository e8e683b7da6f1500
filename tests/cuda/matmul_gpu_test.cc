// cuda::matmul against naive references, its batch invariance, and cuda::get_rows, for every
// weight type the GPU takes (label gpu; each test skips without a CUDA device).
//
// Per output y[t, r], with s = sum_c |W[r, c]| * |x[t, c]| (W dequantised):
//  * vs the CPU with the activations the GPU multiplies (F32: x; F16 / BF16: x rounded to f16 /
//    bf16, nearest even; Q8_0 / Q4_0 / the affine types: kernels::matmul_ref_quantized_act, the
//    same int8 blocks and scales): F32 2e-5 * s (f32 FMA chains); F16 / BF16 5e-5 * s
//    (tensor-core f32 accumulation, one rounding per 16-column MMA and per slice; Hopper's MMA
//    adders truncate, so errors add up linearly: 2048 / 16 steps * 2^-23 ~ 1.5e-5); Q8_0 / Q4_0
//    1e-5 * s (exact integer block dots, one f32 FMA per block and one add per slice). The
//    affine types: 1e-5 * (s + m), m = sum_c |M[r, c]| * |x[t, c]| with M the offset (min) of
//    the column's sub-block: per block the CPU's own f32 step (1..4 FMAs, exact integer dots),
//    whose terms S * dot and M * d * sum may each be as large as s + m before they cancel, so
//    the f32 roundings scale with s + m; the reference sums the same terms in double. Dropping
//    or doubling one product errs by about s / cols >= 4.9e-4 * s here, so index bugs fail.
//  * vs cuda::matmul_ref (f32 activations, double accumulation): the error of rounding the
//    activations added: F16 2^-11 * s, BF16 2^-8 * s (relative rounding of each x), the int8
//    types sum_c |W[r, c]| * d_block(t, c) / 2 (each int8 activation is within half a step d).
//  * cuda::matmul_ref equals kernels::matmul_ref bit for bit (the same f32 products of the same
//    dequantised weights summed in double in column order), and get_rows equals
//    gguf::dequantize_row bit for bit.
//  * batch invariance, bit for bit: every token of every call equals the same token in one
//    129-token call, alone (one-token calls) and in a shuffled batch of other tokens.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "cuda/ggml_dequant.h"
#include "cuda/matmul.h"
#include "gguf/quants.h"
#include "kernels/matmul.h"
#include "activation_ref.h"

namespace arbor::cuda {
namespace {

using gguf::GgmlType;

bool has_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!has_device()) GTEST_SKIP() << "no CUDA device"

void cuda_ok(cudaError_t err, const char* what) {
  ARBOR_CHECK(err == cudaSuccess) << what << ": " << cudaGetErrorString(err);
}

// Owner of a device allocation (nullptr for 0 bytes).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) cuda_ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const void* src, size_t bytes) {
    ARBOR_CHECK_LE(bytes, bytes_);
    cuda_ok(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "upload");
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
std::vector<T> download(const T* src, size_t n) {
  std::vector<T> out(n);
  cuda_ok(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return out;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// A seeded random matrix encoded by gguf's quantisers (ggml's reference codecs), rows padded to
// row_stride with garbage, on the host and on the device; `dequant` is W as the kernels see it.
struct TestMatrix {
  TestMatrix(GgmlType type, int64_t rows, int64_t cols, size_t pad, std::mt19937& rng)
      : bytes(rows * (kernels::weight_row_bytes(type, cols) + pad), 0xA5),
        dequant(static_cast<size_t>(rows * cols)),
        offsets(dequant.size(), 0.0f),
        device(bytes.size()) {
    const size_t stride = kernels::weight_row_bytes(type, cols) + pad;
    const std::vector<float> wf = random_floats(rng, rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + r * stride;
      const Status st = gguf::quantize_row(type, wf.data() + r * cols, row, cols);
      ARBOR_CHECK(st.ok()) << st.to_string();
      const Status dt = gguf::dequantize_row(type, row, dequant.data() + r * cols, cols);
      ARBOR_CHECK(dt.ok()) << dt.to_string();
      if (!ggml::is_affine(type)) continue;
      for (int64_t c = 0; c < cols; ++c) {
        offsets[static_cast<size_t>(r * cols + c)] =
            ggml::decode_run(type, row, static_cast<int32_t>(c & ~3)).offset;
      }
    }
    device.upload(bytes.data(), bytes.size());
    host_view = kernels::WeightView{type, bytes.data(), rows, cols, stride};
    device_view = kernels::WeightView{type, device.as<void>(), rows, cols, stride};
  }

  std::vector<uint8_t> bytes;
  std::vector<float> dequant;  // [rows, cols]
  std::vector<float> offsets;  // [rows, cols]: M of each weight's sub-block (affine types; else 0)
  DeviceBuffer device;
  kernels::WeightView host_view, device_view;
};

// y = x W^T on the GPU with a workspace of exactly matmul_workspace_bytes. x: [nt, cols] host.
std::vector<float> gpu_matmul(const kernels::WeightView& w, const std::vector<float>& x,
                              int32_t nt) {
  DeviceBuffer xd(x.size() * sizeof(float)), yd(static_cast<size_t>(nt * w.rows) * sizeof(float));
  DeviceBuffer ws(matmul_workspace_bytes(w, nt));
  xd.upload(x.data(), static_cast<size_t>(nt * w.cols) * sizeof(float));
  matmul(w, xd.as<float>(), yd.as<float>(), nt, ws.as<void>(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "matmul");
  return download(yd.as<float>(), static_cast<size_t>(nt * w.rows));
}

std::vector<float> gpu_matmul_ref(const kernels::WeightView& w, const std::vector<float>& x,
                                  int32_t nt) {
  DeviceBuffer xd(x.size() * sizeof(float)), yd(static_cast<size_t>(nt * w.rows) * sizeof(float));
  xd.upload(x.data(), x.size() * sizeof(float));
  matmul_ref(w, xd.as<float>(), yd.as<float>(), nt, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "matmul_ref");
  return download(yd.as<float>(), static_cast<size_t>(nt * w.rows));
}

using testing::quantised_activations;

// The tolerances of the header comment for one case, all [nt, rows].
struct Tolerances {
  std::vector<double> same_acts, f32_acts;
};

Tolerances tolerances(const TestMatrix& m, const std::vector<float>& x, int32_t nt) {
  const kernels::WeightView& w = m.host_view;
  const GgmlType type = w.type;
  const double same = type == GgmlType::kF32  ? 2e-5
                      : quantised_activations(type)       ? 1e-5
                                              : 5e-5;
  const double act_rel = type == GgmlType::kF16    ? std::ldexp(1.0, -11)
                         : type == GgmlType::kBF16 ? std::ldexp(1.0, -8)
                                                   : 0.0;
  Tolerances tol;
  tol.same_acts.resize(static_cast<size_t>(nt * w.rows));
  tol.f32_acts.resize(tol.same_acts.size());
  for (int64_t t = 0; t < nt; ++t) {
    const float* xt = x.data() + t * w.cols;
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = m.dequant.data() + r * w.cols;
      const float* mr = m.offsets.data() + r * w.cols;
      double s = 0.0, s_m = 0.0, q = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        s += std::fabs(double{wr[c]}) * std::fabs(double{xt[c]});
        s_m += std::fabs(double{mr[c]}) * std::fabs(double{xt[c]});
      }
      if (quantised_activations(type)) {
        for (int64_t b = 0; b < w.cols / 32; ++b) {
          float amax = 0.0f;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xt[b * 32 + j]));
          const double d = amax / 127.0f;
          for (int j = 0; j < 32; ++j) q += std::fabs(double{wr[b * 32 + j]}) * d / 2;
        }
      }
      const size_t i = static_cast<size_t>(t * w.rows + r);
      tol.same_acts[i] = same * (s + s_m) + 1e-30;
      tol.f32_acts[i] = tol.same_acts[i] + act_rel * s + q;
    }
  }
  return tol;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

constexpr int32_t kMaxTokens = 129;
constexpr int32_t kTokenCounts[] = {1, 2, 3, 5, 8, 9, 16, 17, 64, 129};

struct Shape {
  int64_t rows, cols;
  size_t pad;  // bytes after each row
};

std::string describe(GgmlType type, const Shape& s, uint32_t seed) {
  return std::string(gguf::ggml_type_name(type)) + " " + std::to_string(s.rows) + "x" +
         std::to_string(s.cols) + " pad=" + std::to_string(s.pad) +
         " seed=" + std::to_string(seed);
}

// Checks every token count of one (type, shape) against the references and for invariance.
void check_matrix(GgmlType type, const Shape& shape, uint32_t seed) {
  SCOPED_TRACE(describe(type, shape, seed));
  std::mt19937 rng(seed);
  const TestMatrix m(type, shape.rows, shape.cols, shape.pad, rng);
  const int64_t rows = shape.rows, cols = shape.cols;
  std::vector<float> x = random_floats(rng, kMaxTokens * cols);
  std::fill(x.begin() + 3 * cols, x.begin() + 4 * cols, 0.0f);  // token 3: all-zero blocks

  // References for all kMaxTokens tokens; a call on the first nt tokens must match their rows.
  std::vector<float> cpu_same(static_cast<size_t>(kMaxTokens * rows)), cpu_ref(cpu_same.size());
  kernels::matmul_ref(m.host_view, x.data(), cpu_ref.data(), kMaxTokens);
  cpu_same = testing::matmul_same_activations(m.host_view, x, kMaxTokens);
  const std::vector<float> gpu_ref = gpu_matmul_ref(m.device_view, x, kMaxTokens);
  for (size_t i = 0; i < cpu_ref.size(); ++i) {
    ASSERT_TRUE(same_bits(gpu_ref[i], cpu_ref[i]))
        << "matmul_ref: token " << i / rows << " row " << i % rows << ": " << gpu_ref[i]
        << " vs CPU " << cpu_ref[i];
  }
  const Tolerances tol = tolerances(m, x, kMaxTokens);
  const std::vector<float> all = gpu_matmul(m.device_view, x, kMaxTokens);

  for (const int32_t nt : kTokenCounts) {
    const std::vector<float> y = nt == kMaxTokens ? all : gpu_matmul(m.device_view, x, nt);
    for (int64_t i = 0; i < nt * rows; ++i) {
      const int64_t t = i / rows, r = i % rows;
      ASSERT_NEAR(y[i], cpu_same[i], tol.same_acts[i])
          << "vs the CPU with the same activations: tokens=" << nt << " token " << t << " row " << r;
      ASSERT_NEAR(y[i], gpu_ref[i], tol.f32_acts[i])
          << "vs matmul_ref: tokens=" << nt << " token " << t << " row " << r;
      ASSERT_TRUE(same_bits(y[i], all[i]))
          << "tokens=" << nt << " token " << t << " row " << r << ": " << y[i] << " vs " << all[i]
          << " in the " << kMaxTokens << "-token call";
    }
  }

  // Each token alone.
  for (int32_t t = 0; t < kMaxTokens; ++t) {
    const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
    const std::vector<float> y = gpu_matmul(m.device_view, xt, 1);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(same_bits(y[r], all[t * rows + r]))
          << "token " << t << " alone, row " << r << ": " << y[r] << " vs " << all[t * rows + r];
    }
  }

  // A shuffled batch of 37 of the tokens: other neighbours, other MMA columns and tiles.
  std::vector<int32_t> perm(kMaxTokens);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(37);
  std::vector<float> xp;
  for (const int32_t t : perm) xp.insert(xp.end(), x.begin() + t * cols, x.begin() + (t + 1) * cols);
  const std::vector<float> yp = gpu_matmul(m.device_view, xp, static_cast<int32_t>(perm.size()));
  for (size_t i = 0; i < perm.size(); ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(same_bits(yp[i * rows + r], all[perm[i] * rows + r]))
          << "token " << perm[i] << " at batch position " << i << ", row " << r;
    }
  }
}

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                           GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                           GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                           GgmlType::kQ6_K};

// Columns of a shape for a type: the K-quants' super-blocks are 256 wide.
int64_t fit_cols(GgmlType type, int64_t cols) {
  const int64_t block = ggml::is_affine(type) ? ggml::affine_traits(type).block_elems : 1;
  return (cols + block - 1) / block * block;
}

TEST(CudaMatmul, SmallShapes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1000;
  for (const GgmlType type : kTypes) {
    check_matrix(type, {64, 256, 0}, seed++);
    check_matrix(type, {100, 512, 0}, seed++);  // a partial row tile
    if (HasFatalFailure()) return;
  }
}

// Unaligned and padded rows: F32/F16/BF16 with cols not a multiple of 32 and 2-byte row padding
// take the scalar-load kernels; the quantised types get rows 2 bytes apart from 16-alignment
// (the affine types' 4-byte fields then sit at 2-byte aligned addresses).
TEST(CudaMatmul, OddStridesAndColumns) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 2000;
  for (const GgmlType type : kTypes) {
    const int64_t cols = fit_cols(type, quantised_activations(type) ? 96 : 200);
    check_matrix(type, {37, cols, type == GgmlType::kF32 ? 4u : 2u}, seed++);
    check_matrix(type, {21, quantised_activations(type) ? 4096 : 4100, 32}, seed++);  // many slices
    if (HasFatalFailure()) return;
  }
}

TEST(CudaMatmul, LargeShapes) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 3000;
  for (const GgmlType type : kTypes) {
    check_matrix(type, {2048, 2048, 0}, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaMatmul, WorkspaceBytes) {
  const kernels::WeightView q4{GgmlType::kQ4_0, nullptr, 10, 64, 36};
  EXPECT_EQ(matmul_workspace_bytes(q4, 0), 0u);
  // 3 x 64 int8 (256-aligned) + 3 x 2 f32 scales (256-aligned).
  EXPECT_EQ(matmul_workspace_bytes(q4, 3), 512u);
  const kernels::WeightView f16{GgmlType::kF16, nullptr, 10, 300, 600};
  EXPECT_EQ(matmul_workspace_bytes(f16, 2), 1280u);  // 2 x 300 halves, 256-aligned
  const kernels::WeightView f32{GgmlType::kF32, nullptr, 10, 300, 1200};
  EXPECT_EQ(matmul_workspace_bytes(f32, 64), 0u);
  // The affine types: int8 as Q4_0, then 16-byte ActSums per (token, block of 32).
  const kernels::WeightView q4k{GgmlType::kQ4_K, nullptr, 10, 512, 288};
  EXPECT_EQ(matmul_workspace_bytes(q4k, 3), 1536u + 768u);  // 3 x 512 int8, 3 x 16 x 16 bytes
  const kernels::WeightView q5_0{GgmlType::kQ5_0, nullptr, 10, 64, 44};
  EXPECT_EQ(matmul_workspace_bytes(q5_0, 9), 768u + 512u);  // 9 x 64 int8, 9 x 2 x 16 bytes
  for (const GgmlType t : kTypes) EXPECT_TRUE(matmul_supported(t)) << gguf::ggml_type_name(t);
  EXPECT_FALSE(matmul_supported(GgmlType::kQ8_1));
  EXPECT_FALSE(matmul_supported(GgmlType::kQ8_K));
  EXPECT_FALSE(matmul_supported(GgmlType::kIQ4_XS));
}

TEST(CudaGetRows, EqualsDequantizeRow) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 4000;
  for (const GgmlType type : kTypes) {
    // Padded rows: 2 bytes (F32 rows 4: the device reads F32 weights as floats).
    const size_t pad = type == GgmlType::kF32 ? 4 : 2;
    SCOPED_TRACE(describe(type, {50, 256, pad}, seed));
    std::mt19937 rng(seed++);
    const TestMatrix m(type, 50, 256, pad, rng);
    const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1};
    DeviceBuffer idd(ids.size() * sizeof(int32_t)), out(ids.size() * 256 * sizeof(float));
    idd.upload(ids.data(), ids.size() * sizeof(int32_t));
    get_rows(m.device_view, idd.as<int32_t>(), static_cast<int32_t>(ids.size()), out.as<float>(),
             nullptr);
    cuda_ok(cudaDeviceSynchronize(), "get_rows");
    const std::vector<float> got = download(out.as<float>(), ids.size() * 256);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> want(256);
      const uint8_t* row = m.bytes.data() + static_cast<size_t>(ids[i]) * m.host_view.row_stride;
      ASSERT_TRUE(gguf::dequantize_row(type, row, want.data(), 256).ok());
      for (int c = 0; c < 256; ++c) {
        ASSERT_TRUE(same_bits(got[i * 256 + c], want[c]))
            << "id " << ids[i] << " col " << c << ": " << got[i * 256 + c] << " vs " << want[c];
      }
    }
  }
}

}  // namespace
}  // namespace arbor::cuda
