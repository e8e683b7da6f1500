// What src/cuda does without a GPU: the runtime's report, make_cuda_forward_ops() refusing with a
// clear error, and the host-side planning (weight upload, batch staging, copy runs) that
// CudaForwardOps relies on. Built with and without ARBOR_CUDA.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_forward_ops.h"
#include "cuda/host_plan.h"
#include "cuda/runtime.h"
#include "model/llama_model.h"
#include "support/shared_data.h"

namespace arbor::cuda {
namespace {

using model::DeviceMemory;

TEST(CudaRuntime, ReportsDevices) {
  const int n = device_count();
  const std::string text = describe_devices();
  // Printed once here, so a run without a GPU says why the gpu tests were skipped.
  std::printf("CUDA devices: %d\n%s\n", n, text.c_str());
  if (n == 0) {
    EXPECT_EQ(text.rfind("no CUDA device: ", 0), 0u) << text;
    EXPECT_GT(text.size(), std::strlen("no CUDA device: ")) << "the reason is missing";
  } else {
    EXPECT_EQ(text.rfind("cuda:0: ", 0), 0u) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), n - 1) << text;
  }
}

TEST(CudaForwardOps, RefusesADeviceThatIsNotThere) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  auto model = model::LlamaModel::load(test::shared_path(test::kStories260K));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  // device_count() is never a valid index: 0 on this machine without a GPU.
  auto ops = make_cuda_forward_ops(**model, device_count());
  ASSERT_FALSE(ops.ok());
  EXPECT_EQ(ops.status().code(), StatusCode::kFailedPrecondition);
#ifdef ARBOR_HAVE_CUDA
  EXPECT_NE(ops.status().message().find("no CUDA device"), std::string::npos)
      << ops.status().message();
#else
  EXPECT_NE(ops.status().message().find("arbor was built without CUDA (configure with "
                                        "-DARBOR_CUDA=ON and nvcc on PATH)"),
            std::string::npos)
      << ops.status().message();
  EXPECT_EQ(device_count(), 0);
#endif
  auto negative = make_cuda_forward_ops(**model, -1);
  EXPECT_FALSE(negative.ok());
}

// ---- Weight upload plan. ----

bool all_types(gguf::GgmlType) { return true; }
bool no_f32(gguf::GgmlType t) { return t != gguf::GgmlType::kF32; }

class UploadPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    auto m = model::LlamaModel::load(test::shared_path(test::kStories260K));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
  }
  std::unique_ptr<model::LlamaModel> model_;
};

TEST_F(UploadPlanTest, EveryTensorOnceAlignedAndDisjoint) {
  auto plan = plan_weight_upload(*model_, &all_types);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const model::LlamaWeights& w = model_->weights();
  const size_t layers = w.layers.size();
  // token_embd, per layer 2 norms + 7 matrices (+ biases, none here), output_norm, output
  // unless tied, rope_freqs when present.
  size_t expected = 1 + layers * 9 + 1 + (w.tied_output ? 0 : 1) + (w.rope_freqs ? 1 : 0);
  for (const model::LayerWeights& l : w.layers) expected += (l.bq != nullptr) + (l.bk != nullptr) + (l.bv != nullptr);
  EXPECT_EQ(plan->tensors.size(), expected);
  EXPECT_EQ(plan->tensors[0].name, "token_embd.weight");
  EXPECT_EQ(plan->tensors[1].name, "blk.0.attn_norm.weight");
  EXPECT_EQ(plan->tensors[2].name, "blk.0.attn_q.weight");
  size_t end = 0;
  for (const UploadPlan::Tensor& t : plan->tensors) {
    EXPECT_EQ(t.offset % 256, 0u) << t.name;
    EXPECT_GE(t.offset, end) << t.name << " overlaps the tensor before it";
    end = t.offset + t.row_bytes * t.rows;
  }
  EXPECT_GE(plan->total_bytes, end);
  EXPECT_LT(plan->total_bytes, end + 256);
  // The token embedding: rows = vocab, dense rows.
  EXPECT_EQ(plan->tensors[0].rows, w.token_embd.rows);
  EXPECT_EQ(plan->tensors[0].row_bytes, kernels::weight_row_bytes(w.token_embd.type, w.token_embd.cols));
  EXPECT_EQ(plan->tensors[0].host, w.token_embd.data);
}

TEST_F(UploadPlanTest, UnsupportedTypeNamesTheTensor) {
  auto plan = plan_weight_upload(*model_, &no_f32);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnimplemented);
  const std::string name = model_->weights().token_embd.type == gguf::GgmlType::kF32
                               ? "token_embd.weight" : "blk.0.attn_q.weight";
  EXPECT_NE(plan.status().message().find(name + " has type f32, which the CUDA matmul does not "
                                         "support"),
            std::string::npos)
      << plan.status().message();
}

TEST_F(UploadPlanTest, DeviceWeightsPointIntoTheAllocation) {
  auto plan = plan_weight_upload(*model_, &all_types);
  ASSERT_TRUE(plan.ok());
  std::vector<uint8_t> fake(plan->total_bytes);
  uint8_t* base = fake.data();
  const model::LlamaWeights& h = model_->weights();
  const model::LlamaWeights d = device_weights(h, *plan, base);
  EXPECT_EQ(d.token_embd.data, base + plan->tensors[0].offset);
  EXPECT_EQ(d.layers.size(), h.layers.size());
  EXPECT_EQ(d.tied_output, h.tied_output);
  if (h.tied_output) {
    EXPECT_EQ(d.output.data, d.token_embd.data);
  }
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const kernels::WeightView& hv = h.layers[l].w_down;
    const kernels::WeightView& dv = d.layers[l].w_down;
    EXPECT_EQ(dv.rows, hv.rows);
    EXPECT_EQ(dv.cols, hv.cols);
    EXPECT_EQ(dv.type, hv.type);
    EXPECT_EQ(dv.row_stride, kernels::weight_row_bytes(hv.type, hv.cols));
    EXPECT_EQ(dv.packed, nullptr);
    EXPECT_GE(static_cast<const uint8_t*>(dv.data), base);
    EXPECT_LE(static_cast<const uint8_t*>(dv.data) + dv.row_stride * dv.rows, base + fake.size());
    EXPECT_NE(d.layers[l].attn_norm, nullptr);
    EXPECT_EQ(d.layers[l].bq == nullptr, h.layers[l].bq == nullptr);
  }
  // Each tensor's bytes land where its device pointer says: copy as the upload does, compare.
  for (const UploadPlan::Tensor& t : plan->tensors) {
    for (int64_t r = 0; r < t.rows; ++r) {
      std::memcpy(base + t.offset + r * t.row_bytes,
                  static_cast<const uint8_t*>(t.host) + r * t.host_stride, t.row_bytes);
    }
  }
  const float* norm = d.layers.back().ffn_norm;
  EXPECT_EQ(std::memcmp(norm, h.layers.back().ffn_norm, model_->config().dim * sizeof(float)), 0);
}

// ---- Batch staging. ----

TEST(Staging, PacksEveryArrayAndEmptyOnesStayEmpty) {
  const std::vector<int32_t> tokens = {5, 6, 7}, positions = {0, 1, 2}, qo = {0, 1, 3},
                             kvi = {0, 1, 2}, pages = {4, 9}, kv_len = {1, 2}, slots = {64, 144, 145},
                             logits = {0, 2}, mask_indptr = {0, 0, 4};
  const std::vector<uint8_t> bits = {0x0b};
  model::ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.qo_indptr = qo;
  b.kv_indptr = kvi;
  b.kv_page_indices = pages;
  b.kv_len = kv_len;
  b.slot_mapping = slots;
  b.logits_indices = logits;
  b.mask_indptr = mask_indptr;
  b.mask_bits = bits;
  const StagingLayout lay = staging_layout(b);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(lay.offsets[i], i * 256) << i;
  EXPECT_EQ(lay.total_bytes, 10u * 256);
  std::vector<uint8_t> buf(lay.total_bytes, 0xee);
  write_staging(b, lay, buf.data());
  const model::ForwardBatch s = staged_batch(b, lay, buf.data());
  auto same = [](auto a, auto c) {
    return a.size() == c.size() && std::equal(a.begin(), a.end(), c.begin());
  };
  EXPECT_TRUE(same(s.tokens, b.tokens));
  EXPECT_TRUE(same(s.positions, b.positions));
  EXPECT_TRUE(same(s.qo_indptr, b.qo_indptr));
  EXPECT_TRUE(same(s.kv_indptr, b.kv_indptr));
  EXPECT_TRUE(same(s.kv_page_indices, b.kv_page_indices));
  EXPECT_TRUE(same(s.kv_len, b.kv_len));
  EXPECT_TRUE(same(s.slot_mapping, b.slot_mapping));
  EXPECT_TRUE(same(s.logits_indices, b.logits_indices));
  EXPECT_TRUE(same(s.mask_indptr, b.mask_indptr));
  EXPECT_TRUE(same(s.mask_bits, b.mask_bits));
  EXPECT_EQ((const uint8_t*)s.positions.data(), buf.data() + 256);

  model::ForwardBatch causal = b;
  causal.mask_indptr = {};
  causal.mask_bits = {};
  const StagingLayout lay2 = staging_layout(causal);
  EXPECT_EQ(lay2.total_bytes, 8u * 256);
  const model::ForwardBatch s2 = staged_batch(causal, lay2, buf.data());
  EXPECT_TRUE(s2.mask_indptr.empty());
  EXPECT_EQ(s2.mask_indptr.data(), nullptr);
  EXPECT_TRUE(s2.mask_bits.empty());
}

// ---- Copy runs. ----

using Copy = DeviceMemory::Copy;

Copy at(uint8_t* base, size_t dst, size_t src, size_t bytes) {
  return Copy{base + dst, base + src, bytes};
}

TEST(CopyRuns, IndependentCopiesShareOneRun) {
  std::vector<uint8_t> mem(1024);
  uint8_t* m = mem.data();
  const std::vector<Copy> copies = {at(m, 0, 512, 64), at(m, 64, 512, 64), at(m, 128, 600, 10)};
  const auto runs = copy_runs(copies);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].first, 0);
  EXPECT_EQ(runs[0].count, 3);
  EXPECT_EQ(runs[0].max_bytes, 64u);
}

TEST(CopyRuns, HazardsStartANewRun) {
  std::vector<uint8_t> mem(1024);
  uint8_t* m = mem.data();
  // 0 writes [100,110). 1 reads [105,115): read after write, new run. 2 writes [0,4), which
  // copy 0 read, but 0 is in the run before: joins 1. 3 writes [110,112), which 1 reads: write
  // after read, new run. 4 joins it; 5 writes [305,306), which 4 writes: write after write.
  const std::vector<Copy> copies = {at(m, 100, 0, 10),  at(m, 200, 105, 10), at(m, 0, 400, 4),
                                    at(m, 110, 500, 2), at(m, 300, 600, 10), at(m, 305, 700, 1)};
  const auto runs = copy_runs(copies);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].first, 0);
  EXPECT_EQ(runs[0].count, 1);
  EXPECT_EQ(runs[1].first, 1);
  EXPECT_EQ(runs[1].count, 2);
  EXPECT_EQ(runs[2].first, 3);
  EXPECT_EQ(runs[2].count, 2);
  EXPECT_EQ(runs[3].first, 5);
  EXPECT_EQ(runs[3].count, 1);
  EXPECT_EQ(runs[3].max_bytes, 1u);
}

TEST(CopyRuns, AdjacentRangesAreNotHazards) {
  std::vector<uint8_t> mem(256);
  uint8_t* m = mem.data();
  // Reads [0,16) then writes [16,32) and [32,48) reading [48, 64): all disjoint.
  const std::vector<Copy> copies = {at(m, 16, 0, 16), at(m, 32, 48, 16), at(m, 64, 16 + 16, 0)};
  EXPECT_EQ(copy_runs(copies).size(), 1u);
}

// Applying each run's copies in any order gives the in-order result: the runs' contract, checked
// on random lists by running every run backwards.
TEST(CopyRuns, RandomListsRunBackwardsEqualInOrder) {
  const uint32_t seed = 20261125;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<uint8_t> init(512);
    for (uint8_t& b : init) b = (uint8_t)rng();
    std::vector<uint8_t> a = init, b = init;
    std::vector<Copy> copies;
    const int n = 1 + (int)(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const size_t bytes = rng() % 40;
      size_t src = rng() % (512 - bytes), dst = rng() % (512 - bytes);
      // A single copy never overlaps itself (DeviceMemory::copy's regions are memcpy's).
      if (bytes > 0 && (src < dst + bytes && dst < src + bytes)) continue;
      copies.push_back(Copy{(void*)dst, (const void*)src, bytes});  // offsets for now
    }
    auto apply = [](std::vector<uint8_t>& mem, const Copy& c) {
      std::memcpy(mem.data() + (size_t)c.dst, mem.data() + (size_t)c.src, c.bytes);
    };
    for (const Copy& c : copies) apply(a, c);
    for (const CopyRun& r : copy_runs(copies)) {
      for (int i = r.first + r.count - 1; i >= r.first; --i) apply(b, copies[i]);
    }
    ASSERT_EQ(a, b) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace arbor::cuda
