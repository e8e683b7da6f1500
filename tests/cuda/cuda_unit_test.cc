// What src/cuda does without a GPU: the runtime's report, make_cuda_forward_ops() refusing with a
// clear error, the host-side planning (weight upload, batch staging, copy runs) that
// CudaForwardOps relies on, and the GPU matmul's decoding of the affine weight types
// (cuda/ggml_dequant.h, the same functions the kernels run) against gguf's and the CPU kernels'
// decoders. Built with and without ARBOR_CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "cuda/cuda_forward_ops.h"
#include "cuda/ggml_dequant.h"
#include "cuda/host_plan.h"
#ifdef ARBOR_HAVE_CUDA
#include "cuda/matmul_internal.cuh"
#endif
#include "cuda/runtime.h"
#include "gguf/quants.h"
#include "kernels/packed_affine.h"
#include "model/llama_model.h"
#include "model/synth_model.h"
#include "support/temp_dir.h"
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

// check_cuda_runs (what --device auto asks before it picks a GPU): the llama rows run; every other
// architecture and the llama variants the GPU path lacks (experts among them) are refused,
// naming what and --device cpu. Built without CUDA, it says so.
TEST(CudaForwardOps, CheckCudaRunsNamesWhatTheGpuPathLacks) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  auto stories = gguf::GgufFile::open(test::shared_path(test::kStories260K));
  ASSERT_TRUE(stories.ok()) << stories.status().to_string();
  std::vector<gguf::KeyValue> tokenizer_keys;
  for (const gguf::KeyValue& kv : stories->metadata()) {
    if (kv.key.starts_with("tokenizer.")) tokenizer_keys.push_back(kv);
  }
  const test::TempDir dir;
  auto check = [&](const model::SynthShape& shape,
                   gguf::GgmlType type = gguf::GgmlType::kQ8_0) {
    kernels::ThreadPool pool(1);
    auto w = model::synth_model(shape, type, 7, 512, tokenizer_keys, pool);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    const std::string path = dir.path() + "/" + shape.name + ".gguf";
    EXPECT_TRUE(w.ok() && w->write(path).ok());
    auto m = model::LlamaModel::load(path, {.pack_for_cpu = false});
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? check_cuda_runs(**m) : m.status();
  };
  const model::SynthShape llama{.name = "llama", .dim = 64, .ffn = 128, .layers = 2, .heads = 4,
                                .kv_heads = 2, .context = 256};
  model::SynthShape biased = llama;
  biased.name = "biased";
  biased.out_bias = true;
  const model::SynthShape qwen3 = model::with_arch({.name = "qwen3", .dim = 64, .ffn = 128,
                                                    .layers = 2, .heads = 4, .kv_heads = 2,
                                                    .context = 256},
                                                   "qwen3");
  model::SynthShape mixtral = llama;  // llama with experts: the row the GPU runs, plus experts
  mixtral.name = "mixtral";
  mixtral.experts = 4;
  mixtral.experts_used = 2;
  model::SynthShape qwen3moe = model::with_arch(qwen3, "qwen3moe");
  qwen3moe.experts = 4;
  qwen3moe.experts_used = 2;
  qwen3moe.expert_ffn = 64;
  model::SynthShape gpt_oss = model::with_arch(qwen3, "gpt-oss");
  gpt_oss.experts = 4;
  gpt_oss.experts_used = 2;
  gpt_oss.expert_ffn = 64;
  gpt_oss.window = 8;
  gpt_oss.tied = false;  // gpt-oss requires output.weight
#ifdef ARBOR_HAVE_CUDA
  EXPECT_TRUE(check(llama).ok()) << check(llama).to_string();
  for (const auto& [shape, lacks] : {std::pair{biased, "attention-output or feed-forward biases"},
                                     std::pair{qwen3, "the qwen3 architecture"},
                                     std::pair{mixtral, "mixture-of-experts feed-forward blocks"},
                                     std::pair{qwen3moe, "the qwen3moe architecture"},
                                     std::pair{gpt_oss, "the gpt-oss architecture"}}) {
    const Status st = check(shape);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << shape.name << ": " << st.to_string();
    EXPECT_NE(st.message().find(lacks), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("--device cpu"), std::string::npos) << st.message();
  }
  // The codebook types have CPU kernels only: refused, naming the tensor and the type.
  const model::SynthShape llama256{.name = "llama256", .dim = 256, .ffn = 512, .layers = 1,
                                   .heads = 4, .kv_heads = 2, .context = 256};
  for (gguf::GgmlType type :
       {gguf::GgmlType::kMXFP4, gguf::GgmlType::kIQ4_NL, gguf::GgmlType::kIQ4_XS}) {
    const Status st = check(llama256, type);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
    EXPECT_NE(st.message().find(".weight has type " + std::string(gguf::ggml_type_name(type))),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("--device cpu"), std::string::npos) << st.message();
  }
#else
  EXPECT_EQ(check(llama).code(), StatusCode::kFailedPrecondition);
#endif
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
  for (const model::LayerWeights& l : w.layers) expected += (l.q.bias != nullptr) + (l.k.bias != nullptr) + (l.v.bias != nullptr);
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
  const model::LlamaWeights d = device_weights(h, model_->config(), *plan, base);
  EXPECT_EQ(d.token_embd.data, base + plan->tensors[0].offset);
  EXPECT_EQ(d.layers.size(), h.layers.size());
  EXPECT_EQ(d.tied_output, h.tied_output);
  if (h.tied_output) {
    EXPECT_EQ(d.output.w.data, d.token_embd.data);
  }
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const kernels::WeightView& hv = h.layers[l].down.w;
    const kernels::WeightView& dv = d.layers[l].down.w;
    EXPECT_EQ(dv.rows, hv.rows);
    EXPECT_EQ(dv.cols, hv.cols);
    EXPECT_EQ(dv.type, hv.type);
    EXPECT_EQ(dv.row_stride, kernels::weight_row_bytes(hv.type, hv.cols));
    EXPECT_EQ(dv.packed, nullptr);
    EXPECT_GE(static_cast<const uint8_t*>(dv.data), base);
    EXPECT_LE(static_cast<const uint8_t*>(dv.data) + dv.row_stride * dv.rows, base + fake.size());
    EXPECT_NE(d.layers[l].attn_norm, nullptr);
    EXPECT_EQ(d.layers[l].q.bias == nullptr, h.layers[l].q.bias == nullptr);
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
                             logits = {0, 2}, mask_indptr = {0, 0, 4}, hidden = {1};
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
  b.hidden_indices = hidden;
  const StagingLayout lay = staging_layout(b);
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(lay.offsets[i], i * 256) << i;
  EXPECT_EQ(lay.total_bytes, 11u * 256);
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
  EXPECT_TRUE(same(s.hidden_indices, b.hidden_indices));
  EXPECT_EQ((const uint8_t*)s.positions.data(), buf.data() + 256);

  model::ForwardBatch causal = b;
  causal.mask_indptr = {};
  causal.mask_bits = {};
  const StagingLayout lay2 = staging_layout(causal);
  EXPECT_EQ(lay2.total_bytes, 9u * 256);
  const model::ForwardBatch s2 = staged_batch(causal, lay2, buf.data());
  EXPECT_TRUE(s2.mask_indptr.empty());
  EXPECT_EQ(s2.mask_indptr.data(), nullptr);
  EXPECT_TRUE(s2.mask_bits.empty());

  // A second KV cache group: its three arrays follow, and its views come back in `groups`.
  const std::vector<int32_t> kvi1 = {0, 1, 3}, pages1 = {7, 8, 5}, slots1 = {112, 80, 81};
  const model::KvGroupArrays more[] = {{kvi1, pages1, slots1}};
  model::ForwardBatch two = b;
  two.more_kv_groups = more;
  const StagingLayout lay3 = staging_layout(two);
  ASSERT_EQ(lay3.group_offsets.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lay3.group_offsets[i], (11 + i) * 256) << i;
  std::vector<uint8_t> buf3(lay3.total_bytes, 0xee);
  write_staging(two, lay3, buf3.data());
  std::vector<model::KvGroupArrays> groups;
  const model::ForwardBatch s3 = staged_batch(two, lay3, buf3.data(), &groups);
  ASSERT_EQ(s3.num_kv_groups(), 2);
  EXPECT_TRUE(same(s3.kv_group(1).kv_indptr, kvi1));
  EXPECT_TRUE(same(s3.kv_group(1).kv_page_indices, pages1));
  EXPECT_TRUE(same(s3.kv_group(1).slot_mapping, slots1));
  EXPECT_EQ((const uint8_t*)s3.kv_group(1).slot_mapping.data(), buf3.data() + 13 * 256);
  EXPECT_TRUE(same(s3.kv_group(0).kv_page_indices, pages));
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

// ---- Affine weight types: cuda/ggml_dequant.h against gguf and the CPU kernels. ----

namespace dq = arbor::cuda::ggml;
using gguf::GgmlType;

constexpr GgmlType kAffineTypes[] = {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                                     GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                     GgmlType::kQ5_K, GgmlType::kQ6_K};

// Bit for bit, except that any NaN equals any NaN: which NaN an operation on NaN or inf * 0
// gives is the compiler's and the processor's choice (x86 keeps the first operand's, and gcc
// may swap the operands of a sum; the GPU gives its canonical NaN).
bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

TEST(GgmlDequant, TraitsMatchGgufAndTheCpuFormats) {
  for (const GgmlType t : kAffineTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(t));
    const dq::AffineTraits tr = dq::affine_traits(t);
    const kernels::internal::AffineFormat f = kernels::internal::affine_format(t);
    EXPECT_TRUE(dq::is_affine(t));
    EXPECT_EQ(static_cast<uint32_t>(tr.block_elems), gguf::ggml_traits(t).block_size);
    EXPECT_EQ(static_cast<uint32_t>(tr.block_bytes), gguf::ggml_traits(t).type_size);
    EXPECT_EQ(tr.split, f.split);
    EXPECT_EQ(tr.has_min, f.has_min);
    EXPECT_EQ(tr.zero, f.zero);
  }
  for (const GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                           GgmlType::kQ4_0, GgmlType::kQ8_1, GgmlType::kQ8_K}) {
    EXPECT_FALSE(dq::is_affine(t)) << gguf::ggml_type_name(t);
  }
}

TEST(GgmlDequant, BytePrimitives) {
  for (uint32_t k : {4u, 16u, 32u}) {
    for (uint32_t u = 0; u < 128; ++u) {
      const uint32_t word = u | ((127 - u) << 8) | ((u ^ 0x55) << 16) | ((u * 7 % 128) << 24);
      const uint32_t got = dq::sub_bytes(word, k);
      for (int b = 0; b < 4; ++b) {
        const int want = static_cast<int>((word >> (8 * b)) & 0xFF) - static_cast<int>(k);
        ASSERT_EQ(static_cast<int8_t>(got >> (8 * b)), want) << "u " << u << " k " << k;
      }
    }
  }
  for (uint32_t b = 0; b < 16; ++b) {
    uint32_t want = 0;
    for (int i = 0; i < 4; ++i) want |= ((b >> i) & 1u) << (8 * i);
    EXPECT_EQ(dq::spread_bits4(b | 0xFFF0u), want) << b;  // bits above 3 are ignored
  }
  const uint8_t bytes[6] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66};
  EXPECT_EQ(dq::load_u16(bytes + 2), 0x4433u);
  EXPECT_EQ(dq::load_u32(bytes + 2), 0x66554433u);
}

// gguf's reference dequantisation of one block (any alignment): out [block_elems].
void gguf_dequantize_block(GgmlType t, const uint8_t* src, float* out) {
  auto run = [&](auto block, auto fn) {
    std::memcpy(&block, src, sizeof(block));
    fn(block, out);
  };
  switch (t) {
    case GgmlType::kQ4_1:
      return run(gguf::BlockQ4_1{}, gguf::dequantize_block_q4_1);
    case GgmlType::kQ5_0:
      return run(gguf::BlockQ5_0{}, gguf::dequantize_block_q5_0);
    case GgmlType::kQ5_1:
      return run(gguf::BlockQ5_1{}, gguf::dequantize_block_q5_1);
    case GgmlType::kQ2_K:
      return run(gguf::BlockQ2_K{}, gguf::dequantize_block_q2_K);
    case GgmlType::kQ3_K:
      return run(gguf::BlockQ3_K{}, gguf::dequantize_block_q3_K);
    case GgmlType::kQ4_K:
      return run(gguf::BlockQ4_K{}, gguf::dequantize_block_q4_K);
    case GgmlType::kQ5_K:
      return run(gguf::BlockQ5_K{}, gguf::dequantize_block_q5_K);
    case GgmlType::kQ6_K:
      return run(gguf::BlockQ6_K{}, gguf::dequantize_block_q6_K);
    default:
      FAIL() << "not an affine type";
  }
}

// Byte offsets of a block's f16 scale fields (d, and dmin / m where the type has one).
std::vector<size_t> half_fields(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ5_0:
      return {0};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// How the blocks of a test row are filled.
enum class Fill { kQuantized, kRandomBytes, kExtremeScales, kAllOnes, kZeroScales };

constexpr uint16_t kExtremeHalves[] = {0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0400,
                                       0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x03FF, 0x1234};

// A row of `blocks` blocks of type t, filled as `fill` says.
std::vector<uint8_t> make_row(GgmlType t, int blocks, Fill fill, std::mt19937& rng) {
  const dq::AffineTraits tr = dq::affine_traits(t);
  const int64_t cols = int64_t{tr.block_elems} * blocks;
  std::vector<uint8_t> row(static_cast<size_t>(tr.block_bytes) * blocks);
  if (fill == Fill::kQuantized) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(cols));
    // Per block a random magnitude and offset, so mins and scales take many values.
    for (int64_t c = 0; c < cols; ++c) {
      if (c % tr.block_elems == 0) dist = std::normal_distribution<float>(dist(rng), 0.01f + std::fabs(dist(rng)));
      x[static_cast<size_t>(c)] = dist(rng);
    }
    const Status st = gguf::quantize_row(t, x.data(), row.data(), cols);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return row;
  }
  for (uint8_t& b : row) b = fill == Fill::kAllOnes ? 0xFF : static_cast<uint8_t>(rng());
  for (int b = 0; b < blocks; ++b) {
    uint8_t* blk = row.data() + static_cast<size_t>(b) * tr.block_bytes;
    for (const size_t at : half_fields(t)) {
      uint16_t h = 0;
      if (fill == Fill::kExtremeScales) h = kExtremeHalves[rng() % std::size(kExtremeHalves)];
      if (fill == Fill::kRandomBytes || fill == Fill::kAllOnes) std::memcpy(&h, blk + at, 2);
      std::memcpy(blk + at, &h, 2);
    }
  }
  return row;
}

// Every run of the row (at a 2-byte aligned, not 4-byte aligned address) against gguf's blocks
// and the CPU kernels' decode_affine_block, bit for bit.
void check_row_runs(GgmlType t, const std::vector<uint8_t>& bytes, int blocks) {
  const dq::AffineTraits tr = dq::affine_traits(t);
  const kernels::internal::AffineFormat f = kernels::internal::affine_format(t);
  const int32_t cols = tr.block_elems * blocks;
  std::vector<uint8_t> buffer(bytes.size() + 2);
  std::memcpy(buffer.data() + 2, bytes.data(), bytes.size());
  const uint8_t* row = buffer.data() + 2;
  std::vector<float> want(static_cast<size_t>(cols));
  for (int b = 0; b < blocks; ++b) {
    gguf_dequantize_block(t, bytes.data() + static_cast<size_t>(b) * tr.block_bytes,
                          want.data() + static_cast<size_t>(b) * tr.block_elems);
  }
  for (int32_t col = 0; col < cols; col += 4) {
    const dq::WeightRun run = dq::decode_run(t, row, col);
    kernels::internal::AffineBlock blk;
    kernels::internal::decode_affine_block(t, row, col / 32, &blk);
    const int e = col % 32, half = f.split ? e / 16 : 0;
    ASSERT_TRUE(same_bits(run.scale, kernels::internal::affine_scale(f, blk, half)))
        << "col " << col << ": scale " << run.scale;
    ASSERT_TRUE(same_bits(run.offset, kernels::internal::affine_offset(f, blk, half)))
        << "col " << col << ": offset " << run.offset;
    for (int k = 0; k < 4; ++k) {
      const float w = dq::run_weight(run, k, tr.has_min);
      ASSERT_TRUE(same_bits(w, want[static_cast<size_t>(col + k)]))
          << "col " << col + k << ": " << w << " vs gguf " << want[static_cast<size_t>(col + k)];
      ASSERT_TRUE(same_bits(dq::affine_weight_at(t, row, col + k), w)) << "col " << col + k;
      ASSERT_EQ(dq::run_quant(run, k), blk.u[e + k] - f.zero) << "col " << col + k;
    }
  }
}

// The quants-only instantiation (what the kernels use for a sub-block's second run) decodes
// the same q and leaves the scales zero.
template <GgmlType T>
void check_quants_only(const std::vector<uint8_t>& row, int32_t cols) {
  for (int32_t col = 0; col < cols; col += 4) {
    const dq::WeightRun full = dq::decode_run<T>(row.data(), col);
    const dq::WeightRun q = dq::decode_run<T, false>(row.data(), col);
    ASSERT_EQ(q.q, full.q) << "col " << col;
    ASSERT_EQ(q.scale, 0.0f);
    ASSERT_EQ(q.offset, 0.0f);
  }
}

void check_quants_only(GgmlType t, const std::vector<uint8_t>& row, int32_t cols) {
  switch (t) {
    case GgmlType::kQ4_1:
      return check_quants_only<GgmlType::kQ4_1>(row, cols);
    case GgmlType::kQ5_0:
      return check_quants_only<GgmlType::kQ5_0>(row, cols);
    case GgmlType::kQ5_1:
      return check_quants_only<GgmlType::kQ5_1>(row, cols);
    case GgmlType::kQ2_K:
      return check_quants_only<GgmlType::kQ2_K>(row, cols);
    case GgmlType::kQ3_K:
      return check_quants_only<GgmlType::kQ3_K>(row, cols);
    case GgmlType::kQ4_K:
      return check_quants_only<GgmlType::kQ4_K>(row, cols);
    case GgmlType::kQ5_K:
      return check_quants_only<GgmlType::kQ5_K>(row, cols);
    case GgmlType::kQ6_K:
      return check_quants_only<GgmlType::kQ6_K>(row, cols);
    default:
      FAIL() << "not an affine type";
  }
}

TEST(GgmlDequant, RunsEqualGgufAndCpuDecodingBitForBit) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kBlocks = 3;  // block indices past 0 and rows not starting 4-byte aligned
  for (const GgmlType t : kAffineTypes) {
    SCOPED_TRACE(gguf::ggml_type_name(t));
    for (const Fill fill : {Fill::kQuantized, Fill::kRandomBytes, Fill::kExtremeScales,
                            Fill::kAllOnes, Fill::kZeroScales}) {
      SCOPED_TRACE(::testing::Message() << "fill " << static_cast<int>(fill));
      const int reps = fill == Fill::kAllOnes ? 1 : 40;
      for (int rep = 0; rep < reps; ++rep) {
        const std::vector<uint8_t> row = make_row(t, kBlocks, fill, rng);
        check_row_runs(t, row, kBlocks);
        check_quants_only(t, row, dq::affine_traits(t).block_elems * kBlocks);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// affine_step<T> (and the K-quants' affine_unit_end) against the CPU kernels' affine_block_step
// over random quantised rows and activations, the integer dots formed from the runs as the GPU's
// MMAs form them.
template <GgmlType T>
void check_affine_steps(std::mt19937& rng) {
  constexpr dq::AffineTraits kT = dq::affine_traits(T);
  const kernels::internal::AffineFormat f = kernels::internal::affine_format(T);
  constexpr int64_t kCols = 512;
  const std::vector<uint8_t> row = make_row(T, kCols / kT.block_elems, Fill::kQuantized, rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kCols);
  for (float& v : x) v = dist(rng);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero activation block (d = 0)
  std::vector<kernels::internal::ActBlockAffine> acts(kCols / 32);
  kernels::internal::pack_act_row_affine(x.data(), kCols, f, acts.data(), 1, false);
  // The K-quants' activations share a scale per super-block, and their offsets multiply the
  // bare sums (the scale comes in at the super-block's end).
  ASSERT_EQ(dq::scales_per_unit(kT), kernels::internal::scales_per_unit(f));
  const bool per_unit = dq::scales_per_unit(kT);
  for (int64_t b = 0; b < kCols / 32; ++b) {
    const kernels::internal::ActBlockAffine& a = acts[static_cast<size_t>(b)];
    if (per_unit) ASSERT_TRUE(same_bits(a.d, acts[static_cast<size_t>(b / 8 * 8)].d));
    const float m = per_unit ? 1.0f : a.d;
    dq::ActSums s;
    s.d = a.d;
    s.msum0 = m * static_cast<float>(a.sum[0]);
    s.msum1 = m * static_cast<float>(a.sum[1]);
    s.msum = m * static_cast<float>(a.sum[0] + a.sum[1]);
    ASSERT_TRUE(same_bits(s.msum, a.msum));
    ASSERT_TRUE(same_bits(s.msum0, a.msum_half[0]));
    ASSERT_TRUE(same_bits(s.msum1, a.msum_half[1]));
    int32_t dot[2] = {0, 0};
    for (int run = 0; run < 8; ++run) {
      const dq::WeightRun r = dq::decode_run<T>(row.data(), static_cast<int32_t>(32 * b + 4 * run));
      for (int k = 0; k < 4; ++k) dot[run / 4] += dq::run_quant(r, k) * a.qs[4 * run + k];
    }
    const dq::WeightRun lo = dq::decode_run<T>(row.data(), static_cast<int32_t>(32 * b));
    const dq::WeightRun hi = dq::decode_run<T>(row.data(), static_cast<int32_t>(32 * b + 16));
    kernels::internal::AffineBlock blk;
    kernels::internal::decode_affine_block(T, row.data(), b, &blk);
    for (const float acc : {0.0f, dist(rng), 1e3f * dist(rng)}) {
      const float want = kernels::internal::affine_block_step(f, blk, a, acc);
      const float got = dq::affine_step<T>(dot[0], dot[1], lo, hi, s, acc);
      ASSERT_TRUE(same_bits(got, want)) << "block " << b << ": " << got << " vs " << want;
      if (!kT.split) {  // the MMA of a whole block gives only lo + hi
        ASSERT_TRUE(same_bits(dq::affine_step<T>(dot[0] + dot[1], 0, lo, hi, s, acc), want));
      }
      if (per_unit) {
        ASSERT_TRUE(same_bits(dq::affine_unit_end(s, acc, 1.5f),
                              kernels::internal::affine_unit_end(a, acc, 1.5f)));
      }
    }
  }
}

#ifdef ARBOR_HAVE_CUDA
// The tensor-core kernels' K slices, for every row length up to 16,384 columns in steps of 32
// and both alignments: whole aligned groups of chunks per slice (the K-quants' super-blocks of
// kUnitChunks: the affine kernel multiplies a super-block's partial sum by its activation scale
// at the super-block's last chunk, so a slice that cut one would drop or double that product),
// at most kMaxSlices slices, every chunk in exactly one slice.
TEST(CudaSlicePlan, SlicesHoldWholeAlignedGroupsAndCoverEveryChunk) {
  for (const int32_t align : {internal::kUnroll, internal::kUnitChunks}) {
    for (int64_t cols = 32; cols <= 16384; cols += 32) {
      SCOPED_TRACE(::testing::Message() << "align " << align << " cols " << cols);
      const internal::SlicePlan p = internal::slice_plan(cols, align);
      ASSERT_EQ(p.chunks, cols / 32);
      ASSERT_EQ(p.chunks_per_slice % align, 0);
      ASSERT_GE(p.slices, 1);
      ASSERT_LE(p.slices, internal::kMaxSlices);
      ASSERT_GE(p.slices * p.chunks_per_slice, p.chunks);
      ASSERT_LT((p.slices - 1) * p.chunks_per_slice, p.chunks);
    }
  }
  // The K-quants' rows are whole super-blocks, so every slice (the last one too) starts and
  // ends on one.
  for (int64_t cols = 256; cols <= 16384; cols += 256) {
    const internal::SlicePlan p = internal::slice_plan(cols, internal::kUnitChunks);
    for (int32_t s = 0; s < p.slices; ++s) {
      const int32_t end = std::min(p.chunks, (s + 1) * p.chunks_per_slice);
      ASSERT_EQ(s * p.chunks_per_slice % internal::kUnitChunks, 0) << cols;
      ASSERT_EQ(end % internal::kUnitChunks, 0) << cols;
    }
  }
}
#endif

TEST(GgmlDequant, AffineStepEqualsTheCpuBlockStep) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int rep = 0; rep < 20 && !HasFatalFailure(); ++rep) {
    check_affine_steps<GgmlType::kQ4_1>(rng);
    check_affine_steps<GgmlType::kQ5_0>(rng);
    check_affine_steps<GgmlType::kQ5_1>(rng);
    check_affine_steps<GgmlType::kQ2_K>(rng);
    check_affine_steps<GgmlType::kQ3_K>(rng);
    check_affine_steps<GgmlType::kQ4_K>(rng);
    check_affine_steps<GgmlType::kQ5_K>(rng);
    check_affine_steps<GgmlType::kQ6_K>(rng);
  }
}

}  // namespace
}  // namespace arbor::cuda
