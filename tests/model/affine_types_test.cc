// The affine packed types (Q4_1, Q5_0, Q5_1, Q2_K..Q6_K and llama-quantize's K mixtures) end to
// end: a stories260K-sized model (stories260K inflated to dim 256 / ffn 512 so that every matrix
// has K-quant rows, convert/inflate.h) quantised by `arbor quantize`'s library to each type
//  * round-trips through the GGUF reader and writer byte for byte, with the mixture's types;
//  * generates the same greedy tokens through the packed AVX2 and AVX-512 kernels as through the
//    reference path (kernels::set_affine_reference_path: the kernels' scalar twin, every other
//    kernel unchanged), on three golden prompts in one ragged batch, with bit-identical logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "convert/inflate.h"
#include "gguf/quantize_model.h"
#include "golden_util.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace arbor::model::testing {
namespace {

using gguf::GgmlType;

const char* const kRecipes[] = {"q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K",
                                "q5_K", "q6_K", "q3_K_M", "q4_K_M", "q5_K_M"};

class AffineTypesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / str_cat("arbor_affine_", getpid());
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(require_shared_file(kStories260K));
    auto src = gguf::GgufFile::open(shared_path(kStories260K));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    convert::InflateOptions o;
    o.dim = 256;
    o.ffn = 512;
    o.layers = 5;
    o.kv_ratio = 2;
    o.seed = 3;
    o.random_std = 0.05f;
    auto inflated = convert::inflate_model(*src, o);
    ASSERT_TRUE(inflated.ok()) << inflated.status().to_string();
    const std::string f32 = (dir_ / "f32.gguf").string();
    ASSERT_TRUE(inflated->write(f32).ok());
    auto in = gguf::GgufFile::open(f32);
    ASSERT_TRUE(in.ok()) << in.status().to_string();
    for (const char* name : kRecipes) {
      auto recipe = gguf::parse_quantize_recipe(name);
      ASSERT_TRUE(recipe.ok()) << recipe.status().to_string();
      auto w = gguf::quantize_model(*in, {.target = recipe->type, .mix = recipe->mix}, nullptr);
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      ASSERT_TRUE(w->write(path(name)).ok());
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static std::string path(const std::string& recipe) { return (dir_ / (recipe + ".gguf")).string(); }

  static std::filesystem::path dir_;
};

std::filesystem::path AffineTypesTest::dir_;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST_F(AffineTypesTest, FilesRoundTripByteForByteWithTheirTypes) {
  for (const char* name : kRecipes) {
    SCOPED_TRACE(name);
    auto file = gguf::GgufFile::open(path(name));
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_EQ(gguf::GgufWriter::from_file(*file).serialize(), read_bytes(path(name)));
    const auto recipe = *gguf::parse_quantize_recipe(name);
    EXPECT_EQ(*file->get_u32("general.file_type"), gguf::llama_file_type(recipe));
    EXPECT_EQ(file->find_tensor("blk.1.attn_q.weight")->type, recipe.type);
    EXPECT_EQ(file->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);
  }
  // Q4_K_M on 5 layers: use_more_bits(i, 5) holds for i = 2 and 4; the classifier is q6_K.
  auto m = gguf::GgufFile::open(path("q4_K_M"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->find_tensor("output.weight")->type, GgmlType::kQ6_K);
  for (int i = 0; i < 5; ++i) {
    const GgmlType want = i == 2 || i == 4 ? GgmlType::kQ6_K : GgmlType::kQ4_K;
    EXPECT_EQ(m->find_tensor(str_cat("blk.", i, ".attn_v.weight"))->type, want) << i;
    EXPECT_EQ(m->find_tensor(str_cat("blk.", i, ".ffn_down.weight"))->type, want) << i;
  }
}

TEST_F(AffineTypesTest, PackedKernelsGenerateTheReferenceTokens) {
  if (kernels::best_isa() < kernels::Isa::kAvx2) {
    GTEST_SKIP() << "the CPU lacks AVX2 (best ISA here: "
                 << kernels::isa_name(kernels::best_isa()) << "): no packed kernels to compare";
  }
  const kernels::Isa saved = kernels::active_isa();
  for (const char* name : kRecipes) {
    SCOPED_TRACE(name);
    RunnerOptions opt;
    opt.block_size = 16;
    opt.num_blocks = 64;
    opt.num_threads = 1;
    auto runner = ModelRunner::load(path(name), opt);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    std::vector<GoldenCase> cases = load_stories260k_golden((*runner)->model().file());
    ASSERT_GE(cases.size(), 3u);
    cases.resize(3);
    for (GoldenCase& c : cases) c.max_len = std::min(c.max_len, c.prompt_len + 40);
    for (kernels::Isa isa : {kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
      if (kernels::best_isa() < isa) continue;
      SCOPED_TRACE(kernels::isa_name(isa));
      kernels::set_active_isa(isa);  // every other kernel (attention, norms) of this ISA in both
      const auto packed = greedy_batched(**runner, cases, {});
      kernels::set_affine_reference_path(true);
      const auto reference = greedy_batched(**runner, cases, {});
      kernels::set_affine_reference_path(false);
      ASSERT_EQ(packed.size(), cases.size());
      for (size_t b = 0; b < cases.size(); ++b) {
        EXPECT_GE(packed[b].size(), static_cast<size_t>(cases[b].prompt_len + 8));
        EXPECT_EQ(packed[b], reference[b]) << "case \"" << cases[b].prompt << "\" diverges at "
                                           << common_prefix(packed[b], reference[b]);
      }
    }
  }
  kernels::set_active_isa(saved);
}

}  // namespace
}  // namespace arbor::model::testing
