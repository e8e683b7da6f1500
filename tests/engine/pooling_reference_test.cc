// Pooled vectors against llama.cpp's embeddings API (tests/reference/llama_ref `embed`:
// llama_get_embeddings_seq with the file's pooling_type), on tiny random-weight Qwen3-style files
// whose <arch>.pooling_type is mean, cls, last or rank (with a two-class rank head: the
// Qwen3-Reranker layout), three prompts of 7, 23 and 61 tokens through llama.cpp and through
// arbor's engine (chunks of 16 tokens, all three at once).
//
// Tolerance (max |arbor - llama.cpp| per element), F32 files: 1e-4 for the hidden-state vectors
// (unit-scale elements after the output norm; observed <= 3e-6), 1e-5 for the rank
// probabilities (a softmax of two scores; observed <= 2e-7); and the L2-normalised vectors (what
// /v1/embeddings returns) have a cosine similarity above 0.99999. Q8_0 (last pooling): 0.1 per
// element (the engines quantise activations differently; observed <= 6e-2) and cosine above
// 0.999. llama.cpp runs each prompt alone in one batch (it pools a sequence only when all of it
// is in one ubatch).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <unistd.h>

#include "gguf/quantize_model.h"
#include "pooling_models.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::engine {
namespace {

std::string reference_bin() { return ARBOR_SOURCE_DIR "/tests/reference/.llama/llama_ref"; }

std::vector<std::vector<int32_t>> prompts() {
  std::mt19937_64 rng(21);
  std::vector<std::vector<int32_t>> out;
  for (int32_t len : {7, 23, 61}) {
    std::vector<int32_t> p = testing::random_prompt(rng, len, testing::kPoolingVocab);
    p[0] = 1;  // BOS, as a tokenizer adds it
    out.push_back(std::move(p));
  }
  return out;
}

// llama.cpp's pooled vectors, [prompts][width].
std::vector<std::vector<float>> reference(const std::string& path,
                                          const std::vector<std::vector<int32_t>>& ps,
                                          size_t width, const test::TempDir& dir) {
  std::string lists;
  for (const auto& p : ps) {
    if (!lists.empty()) lists += ";";
    for (size_t i = 0; i < p.size(); ++i) lists += (i ? "," : "") + std::to_string(p[i]);
  }
  const std::string out = dir / "ref.bin";
  const test::CommandResult r =
      test::run_shell(reference_bin() + " embed " + path + " '" + lists + "' " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output();
  std::vector<std::vector<float>> v(ps.size(), std::vector<float>(width));
  std::ifstream in(out, std::ios::binary);
  for (auto& row : v) in.read(reinterpret_cast<char*>(row.data()), width * sizeof(float));
  EXPECT_TRUE(in.good()) << "short output from llama_ref for " << path;
  return v;
}

std::vector<float> l2_normalised(const std::vector<float>& v) {
  double sum = 0.0;
  for (float x : v) sum += double{x} * x;
  std::vector<float> out;
  for (float x : v) out.push_back(static_cast<float>(x / std::sqrt(sum)));
  return out;
}

struct Case {
  std::string name;
  int64_t pooling;  // llama.cpp's number, written into the file
  gguf::GgmlType type;
  float tol;
  double min_cosine;
};

class PoolingReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(PoolingReferenceTest, VectorsMatchLlamaCpp) {
  ASSERT_EQ(access(reference_bin().c_str(), X_OK), 0)
      << reference_bin() << " is missing: run scripts/install_reference.sh (make test does)";
  const Case& c = GetParam();
  test::TempDir dir("pooling_ref");
  const bool rank = c.pooling == 4;
  const std::string f32 = dir / "model-f32.gguf";
  testing::write_pooling_model(f32, c.pooling, rank ? 2 : 0);
  std::string path = f32;
  if (c.type != gguf::GgmlType::kF32) {
    path = dir / "model-q.gguf";
    auto in = gguf::GgufFile::open(f32);
    ASSERT_TRUE(in.ok());
    auto q = gguf::quantize_model(*in, {.target = c.type}, nullptr);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_TRUE(q->write(path).ok());
  }
  const auto ps = prompts();
  const auto want = reference(path, ps, rank ? 2 : 128, dir);
  auto engine = testing::make_pooling_engine(path, {.budget = 16});
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : ps) {
    streams.push_back(testing::submit_pooling(*engine, p, static_cast<step::PoolingType>(c.pooling)));
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> got = testing::drain_pooled(*streams[i]);
    ASSERT_EQ(got.size(), want[i].size());
    float max_diff = 0.0f;
    for (size_t d = 0; d < got.size(); ++d) {
      max_diff = std::max(max_diff, std::abs(got[d] - want[i][d]));
    }
    const std::vector<float> a = l2_normalised(got), b = l2_normalised(want[i]);
    double cosine = 0.0;
    for (size_t d = 0; d < a.size(); ++d) cosine += double{a[d]} * b[d];
    EXPECT_LE(max_diff, c.tol) << c.name << " prompt " << i;
    EXPECT_GE(cosine, c.min_cosine) << c.name << " prompt " << i;
    std::printf("%-10s prompt of %2zu tokens: max |diff| %.2e (tolerance %.0e), cosine %.8f\n",
                c.name.c_str(), ps[i].size(), max_diff, c.tol, cosine);
    if (rank) EXPECT_NEAR(got[0] + got[1], 1.0f, 1e-6f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryPooling, PoolingReferenceTest,
    ::testing::Values(Case{"mean", 1, gguf::GgmlType::kF32, 1e-4f, 0.99999},
                      Case{"cls", 2, gguf::GgmlType::kF32, 1e-4f, 0.99999},
                      Case{"last", 3, gguf::GgmlType::kF32, 1e-4f, 0.99999},
                      Case{"rank", 4, gguf::GgmlType::kF32, 1e-5f, 0.99999},
                      Case{"last_q8_0", 3, gguf::GgmlType::kQ8_0, 0.1f, 0.999}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The Qwen3-Reranker convention for a file converted without a rank head: the LM head's rows of
// the "yes" and "no" tokens (here ids 300 and 301 of a tied qwen3 file), softmaxed, is what
// llama.cpp computes once its converter has written those rows as cls.output.weight; and that
// file's own head gives arbor the same floats bit for bit.
TEST(PoolingReference, YesNoRowsEqualTheConvertedRankHead) {
  ASSERT_EQ(access(reference_bin().c_str(), X_OK), 0)
      << reference_bin() << " is missing: run scripts/install_reference.sh (make test does)";
  test::TempDir dir("pooling_ref");
  const std::string plain = dir / "plain.gguf", converted = dir / "converted.gguf";
  testing::write_pooling_model(plain, -1, 0);
  const int32_t ids[] = {300, 301};
  const std::string names[] = {"yes", "no"};
  {
    auto f = gguf::GgufFile::open(plain);
    ASSERT_TRUE(f.ok());
    const gguf::TensorInfo* embd = f->find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    ASSERT_EQ(embd->type, gguf::GgmlType::kF32);
    const size_t row = static_cast<size_t>(embd->dims[0]) * sizeof(float);
    std::vector<uint8_t> head;
    for (int32_t id : ids) head.insert(head.end(), embd->data + id * row, embd->data + (id + 1) * row);
    gguf::GgufWriter w = gguf::GgufWriter::from_file(*f);
    w.set("qwen3.pooling_type", gguf::Value::u32(4));
    w.set("qwen3.classifier.output_labels", gguf::Value::string_array({"yes", "no"}));
    w.add_tensor_owned("cls.output.weight", gguf::GgmlType::kF32, {embd->dims[0], 2},
                       std::move(head));
    ASSERT_TRUE(w.write(converted).ok());
  }
  const auto ps = prompts();
  const auto want = reference(converted, ps, 2, dir);
  auto by_rows = testing::make_pooling_engine(
      plain, {.budget = 16}, nullptr, [&](executor::LocalExecutor& exec) {
        auto head = executor::rank_head_from_tokens(exec.runner().model(), ids, names);
        ASSERT_TRUE(head.ok()) << head.status().to_string();
        EXPECT_EQ(head->source, "the LM head's rows of 'yes' (300) and 'no' (301)");
        exec.set_rank_head(std::move(head).value());
      });
  auto by_file = testing::make_pooling_engine(converted, {.budget = 16});
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto a = testing::drain_pooled(*testing::submit_pooling(*by_rows, ps[i], step::PoolingType::kRank));
    const auto b = testing::drain_pooled(*testing::submit_pooling(*by_file, ps[i], step::PoolingType::kRank));
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a, b) << "prompt " << i;
    EXPECT_NEAR(a[0], want[i][0], 1e-5f) << "prompt " << i;
    EXPECT_NEAR(a[1], want[i][1], 1e-5f) << "prompt " << i;
    std::printf("yes/no rows prompt of %2zu tokens: P(yes) arbor %.7f, llama.cpp %.7f\n",
                ps[i].size(), a[0], want[i][0]);
  }
}

}  // namespace
}  // namespace arbor::engine
