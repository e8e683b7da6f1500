// The codebook weight types MXFP4, IQ4_NL and IQ4_XS end to end, against llama.cpp (the
// independent reference of tests/reference, scripts/install_reference.sh): a random-weight
// llama file (dim 256, ffn 512, 4 layers) quantised by `arbor quantize`'s library to each type,
// and a qwen3moe file with 4 experts, every one routed (k = E, so no near-tied routing choice can
// flip between the engines), in IQ4_XS (its 64-wide expert down projections fall back to IQ4_NL,
// as llama-quantize's do) and in llama.cpp's MXFP4_MOE mixture (experts MXFP4, other matrices
// Q8_0) — the 3-D expert tensors through the grouped expert kernels. Both engines evaluate the
// same 64 token ids; the logits must agree within 0.25 at every position (arch_reference_test's
// tolerance for quantised files: each engine quantises activations its own way), the top-1
// token wherever llama.cpp's top-2 margin exceeds that, and arbor's distance from the F32 file's
// logits must be no worse than 1.5x llama.cpp's own.
// Also: the IQ types without kernels (IQ1_S, IQ2_*, IQ3_*) are refused at load, naming the
// tensor and its type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/quantize_model.h"
#include "kernels/thread_pool.h"
#include "model/runner.h"
#include "model/support_check.h"
#include "model/synth_model.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::model::testing {
namespace {

using gguf::GgmlType;

constexpr int kTokens = 64;
constexpr int kVocab = 512;

std::string llama_ref() { return ARBOR_SOURCE_DIR "/tests/reference/.llama/llama_ref"; }

std::vector<int32_t> prompt() {
  std::mt19937 rng(36);
  std::vector<int32_t> ids = {1};
  while (static_cast<int>(ids.size()) < kTokens) ids.push_back(3 + static_cast<int32_t>(rng() % 509));
  return ids;
}

std::vector<gguf::KeyValue> tokenizer_keys() {
  auto f = gguf::GgufFile::open(test::shared_path(test::kStories260K));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  std::vector<gguf::KeyValue> keys;
  if (!f.ok()) return keys;
  for (const gguf::KeyValue& kv : f->metadata()) {
    if (kv.key.starts_with("tokenizer.")) keys.push_back(kv);
  }
  return keys;
}

std::string write_f32(const SynthShape& s, const test::TempDir& dir) {
  kernels::ThreadPool pool(2);
  auto w = synth_model(s, GgmlType::kF32, 7, kVocab, tokenizer_keys(), pool);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  const std::string path = dir / (s.name + "-f32.gguf");
  if (w.ok()) EXPECT_TRUE(w->write(path).ok());
  return path;
}

std::string write_quantized(const std::string& f32, const std::string& recipe,
                            const test::TempDir& dir) {
  auto in = gguf::GgufFile::open(f32);
  EXPECT_TRUE(in.ok()) << in.status().to_string();
  auto r = gguf::parse_quantize_recipe(recipe);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto q = gguf::quantize_model(*in, {.target = r->type, .mix = r->mix}, nullptr);
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  const std::string path = f32.substr(0, f32.size() - 9) + "-" + recipe + ".gguf";
  if (q.ok()) EXPECT_TRUE(q->write(path).ok());
  return path;
}

std::vector<float> reference_logits(const std::string& path, const test::TempDir& dir) {
  std::string list;
  for (int32_t id : prompt()) list += (list.empty() ? "" : ",") + std::to_string(id);
  const std::string out = dir / "ref.bin";
  const test::CommandResult r = test::run_shell(llama_ref() + " logits " + path + " " + list + " " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output();
  std::vector<float> logits(static_cast<size_t>(kTokens) * kVocab);
  std::ifstream in(out, std::ios::binary);
  in.read(reinterpret_cast<char*>(logits.data()), logits.size() * sizeof(float));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  return logits;
}

std::vector<float> arbor_logits(const std::string& path) {
  auto runner = ModelRunner::load(
      path, {.num_blocks = 8, .kv_dtype = kernels::KvDtype::kF32, .num_threads = 2});
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return {};
  SingleSequence seq(**runner, SingleSequence::contiguous_blocks(0, 8));
  auto logits = seq.append_all_logits(prompt());
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  if (!logits.ok()) return {};
  return {logits->begin(), logits->end()};
}

struct Agreement {
  float max_diff = 0.0f;
  int top1_checked = 0;
  int top1_mismatch = 0;
};

Agreement compare(const std::vector<float>& a, const std::vector<float>& ref, float tol) {
  Agreement g;
  for (int r = 0; r < kTokens; ++r) {
    const float* x = a.data() + static_cast<size_t>(r) * kVocab;
    const float* y = ref.data() + static_cast<size_t>(r) * kVocab;
    int best = 0;
    for (int c = 0; c < kVocab; ++c) {
      g.max_diff = std::max(g.max_diff, std::abs(x[c] - y[c]));
      if (y[c] > y[best]) best = c;
    }
    float second = -INFINITY;
    for (int c = 0; c < kVocab; ++c) {
      if (c != best) second = std::max(second, y[c]);
    }
    if (y[best] - second <= tol) continue;
    ++g.top1_checked;
    g.top1_mismatch += std::max_element(x, x + kVocab) - x != best;
  }
  return g;
}

// The F32 file of `s` and its quantisations `recipes`, each against llama.cpp.
void check_against_llama_cpp(const SynthShape& s, const std::vector<std::string>& recipes,
                             const std::vector<GgmlType>& must_contain) {
  constexpr float tol = 0.25f;
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  ASSERT_EQ(access(llama_ref().c_str(), X_OK), 0)
      << llama_ref() << " is missing: run scripts/install_reference.sh (make test does)";
  test::TempDir dir("codebook_ref");
  const std::string f32 = write_f32(s, dir);
  const std::vector<float> ref_f32 = reference_logits(f32, dir);
  for (size_t i = 0; i < recipes.size(); ++i) {
    SCOPED_TRACE(recipes[i]);
    const std::string path = write_quantized(f32, recipes[i], dir);
    auto file = gguf::GgufFile::open(path);
    ASSERT_TRUE(file.ok());
    bool found = false;
    for (const gguf::TensorInfo& t : file->tensors()) found = found || t.type == must_contain[i];
    EXPECT_TRUE(found) << "no tensor of type " << gguf::ggml_type_name(must_contain[i]);
    const std::vector<float> ref = reference_logits(path, dir);
    const std::vector<float> got = arbor_logits(path);
    ASSERT_EQ(got.size(), ref.size());
    const Agreement g = compare(got, ref, tol);
    EXPECT_LE(g.max_diff, tol);
    EXPECT_EQ(g.top1_mismatch, 0) << g.top1_mismatch << " of " << g.top1_checked;
    const float ours = compare(got, ref_f32, 1e9f).max_diff;
    const float theirs = compare(ref, ref_f32, 1e9f).max_diff;
    EXPECT_LE(ours, 1.5f * theirs + 1e-3f);
    std::printf("%-10s %-10s max |arbor - llama.cpp| %.3f, top-1 checked at %d/%d; from F32: "
                "arbor %.3f, llama.cpp %.3f\n",
                s.name.c_str(), recipes[i].c_str(), g.max_diff, g.top1_checked, kTokens, ours,
                theirs);
  }
}

SynthShape llama_shape() {
  SynthShape s{.name = "llama", .dim = 256, .ffn = 512, .layers = 4, .heads = 4, .kv_heads = 2,
               .context = 4096};
  s.vocab = 0;
  return s;
}

TEST(CodebookReference, LlamaLogitsMatchLlamaCpp) {
  check_against_llama_cpp(llama_shape(), {"mxfp4", "iq4_nl", "iq4_xs"},
                          {GgmlType::kMXFP4, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS});
}

TEST(CodebookReference, MoeLogitsMatchLlamaCpp) {
  SynthShape s = *find_synth_preset("tiny-qwen3moe");
  s.name = "qwen3moe";
  s.experts = s.experts_used = 4;
  check_against_llama_cpp(s, {"iq4_xs", "mxfp4_moe"}, {GgmlType::kIQ4_XS, GgmlType::kMXFP4});
}

// What gpt-oss files are: MXFP4 experts, Q8_0 elsewhere (llama-quantize's MXFP4_MOE), on the
// architecture with attention sinks, biases and the clamped SwiGLU. Every expert used, so that
// no near-tied routing choice flips between the engines (measured: 0.135 apart, each ~2.0 from
// the F32 file).
TEST(CodebookReference, GptOssMxfp4MoeMatchesLlamaCpp) {
  SynthShape s = *find_synth_preset("tiny-gpt-oss");
  s.name = "gpt-oss";
  s.experts = s.experts_used = 4;
  check_against_llama_cpp(s, {"mxfp4_moe"}, {GgmlType::kMXFP4});
}

// A copy of `f32` with tensor `name` retyped to `type` (random bytes of its size).
std::string retyped(const std::string& f32, const std::string& name, GgmlType type,
                    const test::TempDir& dir) {
  auto in = gguf::GgufFile::open(f32);
  EXPECT_TRUE(in.ok());
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : in->metadata()) w.set(kv.key, kv.value);
  std::mt19937 rng(5);
  for (const gguf::TensorInfo& t : in->tensors()) {
    if (t.name != name) {
      w.add_tensor_ref(t.name, t.type, t.dims, t.bytes());
      continue;
    }
    std::vector<uint8_t> bytes(*gguf::ggml_nbytes(type, t.dims));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    w.add_tensor_owned(t.name, type, t.dims, std::move(bytes));
  }
  const std::string path = dir / (name + "-" + std::string(gguf::ggml_type_name(type)) + ".gguf");
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(CodebookReference, OtherIqTypesAreRefusedNamingTheTensor) {
  ASSERT_TRUE(test::require_shared_file(test::kStories260K));
  test::TempDir dir("iq_refused");
  SynthShape moe = *find_synth_preset("tiny-qwen3moe");
  moe.name = "qwen3moe";
  moe.expert_ffn = 256;  // IQ types have blocks of 256
  const std::string f32 = write_f32(moe, dir);
  const struct {
    std::string tensor;
    GgmlType type;
  } cases[] = {{"blk.2.attn_output.weight", GgmlType::kIQ2_XXS},
               {"blk.0.ffn_up_exps.weight", GgmlType::kIQ3_S},
               {"blk.3.attn_q.weight", GgmlType::kIQ1_S},
               {"token_embd.weight", GgmlType::kIQ2_S}};
  for (const auto& c : cases) {
    auto file = gguf::GgufFile::open(f32);
    ASSERT_TRUE(file.ok());
    SCOPED_TRACE(c.tensor);
    bool present = false;
    for (const gguf::TensorInfo& t : file->tensors()) present = present || t.name == c.tensor;
    ASSERT_TRUE(present);
    const std::string path = retyped(f32, c.tensor, c.type, dir);
    auto runner = ModelRunner::load(path, {.num_blocks = 8, .num_threads = 1});
    ASSERT_FALSE(runner.ok());
    const std::string msg = runner.status().message();
    EXPECT_NE(msg.find(c.tensor), std::string::npos) << msg;
    EXPECT_NE(msg.find(gguf::ggml_type_name(c.type)), std::string::npos) << msg;
    auto opened = gguf::GgufFile::open(path);
    ASSERT_TRUE(opened.ok());
    const std::vector<std::string> problems = unsupported_features(*opened);
    ASSERT_FALSE(problems.empty());
    EXPECT_NE(problems[0].find(c.tensor), std::string::npos) << problems[0];
    EXPECT_NE(problems[0].find(gguf::ggml_type_name(c.type)), std::string::npos) << problems[0];
  }
}

}  // namespace
}  // namespace arbor::model::testing
