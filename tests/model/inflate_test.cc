// Inflated stories260K (convert/inflate.h) keeps stories260K's next-token function: the greedy
// golden token for token (F32 and F16 matrices) and the logits at every position of a 257-token
// sequence (bit-identical at width ratio 4, within 1e-4 at ratio 2). And it is the construction
// of the reference implementation, shared/tools/inflate_gguf.py (python3 + numpy): same tensors,
// metadata and logits; only the random rows differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "convert/inflate.h"
#include "gguf/quantize_model.h"
#include "golden_util.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::model::testing {
namespace {

using convert::InflateOptions;
using gguf::GgmlType;

// The small inflation of the tests: dim 64 -> 256 (ratio 4), 5 -> 8 layers, ffn 172 -> 512.
InflateOptions small_inflation(int64_t kv_ratio, GgmlType type) {
  InflateOptions o;
  o.dim = 256;
  o.ffn = 512;
  o.layers = 8;
  o.kv_ratio = kv_ratio;
  o.type = type;
  o.seed = 11;
  return o;
}

class InflateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(require_shared_file(kStories260K));
    auto src = gguf::GgufFile::open(shared_path(kStories260K));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    src_ = std::move(*src);
  }

  // stories260K inflated with `o`, written to the temp folder; returns the path.
  std::string inflate(const InflateOptions& o, const std::string& name) {
    auto writer = convert::inflate_model(src_, o);
    EXPECT_TRUE(writer.ok()) << writer.status().to_string();
    const std::string path = tmp_ / name;
    if (writer.ok()) {
      EXPECT_TRUE(writer->write(path).ok());
    }
    return path;
  }

  // stories260K with every matrix in F16 (what `arbor quantize --type f16` writes).
  std::string stories_f16() {
    auto writer = gguf::quantize_model(src_, {.target = GgmlType::kF16}, nullptr);
    EXPECT_TRUE(writer.ok()) << writer.status().to_string();
    const std::string path = tmp_ / "stories260K_f16.gguf";
    if (writer.ok()) {
      EXPECT_TRUE(writer->write(path).ok());
    }
    return path;
  }

  gguf::GgufFile src_;
  test::TempDir tmp_{"inflate"};
};

std::unique_ptr<ModelRunner> load(const std::string& path, int64_t num_blocks) {
  RunnerOptions opt;
  opt.num_blocks = num_blocks;
  opt.kv_dtype = kernels::KvDtype::kF32;
  opt.num_threads = 1;
  // attn_output and ffn_down in one K segment: the canonical segments follow a file's shape (its
  // kv-head groups, docs/tensor_parallel.md), so an inflated file and its source would sum those
  // rows in other orders; these tests compare the inflation, not tensor parallelism.
  opt.max_segments = 1;
  auto r = ModelRunner::load(path, opt);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Every golden case, all in one ragged batch, greedy.
void expect_golden(const std::string& path, const std::string& what) {
  auto probe = load(path, 4);
  ASSERT_TRUE(probe);
  const std::vector<GoldenCase> cases = load_stories260k_golden(probe->model().file());
  ASSERT_EQ(cases.size(), 6u);
  auto runner = load(path, 6 * 17 + 2);
  ASSERT_TRUE(runner);
  const auto got = greedy_batched(*runner, cases, {});
  ASSERT_EQ(got.size(), cases.size());
  for (size_t b = 0; b < cases.size(); ++b) {
    EXPECT_EQ(got[b], cases[b].ids)
        << what << ": case \"" << cases[b].prompt << "\" diverges at index "
        << common_prefix(got[b], cases[b].ids);
  }
}

// Logits at every position of the first golden case's whole sequence (257 tokens, prompt and
// generated): [257, vocab].
std::vector<float> all_logits(const std::string& path) {
  auto runner = load(path, 17);
  if (!runner) return {};
  const std::vector<GoldenCase> cases = load_stories260k_golden(runner->model().file());
  if (cases.empty()) return {};
  SingleSequence seq(*runner, SingleSequence::contiguous_blocks(0, 17));
  auto logits = seq.append_all_logits(cases[0].ids);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  if (!logits.ok()) return {};
  EXPECT_EQ(logits->size(), cases[0].ids.size() * runner->config().vocab_size);
  return std::vector<float>(logits->begin(), logits->end());
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(InflateTest, F32FollowsTheGolden) {
  expect_golden(inflate(small_inflation(2, GgmlType::kF32), "r2.gguf"), "F32, kv-ratio 2");
  expect_golden(inflate(small_inflation(8, GgmlType::kF32), "r8.gguf"), "F32, kv-ratio 8");
}

TEST_F(InflateTest, F16FollowsTheGoldenAsStories260KInF16Does) {
  // F16 rounding of stories260K itself keeps the golden: the inflation adds nothing to it.
  expect_golden(stories_f16(), "stories260K F16");
  expect_golden(inflate(small_inflation(2, GgmlType::kF16), "r2_f16.gguf"), "F16, kv-ratio 2");
  expect_golden(inflate(small_inflation(8, GgmlType::kF16), "r8_f16.gguf"), "F16, kv-ratio 8");
}

TEST_F(InflateTest, LogitsEqualTheOriginalsAtEveryPosition) {
  const std::vector<float> want = all_logits(shared_path(kStories260K));
  ASSERT_EQ(want.size(), 257u * 512u);
  // kv-ratio 2 keeps the source heads where they were (new head h = h), so attn_output's rows
  // hold the live values at the same positions and every reduction adds the same numbers in the
  // same order, plus zeros; width ratio 4 makes the norm scalings exact: bit-identical.
  const std::vector<float> r2 = all_logits(inflate(small_inflation(2, GgmlType::kF32), "r2.gguf"));
  EXPECT_EQ(max_abs_diff(r2, want), 0.0f);
  // kv-ratio 8 moves source heads 2..7 to heads 8, 9, 16, 17, 24, 25, so attn_output's products
  // land in other accumulator lanes; a kernel may add them in another order (ours do not: 0 on
  // AVX-512).
  const std::vector<float> r8 = all_logits(inflate(small_inflation(8, GgmlType::kF32), "r8.gguf"));
  const float diff8 = max_abs_diff(r8, want);
  std::printf("max |logit difference|: kv-ratio 2: %g, kv-ratio 8: %g\n",
              max_abs_diff(r2, want), diff8);
  EXPECT_LE(diff8, 1e-5f);
  // Width ratio 2: sqrt(1/2) is inexact in float, so the norms round differently.
  InflateOptions ratio2 = small_inflation(2, GgmlType::kF32);
  ratio2.dim = 128;
  const std::vector<float> w2 = all_logits(inflate(ratio2, "w2.gguf"));
  const float diff_w2 = max_abs_diff(w2, want);
  std::printf("max |logit difference|: width ratio 2: %g\n", diff_w2);
  EXPECT_LE(diff_w2, 1e-4f);
}

TEST_F(InflateTest, F16LogitsEqualStories260KInF16) {
  const std::vector<float> want = all_logits(stories_f16());
  const std::vector<float> got =
      all_logits(inflate(small_inflation(2, GgmlType::kF16), "r2_f16.gguf"));
  ASSERT_EQ(want.size(), 257u * 512u);
  EXPECT_EQ(max_abs_diff(got, want), 0.0f);
}

// A mixture of experts: 8 experts of the grown FFN, 2 routed per token (Mixtral's layout on
// llama; softmax over the chosen, so the weights sum to 1).
InflateOptions moe_inflation() {
  InflateOptions o = small_inflation(2, GgmlType::kF32);
  o.dim = 128;
  o.ffn = 256;
  o.layers = 6;
  o.experts = 8;
  o.experts_used = 2;
  return o;
}

// llama.cpp's logits [ids.size(), vocab] for `path` (tests/reference/.llama/llama_ref).
std::vector<float> llama_cpp_logits(const std::string& path, const std::vector<int32_t>& ids,
                                    const test::TempDir& tmp, size_t vocab) {
  const std::string bin = ARBOR_SOURCE_DIR "/tests/reference/.llama/llama_ref";
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const std::string out = tmp / "llama_cpp_logits.bin";
  const test::CommandResult r = test::run_shell(bin + " logits " + path + " " + list + " " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output() << "(scripts/install_reference.sh installs " << bin
                            << "; make test does)";
  std::vector<float> logits(ids.size() * vocab);
  std::ifstream in(out, std::ios::binary);
  in.read(reinterpret_cast<char*>(logits.data()),
          static_cast<std::streamsize>(logits.size() * sizeof(float)));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  return logits;
}

TEST_F(InflateTest, MixtureOfExpertsKeepsTheLogitsInArborAndInLlamaCpp) {
  const std::string path = inflate(moe_inflation(), "moe.gguf");
  auto file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get_i64("llama.expert_count"), 8);
  EXPECT_EQ(*file->get_i64("llama.expert_used_count"), 2);
  const gguf::TensorInfo* gate = file->find_tensor("blk.5.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->dims, (std::vector<int64_t>{128, 256, 8}));
  EXPECT_EQ(file->find_tensor("blk.0.ffn_down_exps.weight")->dims,
            (std::vector<int64_t>{256, 128, 8}));
  EXPECT_EQ(file->find_tensor("blk.0.ffn_gate_inp.weight")->dims,
            (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(file->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  expect_golden(path, "MoE, 8 experts, top 2");
  // Every position of the 257-token sequence: the source's logits, to the rounding of the
  // routed weights' sum (K = 2 equal terms) — in arbor and in llama.cpp, which reads the
  // mixture its own way (an independent check of the layout and the routing convention).
  const std::vector<float> want = all_logits(shared_path(kStories260K));
  ASSERT_EQ(want.size(), 257u * 512u);
  EXPECT_LE(max_abs_diff(all_logits(path), want), 2e-4f);
  auto probe = load(path, 4);
  ASSERT_TRUE(probe);
  const std::vector<GoldenCase> cases = load_stories260k_golden(probe->model().file());
  ASSERT_FALSE(cases.empty());
  EXPECT_LE(max_abs_diff(llama_cpp_logits(path, cases[0].ids, tmp_, 512), want), 2e-3f);
}

// The reference's file for the small inflation (kv-ratio 8), F32 or F16.
std::string reference_inflation(const test::TempDir& tmp, bool f16) {
  const std::string tool = "tools/inflate_gguf.py";
  if (!test::expect_shared_file(tool)) return "";
  const std::string out = tmp / (f16 ? "ref_f16.gguf" : "ref.gguf");
  const test::CommandResult r = test::run_shell(
      shared_path(tool) + " " + shared_path(kStories260K) + " " + out +
      " --dim 256 --ffn 512 --layers 8 --kv-ratio 8" + (f16 ? " --f16" : ""));
  EXPECT_EQ(r.exit_code, 0) << r.output() << "(the tool needs /usr/bin/python3 with numpy: "
                            << "scripts/install_deps.sh --tests installs python3-numpy)";
  return out;
}

// Tensors whose every value the construction fixes (no random rows).
bool deterministic(const std::string& name) {
  for (const char* t : {"token_embd", "output", "_norm", "attn_output", "ffn_down"}) {
    if (name.find(t) != std::string::npos) return true;
  }
  return false;
}

TEST_F(InflateTest, SameTensorsMetadataAndLogitsAsTheReference) {
  for (const bool f16 : {false, true}) {
    SCOPED_TRACE(f16 ? "F16" : "F32");
    const GgmlType type = f16 ? GgmlType::kF16 : GgmlType::kF32;
    const std::string ref_path = reference_inflation(tmp_, f16);
    const std::string ours_path = inflate(small_inflation(8, type), f16 ? "o16.gguf" : "o32.gguf");
    auto ref = gguf::GgufFile::open(ref_path);
    auto ours = gguf::GgufFile::open(ours_path);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    ASSERT_TRUE(ours.ok()) << ours.status().to_string();
    // Metadata: the reference's keys with its values, in its order; we add general.file_type.
    ASSERT_EQ(ours->metadata().size(), ref->metadata().size() + 1);
    for (size_t i = 0; i < ref->metadata().size(); ++i) {
      EXPECT_EQ(ours->metadata()[i].key, ref->metadata()[i].key);
      EXPECT_TRUE(ours->metadata()[i].value == ref->metadata()[i].value)
          << ref->metadata()[i].key << ": ours " << gguf::value_to_string(ours->metadata()[i].value)
          << ", reference " << gguf::value_to_string(ref->metadata()[i].value);
    }
    EXPECT_EQ(ours->metadata().back().key, "general.file_type");
    // Tensors: names, order, shapes, types; the ones without random rows byte for byte.
    ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
    for (size_t i = 0; i < ref->tensors().size(); ++i) {
      const gguf::TensorInfo &a = ours->tensors()[i], &b = ref->tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.dims, b.dims) << b.name;
      EXPECT_EQ(a.type, b.type) << b.name;
      if (deterministic(b.name) && a.size_bytes == b.size_bytes) {
        EXPECT_EQ(std::memcmp(a.data, b.data, a.size_bytes), 0) << b.name;
      }
    }
    // The random rows differ, their products with zero do not: the same logits exactly.
    const std::vector<float> want = all_logits(ref_path);
    ASSERT_EQ(want.size(), 257u * 512u);
    EXPECT_EQ(max_abs_diff(all_logits(ours_path), want), 0.0f);
    expect_golden(ref_path, f16 ? "reference F16" : "reference F32");
  }
}

}  // namespace
}  // namespace arbor::model::testing
