// CudaForwardOps against the CPU kernels, op by op (label gpu: skipped without a CUDA device).
// Random inputs are seeded (the seed is in every failure message). Tolerances: exact where the
// GPU repeats the host's arithmetic (embedding rows, RoPE rotation, K/V conversion, add, the
// double-accumulating matmul_ref); otherwise as stated at each test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/fp16.h"
#include "cuda/matmul.h"
#include "activation_ref.h"
#include "cuda_test_util.h"
#include "gguf/quants.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace arbor::cuda {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::CudaOpsTest;
using testing::random_floats;
using Copy = model::DeviceMemory::Copy;

constexpr uint32_t kSeed = 1125;

TEST_F(CudaOpsTest, AllocateIsZeroedAlignedAndRoundTrips) {
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    auto* p = static_cast<uint8_t*>(alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    std::vector<uint8_t> back = download(p, bytes);
    EXPECT_EQ(std::count(back.begin(), back.end(), 0), (long)bytes) << bytes << " bytes";
    std::vector<uint8_t> pattern(bytes);
    for (size_t i = 0; i < bytes; ++i) pattern[i] = (uint8_t)(i * 131 + 7);
    ops().to_device(p, pattern.data(), bytes);
    EXPECT_EQ(download(p, bytes), pattern);
  }
  EXPECT_FALSE(ops().is_host());
  EXPECT_EQ(ops().name(), "cuda:0");
}

TEST_F(CudaOpsTest, AllocateTooMuchIsResourceExhausted) {
  auto p = ops().allocate(size_t{1} << 50);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("1125899906842624 bytes"), std::string::npos)
      << p.status().message();
}

// The same copy lists applied by the device and by memcpy in order: few copies (one
// cudaMemcpyAsync each) and many (the kernel), aligned and not, with chains that need ordering.
TEST_F(CudaOpsTest, CopyRegionsInIssueOrder) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  constexpr size_t kBytes = 1 << 16;
  std::vector<uint8_t> host(kBytes);
  for (uint8_t& b : host) b = (uint8_t)rng();
  auto* dev = upload(host);
  auto at = [&](uint8_t* base, size_t dst, size_t src, size_t bytes) {
    return Copy{base + dst, base + src, bytes};
  };
  std::vector<std::vector<size_t>> lists;  // (dst, src, bytes) triples
  lists.push_back({1024, 0, 256, 4096, 2048, 100});                       // few, disjoint
  lists.push_back({100, 0, 64, 200, 100, 64, 300, 200, 64});              // a chain: order matters
  // Many (the kernel): 16-aligned and odd sizes and offsets from [0, 32768) into
  // [32768, 54816), every fifth writing where the one before wrote; then a chain where each copy
  // reads what the one before wrote, in [56000, 59512).
  std::vector<size_t> many;
  for (int i = 0; i < 60; ++i) {
    const size_t bytes = i % 3 == 0 ? 2048 : 1 + rng() % 300;
    const size_t src = (i % 2 ? 16 * (rng() % 1000) : rng() % 30000);
    const size_t dst = i % 5 == 4 ? many[many.size() - 3] : 32768 + rng() % 20000;
    many.insert(many.end(), {dst, src, bytes});
  }
  many.insert(many.end(), {56000, 100, 512, 57000, 56000, 512, 58000, 57000, 512,
                           59000, 58100, 512});
  lists.push_back(many);
  for (const std::vector<size_t>& l : lists) {
    std::vector<Copy> on_dev, on_host;
    for (size_t i = 0; i < l.size(); i += 3) {
      on_dev.push_back(at(dev, l[i], l[i + 1], l[i + 2]));
      on_host.push_back(at(host.data(), l[i], l[i + 1], l[i + 2]));
    }
    ops().copy(on_dev);
    for (const Copy& c : on_host) std::memmove(c.dst, c.src, c.bytes);
    ASSERT_EQ(download(dev, kBytes), host) << l.size() / 3 << " copies";
  }
}

TEST_F(CudaOpsTest, WeightsAreTheModelsBytes) {
  const model::LlamaWeights& h = model().weights();
  const model::LlamaWeights& d = ops().weights();
  ASSERT_EQ(d.layers.size(), h.layers.size());
  auto same_matrix = [&](const kernels::WeightView& hv, const kernels::WeightView& dv) {
    const size_t row = kernels::weight_row_bytes(hv.type, hv.cols);
    EXPECT_EQ(dv.row_stride, row);
    EXPECT_EQ(dv.packed, nullptr);
    std::vector<uint8_t> back = download(static_cast<const uint8_t*>(dv.data), row * dv.rows);
    for (int64_t r = 0; r < hv.rows; ++r) {
      ASSERT_EQ(std::memcmp(back.data() + r * row,
                            static_cast<const uint8_t*>(hv.data) + r * hv.row_stride, row), 0)
          << "row " << r;
    }
  };
  same_matrix(h.token_embd, d.token_embd);
  same_matrix(h.layers[0].q.w, d.layers[0].q.w);
  same_matrix(h.layers.back().down.w, d.layers.back().down.w);
  same_matrix(h.output.w, d.output.w);
  if (h.tied_output) {
    EXPECT_EQ(d.output.w.data, d.token_embd.data);
  }
  const int dim = model().config().dim;
  EXPECT_EQ(download(d.output_norm, dim), std::vector<float>(h.output_norm, h.output_norm + dim));
  EXPECT_EQ(download(d.layers[1].ffn_norm, dim),
            std::vector<float>(h.layers[1].ffn_norm, h.layers[1].ffn_norm + dim));
}

TEST_F(CudaOpsTest, StageUploadsTheBatch) {
  const std::vector<int32_t> tokens = {5, 6, 7}, positions = {0, 1, 2}, qo = {0, 1, 3},
                             kvi = {0, 1, 2}, pages = {4, 9}, kv_len = {1, 2},
                             slots = {64, 144, 145}, logits = {0, 2};
  model::ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.qo_indptr = qo;
  b.kv_indptr = kvi;
  b.kv_page_indices = pages;
  b.kv_len = kv_len;
  b.slot_mapping = slots;
  b.logits_indices = logits;
  for (int round = 0; round < 2; ++round) {  // the second reuses the staging buffers
    const model::ForwardBatch s = ops().stage(b);
    EXPECT_EQ(download(s.tokens.data(), 3), tokens);
    EXPECT_EQ(download(s.qo_indptr.data(), 3), qo);
    EXPECT_EQ(download(s.kv_page_indices.data(), 2), pages);
    EXPECT_EQ(download(s.slot_mapping.data(), 3), slots);
    EXPECT_EQ(download(s.logits_indices.data(), 2), logits);
    EXPECT_TRUE(s.mask_indptr.empty());
    EXPECT_TRUE(s.mask_bits.empty());
  }
}

// A random [rows, cols] matrix of `type`, rows `pad` bytes apart beyond the dense size (F32 rows
// stay 4-byte aligned: the device reads F32 weights as floats, and GGUF's rows always are).
struct TestMatrix {
  std::vector<uint8_t> bytes;
  kernels::WeightView host;
};

TestMatrix random_matrix(gguf::GgmlType type, int64_t rows, int64_t cols, size_t pad,
                         std::mt19937& rng) {
  TestMatrix m;
  const size_t row = kernels::weight_row_bytes(type, cols);
  if (type == gguf::GgmlType::kF32) pad = (pad + 3) / 4 * 4;
  m.bytes.assign((row + pad) * rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = random_floats(rng, cols);
    EXPECT_TRUE(gguf::quantize_row(type, v.data(), m.bytes.data() + r * (row + pad), cols).ok());
  }
  m.host = kernels::make_weight_view(type, m.bytes.data(), rows, cols);
  m.host.row_stride = row + pad;
  return m;
}

const gguf::GgmlType kTypes[] = {gguf::GgmlType::kF32, gguf::GgmlType::kF16,
                                 gguf::GgmlType::kBF16, gguf::GgmlType::kQ8_0,
                                 gguf::GgmlType::kQ4_0};

TEST_F(CudaOpsTest, EmbedAndGetRowsEqualTheHostDequantisation) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  // The model's table through embed().
  const kernels::WeightView& table = model().weights().token_embd;
  const std::vector<int32_t> ids = {0, 3, (int32_t)table.rows - 1, 3, 17};
  float* x = static_cast<float*>(alloc(ids.size() * table.cols * sizeof(float)));
  ops().embed(ops().weights().token_embd, upload(ids), (int32_t)ids.size(), x);
  std::vector<float> want(ids.size() * table.cols);
  for (size_t i = 0; i < ids.size(); ++i) kernels::get_row(table, ids[i], &want[i * table.cols]);
  EXPECT_TRUE(bitwise_equal(download(x, want.size()), want));
  // Every type, rows with padding.
  for (gguf::GgmlType type : kTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(type));
    const TestMatrix m = random_matrix(type, 9, 96, 34, rng);
    kernels::WeightView dv = m.host;
    dv.data = upload(m.bytes);
    float* out = static_cast<float*>(alloc(ids.size() * 96 * sizeof(float)));
    const std::vector<int32_t> rows = {8, 0, 4, 4, 1};
    ops().embed(dv, upload(rows), (int32_t)rows.size(), out);
    std::vector<float> ref(rows.size() * 96);
    for (size_t i = 0; i < rows.size(); ++i) kernels::get_row(m.host, rows[i], &ref[i * 96]);
    EXPECT_TRUE(bitwise_equal(download(out, ref.size()), ref));
  }
}

// cuda::matmul (through matmul_multi) within a tolerance of the host's matmul with the activations
// the GPU multiplies (activation_ref.h: x, x rounded to f16 / bf16, or int8 blocks): f32 sums of
// 320 products of magnitude <= 1 in another order, truncating tensor-core adders included, so
// 5e-4 + 1e-5 relative, where a wrong nibble, scale or dropped product is off by O(0.1). Also
// cuda::matmul_ref equal to kernels::matmul_ref bit for bit, and each output row the same bits
// alone as in a batch of 11 tokens.
TEST_F(CudaOpsTest, MatmulMatchesTheHostAndIsBatchInvariant) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  for (gguf::GgmlType type : kTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(type));
    constexpr int64_t kRows = 37, kCols = 320;
    constexpr int32_t kTokens = 11;
    const TestMatrix a = random_matrix(type, kRows, kCols, type == gguf::GgmlType::kF32 ? 0 : 18,
                                       rng);
    const TestMatrix b = random_matrix(type, 5, kCols, 0, rng);
    kernels::WeightView da = a.host, db = b.host;
    da.data = upload(a.bytes);
    db.data = upload(b.bytes);
    const std::vector<float> x = random_floats(rng, kTokens * kCols);
    const float* dx = upload(x);
    float* ya = static_cast<float*>(alloc(kTokens * kRows * 4));
    float* yb = static_cast<float*>(alloc(kTokens * 5 * 4));
    const kernels::WeightView* ws[] = {&da, &db};
    float* ys[] = {ya, yb};
    ops().matmul_multi(ws, dx, ys, kTokens);
    const std::vector<float> same_a = testing::matmul_same_activations(a.host, x, kTokens);
    const std::vector<float> same_b = testing::matmul_same_activations(b.host, x, kTokens);
    const std::vector<float> got_a = download(ya, same_a.size());
    EXPECT_TRUE(all_close(got_a, same_a, 5e-4f, 1e-5f));
    EXPECT_TRUE(all_close(download(yb, same_b.size()), same_b, 5e-4f, 1e-5f));
    std::vector<float> ref_a(kTokens * kRows);
    kernels::matmul_ref(a.host, x.data(), ref_a.data(), kTokens);
    // The device's naive twin repeats the host's double accumulation exactly.
    float* yr = static_cast<float*>(alloc(kTokens * kRows * 4));
    cuda::matmul_ref(da, dx, yr, kTokens, nullptr);  // the legacy stream: waits for the ops
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(bitwise_equal(download(yr, ref_a.size()), ref_a));
    // Token 6 alone, and tokens 4..6 (a different batch), give token 6's bits.
    for (int32_t first : {6, 4}) {
      const int32_t n = 7 - first;
      ops().matmul(da, dx + first * kCols, ya, n);
      const std::vector<float> alone = download(ya + (6 - first) * kRows, kRows);
      EXPECT_TRUE(bitwise_equal(alone, std::vector<float>(got_a.begin() + 6 * kRows,
                                                          got_a.begin() + 7 * kRows)))
          << n << " tokens";
    }
  }
}

TEST_F(CudaOpsTest, RopeTablesAreTheDoublePrecisionAngles) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  constexpr int kHalf = 32;
  std::vector<float> inv(kHalf);
  kernels::RopeParams rp;
  rp.theta = 500000.0f;
  kernels::rope_inv_freqs(rp, 2 * kHalf, inv.data());
  std::vector<int32_t> pos = {0, 1, 7, 4095, 131071, 12};
  float* cos = static_cast<float*>(alloc(pos.size() * kHalf * 4));
  float* sin = static_cast<float*>(alloc(pos.size() * kHalf * 4));
  ops().rope_tables(upload(pos), (int32_t)pos.size(), upload(inv), kHalf, 1.0f, cos, sin);
  std::vector<float> want_cos(pos.size() * kHalf), want_sin(pos.size() * kHalf);
  for (size_t t = 0; t < pos.size(); ++t) {
    for (int i = 0; i < kHalf; ++i) {
      const double angle = (double)pos[t] * (double)inv[i];
      want_cos[t * kHalf + i] = (float)std::cos(angle);
      want_sin[t * kHalf + i] = (float)std::sin(angle);
    }
  }
  // CUDA's double cos/sin are within 2 double ulps: after rounding to f32 at most 1 f32 ulp.
  EXPECT_TRUE(all_close(download(cos, want_cos.size()), want_cos, 1.2e-7f));
  EXPECT_TRUE(all_close(download(sin, want_sin.size()), want_sin, 1.2e-7f));
}

// Against kernels::rms_norm_ref (double): 2e-6 relative (a 512-term f32 sum of squares).
TEST_F(CudaOpsTest, RmsNormRowsWithAndWithoutGather) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  for (int dim : {64, 512, 1000}) {
    constexpr int kRows = 6;
    const std::vector<float> x = random_floats(rng, kRows * dim, -3.0f, 3.0f);
    const std::vector<float> w = random_floats(rng, dim, 0.5f, 1.5f);
    const std::vector<int32_t> gather = {5, 0, 5};
    float* y = static_cast<float*>(alloc(kRows * dim * 4));
    const float* dx = upload(x);
    const float* dw = upload(w);
    for (bool use_rows : {false, true}) {
      const int32_t n = use_rows ? 3 : kRows;
      ops().rms_norm_rows(dx, use_rows ? upload(gather) : nullptr, n, dw, y, dim, 1e-5f);
      std::vector<float> want(n * dim);
      for (int r = 0; r < n; ++r) {
        const int src = use_rows ? gather[r] : r;
        kernels::rms_norm_ref(&x[src * dim], w.data(), &want[r * dim], dim, 1e-5f);
      }
      EXPECT_TRUE(all_close(download(y, want.size()), want, 1e-6f, 2e-6f))
          << "dim " << dim << (use_rows ? " gathered" : "");
    }
  }
}

// Host twin of the epilogue: biases, then kernels::rope_apply with the same tables, then the
// cache write (fp32_to_fp16 for F16): the device must match it bit for bit.
TEST_F(CudaOpsTest, QkvEpilogueMatchesRopeApplyAndWritesTheCache) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  constexpr int kT = 5, kHq = 4, kHkv = 2, kD = 16, kBs = 4, kBlocks = 6;
  for (bool neox : {false, true}) {
    for (kernels::KvDtype dt : {kernels::KvDtype::kF16, kernels::KvDtype::kF32}) {
      for (int rope_dim : {kD, 8}) {
        SCOPED_TRACE(::testing::Message() << "neox " << neox << ", f16 "
                                          << (dt == kernels::KvDtype::kF16) << ", rope_dim "
                                          << rope_dim);
        const int half = rope_dim / 2;
        std::vector<float> q = random_floats(rng, kT * kHq * kD);
        std::vector<float> k = random_floats(rng, kT * kHkv * kD);
        std::vector<float> v = random_floats(rng, kT * kHkv * kD);
        const std::vector<float> bq = random_floats(rng, kHq * kD), bk = random_floats(rng, kHkv * kD),
                                 bv = random_floats(rng, kHkv * kD);
        const std::vector<float> cos = random_floats(rng, kT * half), sin = random_floats(rng, kT * half);
        const std::vector<int32_t> slots = {21, 3, 4, 0, 12};
        const size_t pool_elems = (size_t)kBlocks * kHkv * kBs * kD;
        const size_t esize = kernels::kv_dtype_size(dt);
        model::QkvEpilogue p;
        p.num_tokens = kT;
        p.num_q_heads = kHq;
        p.num_kv_heads = kHkv;
        p.head_dim = kD;
        p.rope_dim = rope_dim;
        p.rope_neox = neox;
        p.q = upload(q);
        p.k = upload(k);
        p.v = upload(v);
        p.bq = upload(bq);
        p.bk = upload(bk);
        p.bv = upload(bv);
        p.cos = upload(cos);
        p.sin = upload(sin);
        p.slot_mapping = upload(slots);
        p.k_cache = alloc(pool_elems * esize);
        p.v_cache = alloc(pool_elems * esize);
        p.kv_dtype = dt;
        p.block_size = kBs;
        ops().qkv_epilogue(p);
        for (int t = 0; t < kT; ++t) {
          for (int i = 0; i < kHq * kD; ++i) q[t * kHq * kD + i] += bq[i];
          for (int i = 0; i < kHkv * kD; ++i) {
            k[t * kHkv * kD + i] += bk[i];
            v[t * kHkv * kD + i] += bv[i];
          }
          kernels::rope_apply(&q[t * kHq * kD], kHq, kD, rope_dim, neox, &cos[t * half], &sin[t * half]);
          kernels::rope_apply(&k[t * kHkv * kD], kHkv, kD, rope_dim, neox, &cos[t * half], &sin[t * half]);
        }
        EXPECT_TRUE(bitwise_equal(download(p.q, q.size()), q));
        EXPECT_TRUE(bitwise_equal(download(p.k, k.size()), k));
        EXPECT_TRUE(bitwise_equal(download(p.v, v.size()), v));
        std::vector<uint8_t> kc = download(static_cast<uint8_t*>(p.k_cache), pool_elems * esize);
        std::vector<uint8_t> vc = download(static_cast<uint8_t*>(p.v_cache), pool_elems * esize);
        std::vector<uint8_t> want_k(pool_elems * esize, 0), want_v(pool_elems * esize, 0);
        for (int t = 0; t < kT; ++t) {
          const int block = slots[t] / kBs, off = slots[t] % kBs;
          for (int h = 0; h < kHkv; ++h) {
            for (int d = 0; d < kD; ++d) {
              const size_t idx = (((size_t)block * kHkv + h) * kBs + off) * kD + d;
              const float kv[2] = {k[(t * kHkv + h) * kD + d], v[(t * kHkv + h) * kD + d]};
              for (int which = 0; which < 2; ++which) {
                uint8_t* dst = (which == 0 ? want_k : want_v).data() + idx * esize;
                if (dt == kernels::KvDtype::kF16) {
                  const uint16_t hbits = fp32_to_fp16(kv[which]);
                  std::memcpy(dst, &hbits, 2);
                } else {
                  std::memcpy(dst, &kv[which], 4);
                }
              }
            }
          }
        }
        EXPECT_EQ(kc, want_k);
        EXPECT_EQ(vc, want_v);
      }
    }
  }
}

TEST_F(CudaOpsTest, AddSiluMulAndNonfiniteFlags) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  constexpr int64_t kN = 3000;
  const std::vector<float> a = random_floats(rng, kN, -8.0f, 8.0f), b = random_floats(rng, kN);
  float* y = upload(a);
  ops().add(y, upload(b), kN);
  std::vector<float> sum = a;
  kernels::add(sum.data(), b.data(), kN);
  EXPECT_TRUE(bitwise_equal(download(y, kN), sum));
  float* g = upload(a);
  ops().silu_mul(g, upload(b), kN);
  std::vector<float> silu = a;
  kernels::silu_mul_ref(silu.data(), b.data(), kN);
  // expf within 2 ulps, one division and one product: 1e-6 relative.
  EXPECT_TRUE(all_close(download(g, kN), silu, 1e-7f, 1e-6f));

  constexpr int kDim = 700, kRows = 5;
  std::vector<float> x = random_floats(rng, kRows * kDim);
  x[1 * kDim + 699] = INFINITY;
  x[3 * kDim + 0] = NAN;
  x[4 * kDim + 350] = -INFINITY;
  const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 1};
  std::vector<uint8_t> flags = {0, 0, 7, 0, 0, 0};  // a flag already set stays as it was
  uint8_t* df = upload(flags);
  ops().flag_nonfinite(upload(x), upload(rows), (int32_t)rows.size(), kDim, df);
  EXPECT_EQ(download(df, flags.size()), (std::vector<uint8_t>{0, 1, 7, 1, 1, 1}));
}

TEST_F(CudaOpsTest, ArgmaxRowsIsTheLowestIdOfTheMaximumOrMinusOne) {
  // Rows long enough that every thread of the block holds several columns; few distinct values,
  // so ties land in different threads and the tree must prefer the lower index.
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int> level(0, 3);
  for (const int cols : {1, 7, 256, 257, 32000}) {
    constexpr int kRows = 40;
    std::vector<float> x(static_cast<size_t>(kRows) * cols);
    for (float& v : x) v = static_cast<float>(level(rng));
    if (cols > 3) {
      x[1 * cols + cols - 1] = INFINITY;
      x[2 * cols + 2] = NAN;
      x[3 * cols + cols / 2] = -INFINITY;
      std::fill(x.begin() + 4 * cols, x.begin() + 5 * cols, -5.0f);  // all equal: 0
    }
    std::vector<int32_t> want(kRows);
    for (int r = 0; r < kRows; ++r) {
      const float* row = x.data() + static_cast<size_t>(r) * cols;
      int32_t best = 0;
      bool finite = true;
      for (int c = 0; c < cols; ++c) {
        finite = finite && std::isfinite(row[c]);
        if (row[c] > row[best]) best = c;
      }
      want[r] = finite ? best : -1;
    }
    int32_t* ids = upload(std::vector<int32_t>(kRows, 99));
    ops().argmax_rows(upload(x), kRows, cols, ids);
    EXPECT_EQ(download(ids, kRows), want) << cols << " columns";
  }
}

TEST_F(CudaOpsTest, TopKRowsEqualTheCpus) {
  // kernels::top_k_rows (the CPU's ForwardOps) against the kernel, ids and logits exactly: rows
  // of few levels (ties across threads and radix bins, k past the number of distinct values),
  // rows of logits an ulp apart that one score merges (the Sampler's tie rule, not the raw
  // order), normal rows at a 32k vocabulary, Inf and NaN rows, k = 1, k = cols, several scales.
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int> level(0, 3), ulps(0, 3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const int cols : {1, 7, 256, 257, 1000, 32000}) {
    for (const int k : {1, 2, 40, 256, cols}) {
      if (k > cols) continue;
      constexpr int kRows = 12;
      std::vector<float> x(static_cast<size_t>(kRows) * cols);
      for (int r = 0; r < kRows; ++r) {
        float* row = x.data() + static_cast<size_t>(r) * cols;
        for (int c = 0; c < cols; ++c) {
          if (r % 3 == 0) {
            row[c] = static_cast<float>(level(rng));
          } else if (r % 3 == 1) {
            row[c] = -10.0f;
            for (int u = ulps(rng); u > 0; --u) row[c] = std::nextafter(row[c], -100.0f);
          } else {
            row[c] = normal(rng);
          }
        }
        if (r % 3 == 1) row[cols / 2] = 20.0f;
      }
      if (cols > 3) {
        x[2 * cols + 1] = INFINITY;
        x[5 * cols + cols - 1] = NAN;
        x[8 * cols + 2] = -INFINITY;
      }
      std::vector<float> scale(kRows);
      for (int r = 0; r < kRows; ++r) scale[r] = 1.0f / std::array{0.3f, 0.7f, 1.0f, 1.7f}[r % 4];
      std::vector<int32_t> want_ids(static_cast<size_t>(kRows) * k);
      std::vector<float> want_values(want_ids.size());
      kernels::top_k_rows(x.data(), kRows, cols, k, scale.data(), want_ids.data(),
                          want_values.data());
      int32_t* ids = upload(std::vector<int32_t>(want_ids.size(), 99));
      float* values = upload(std::vector<float>(want_ids.size(), 0.0f));
      ops().top_k_rows(upload(x), kRows, cols, k, upload(scale), ids, values);
      const std::vector<int32_t> got_ids = download(ids, want_ids.size());
      const std::vector<float> got_values = download(values, want_ids.size());
      for (int r = 0; r < kRows; ++r) {
        const size_t at = static_cast<size_t>(r) * k;
        ASSERT_EQ(std::vector<int32_t>(got_ids.begin() + at, got_ids.begin() + at + k),
                  std::vector<int32_t>(want_ids.begin() + at, want_ids.begin() + at + k))
            << "row " << r << ", " << cols << " columns, k " << k;
        if (want_ids[at] < 0) continue;
        ASSERT_EQ(0, std::memcmp(got_values.data() + at, want_values.data() + at,
                                 k * sizeof(float)))
            << "row " << r << ", " << cols << " columns, k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace arbor::cuda
