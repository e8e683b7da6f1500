// arbor synth: determinism, shapes, types and the copied tokenizer metadata; --inflate's flags,
// its output through `arbor generate`, and its errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::cli_test {
namespace {

using test::CommandResult;
using test::read_file;
using test::run_arbor;

const std::string kVocab = test::shared_path(test::kStories260K);
const std::string kTiny =
    "synth --shape custom --dim 64 --ffn 128 --layers 2 --heads 4 --kv-heads 2 --context 256 "
    "--vocab " + kVocab;

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(test::require_shared_file(test::kStories260K)); }

  // Runs synth with `extra` flags into dir_/name and returns the file's bytes.
  std::string synth(const std::string& extra, const std::string& name) {
    const std::string path = dir_ + "/" + name;
    CommandResult r = run_arbor(kTiny + " " + extra + " -o " + path);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_file(path);
  }

  test::TempDir tmp_{"synth"};
  const std::string dir_ = tmp_.path();
};

TEST_F(SynthTest, SameSeedSameBytesAcrossThreadCountsDifferentSeedDiffers) {
  const std::string a = synth("--type q4_0 --seed 7 --threads 1", "a.gguf");
  const std::string b = synth("--type q4_0 --seed 7 --threads 2", "b.gguf");
  const std::string c = synth("--type q4_0 --seed 8", "c.gguf");
  ASSERT_GT(a.size(), 50000u);
  EXPECT_TRUE(a == b) << "same seed gave different bytes";
  EXPECT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c) << "different seeds gave the same bytes";
}

TEST_F(SynthTest, FileHasShapeTypesMetadataAndTokenizer) {
  synth("--type q8_0 --seed 3", "m.gguf");
  auto file = gguf::GgufFile::open(dir_ + "/m.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get_string("general.architecture"), "llama");
  EXPECT_EQ(*file->get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(*file->get_u32("llama.feed_forward_length"), 128u);
  EXPECT_EQ(*file->get_u32("llama.block_count"), 2u);
  EXPECT_EQ(*file->get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(*file->get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(*file->get_u32("llama.context_length"), 256u);
  EXPECT_EQ(*file->get_u32("general.file_type"), 7u);  // MOSTLY_Q8_0
  // 1 embedding + 2 layers x 9 + output_norm + output.
  EXPECT_EQ(file->tensors().size(), 21u);
  const gguf::TensorInfo* embd = file->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->type, gguf::GgmlType::kQ8_0);
  const gguf::TensorInfo* wk = file->find_tensor("blk.1.attn_k.weight");
  ASSERT_NE(wk, nullptr);
  EXPECT_EQ(wk->dims, (std::vector<int64_t>{64, 32}));  // kv_dim = 2 heads x 16
  EXPECT_EQ(file->find_tensor("blk.1.ffn_down.weight")->dims, (std::vector<int64_t>{128, 64}));
  ASSERT_NE(file->find_tensor("output.weight"), nullptr);
  const gguf::TensorInfo* norm = file->find_tensor("blk.0.attn_norm.weight");
  ASSERT_EQ(norm->type, gguf::GgmlType::kF32);
  const float* w = reinterpret_cast<const float*>(norm->data);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(w[i], 1.0f);

  auto src = gguf::GgufFile::open(kVocab);
  ASSERT_TRUE(src.ok());
  int copied = 0;
  for (const gguf::KeyValue& kv : src->metadata()) {
    if (!kv.key.starts_with("tokenizer.")) continue;
    const gguf::Value* v = file->find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(v->type == kv.value.type && v->data == kv.value.data) << kv.key;
    ++copied;
  }
  EXPECT_GE(copied, 3);
}

TEST_F(SynthTest, F32WeightsHaveFanInScale) {
  synth("--type f32 --seed 5", "f.gguf");
  auto file = gguf::GgufFile::open(dir_ + "/f.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const gguf::TensorInfo* t = file->find_tensor("blk.0.ffn_down.weight");  // fan-in 128
  ASSERT_EQ(t->type, gguf::GgmlType::kF32);
  const float* x = reinterpret_cast<const float*>(t->data);
  const int64_t n = t->num_elements();
  double sum = 0.0, sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sq += double(x[i]) * x[i];
  }
  const double mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(stddev, 1.0 / std::sqrt(128.0), 0.05 / std::sqrt(128.0));
  EXPECT_NEAR(mean, 0.0, 0.01);
}

TEST_F(SynthTest, Qwen2ArchTiedWithBiasesAndPaddedVocab) {
  synth("--type f16 --arch qwen2 --tied --vocab-size 600", "q.gguf");
  auto file = gguf::GgufFile::open(dir_ + "/q.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get_string("general.architecture"), "qwen2");
  EXPECT_EQ(file->find_tensor("output.weight"), nullptr);
  ASSERT_NE(file->find_tensor("blk.1.attn_v.bias"), nullptr);
  EXPECT_EQ(file->find_tensor("blk.1.attn_v.bias")->dims, (std::vector<int64_t>{32}));
  EXPECT_EQ(file->find_tensor("token_embd.weight")->dims, (std::vector<int64_t>{64, 600}));
  EXPECT_EQ(file->find_tensor("token_embd.weight")->type, gguf::GgmlType::kF16);
  auto tokens = file->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 600u);
  EXPECT_EQ((*tokens)[599], "[PAD599]");
  EXPECT_EQ(file->get_f32_array("tokenizer.ggml.scores")->size(), 600u);
}

TEST_F(SynthTest, BadShapesAreRejectedWithTheLimit) {
  CommandResult r = run_arbor("synth --shape custom --vocab " + kVocab + " -o " + dir_ + "/x.gguf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs --dim, --ffn, --layers and --heads"), std::string::npos) << r.err;
  r = run_arbor("synth --shape custom --dim 48 --ffn 128 --layers 1 --heads 4 --type q4_0 --vocab " +
                    kVocab + " -o " + dir_ + "/x.gguf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("must be multiples of 32"), std::string::npos) << r.err;
  r = run_arbor(kTiny + " --vocab-size 100 -o " + dir_ + "/x.gguf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("smaller than the tokenizer's 512 tokens"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.gguf"));
}

// --arch picks a row of the architecture table: its tensors (llama.cpp's names), its keys, and a
// file arbor runs; `arbor gguf-info` says so, and names what a file needs when arbor lacks it.
TEST_F(SynthTest, EveryArchitectureWritesAFileArborRuns) {
  for (const char* arch : {"qwen3", "gemma2", "gemma3", "mistral3", "phi3", "smollm3", "olmo2",
                           "granite"}) {
    SCOPED_TRACE(arch);
    const std::string name = std::string(arch) + ".gguf";
    synth(std::string("--type q8_0 --arch ") + arch + " --head-dim 32 --window 8", name);
    auto file = gguf::GgufFile::open(dir_ + "/" + name);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_EQ(*file->get_string("general.architecture"), arch);
    const std::string a = arch;
    if (a == "qwen3" || a == "gemma3") {
      EXPECT_NE(file->find_tensor("blk.1.attn_q_norm.weight"), nullptr);
    }
    if (a == "gemma2" || a == "gemma3" || a == "olmo2") {
      EXPECT_NE(file->find_tensor("blk.1.post_ffw_norm.weight"), nullptr);
      EXPECT_EQ(*file->get_u32(a + ".attention.sliding_window"), 8u);
    }
    if (a == "phi3") {
      EXPECT_NE(file->find_tensor("blk.0.attn_qkv.weight"), nullptr);
      EXPECT_EQ(file->find_tensor("blk.0.ffn_gate.weight"), nullptr);
      EXPECT_NE(file->find_tensor("rope_factors_long.weight"), nullptr);
    }
    if (a == "olmo2") EXPECT_EQ(file->find_tensor("blk.0.attn_norm.weight"), nullptr);
    if (a == "granite") EXPECT_NE(file->find("granite.logit_scale"), nullptr);
    const CommandResult info = run_arbor("gguf-info " + dir_ + "/" + name);
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("arbor: runs this file (" + a + ": dim 64"), std::string::npos)
        << info.out.substr(info.out.rfind("arbor"));
    const CommandResult gen =
        run_arbor("generate -m " + dir_ + "/" + name + " -p 'Once upon a time' -n 12 --temp 0");
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
  }
  CommandResult r = run_arbor(kTiny + " --arch falcon -o " + dir_ + "/x.gguf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("must be one of llama, qwen2, qwen3, qwen3moe, gemma2"), std::string::npos)
      << r.err;
}

// Mixtures of experts: qwen3moe, gpt-oss and llama with --experts (Mixtral), their keys and 3-D
// tensors (routers, sinks and biases F32), a file arbor runs; and the flags' errors.
TEST_F(SynthTest, MixturesOfExpertsWriteFilesArborRuns) {
  for (const auto& [arch, flags] :
       {std::pair{"qwen3moe", "--arch qwen3moe --head-dim 32 --experts 8 --experts-used 2 "
                              "--expert-ffn 64"},
        std::pair{"llama", "--experts 4 --experts-used 2"},
        std::pair{"gpt-oss", "--arch gpt-oss --head-dim 32 --experts 8 --experts-used 2 "
                             "--expert-ffn 64"}}) {
    SCOPED_TRACE(arch);
    const std::string name = std::string(arch) + "-moe.gguf";
    synth(std::string("--type q4_0 ") + flags, name);
    auto file = gguf::GgufFile::open(dir_ + "/" + name);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    const std::string a = arch;
    const bool own_ffn = a == "qwen3moe" || a == "gpt-oss";
    const uint32_t experts = own_ffn ? 8 : 4, ffn = own_ffn ? 64 : 128;
    if (a == "gpt-oss") {  // its sinks and biases, F32 like the router
      for (const char* t : {"blk.1.attn_sinks.weight", "blk.1.ffn_gate_inp.bias",
                            "blk.1.ffn_down_exps.bias", "blk.0.post_attention_norm.weight"}) {
        const gguf::TensorInfo* info = file->find_tensor(t);
        ASSERT_NE(info, nullptr) << t;
        EXPECT_EQ(info->type, gguf::GgmlType::kF32) << t;
      }
    }
    EXPECT_EQ(*file->get_u32(a + ".expert_count"), experts);
    EXPECT_EQ(*file->get_u32(a + ".expert_used_count"), 2u);
    const gguf::TensorInfo* up = file->find_tensor("blk.1.ffn_up_exps.weight");
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(up->dims, (std::vector<int64_t>{64, ffn, experts}));
    EXPECT_EQ(up->type, gguf::GgmlType::kQ4_0);
    const gguf::TensorInfo* router = file->find_tensor("blk.1.ffn_gate_inp.weight");
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->type, gguf::GgmlType::kF32);
    EXPECT_EQ(file->find_tensor("blk.1.ffn_up.weight"), nullptr);
    const CommandResult info = run_arbor("gguf-info " + dir_ + "/" + name);
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find(std::to_string(experts) + " experts (2 per token, ffn " +
                            std::to_string(ffn) + ")"),
              std::string::npos)
        << info.out.substr(info.out.rfind("arbor"));
    const CommandResult gen =
        run_arbor("generate -m " + dir_ + "/" + name + " -p 'Once upon a time' -n 8 --temp 0");
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
  }
  for (const auto& [flags, says] :
       {std::pair{"--arch qwen2 --experts 4 --experts-used 2", "qwen2 has no experts"},
        std::pair{"--experts 4 --experts-used 5", "--experts-used 5 in [1, --experts]"},
        std::pair{"--arch qwen3moe --head-dim 32 --experts 8 --experts-used 2 --expert-ffn 48",
                  "must be multiples of 32"}}) {
    CommandResult r = run_arbor(kTiny + " --type q8_0 " + flags + " -o " + dir_ + "/bad.gguf");
    EXPECT_EQ(r.exit_code, 2) << flags;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
}

TEST_F(SynthTest, GgufInfoNamesWhatArborLacks) {
  synth("--type q8_0", "m.gguf");
  auto file = gguf::GgufFile::open(dir_ + "/m.gguf");
  ASSERT_TRUE(file.ok());
  gguf::GgufWriter w = gguf::GgufWriter::from_file(*file);
  w.set("general.architecture", gguf::Value::str("rwkv7"));
  ASSERT_TRUE(w.write(dir_ + "/rwkv.gguf").ok());
  const CommandResult info = run_arbor("gguf-info --json " + dir_ + "/rwkv.gguf");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out);
  EXPECT_FALSE(j["arbor"]["supported"].get<bool>());
  ASSERT_FALSE(j["arbor"]["missing"].empty());
  EXPECT_NE(j["arbor"]["missing"][0].get<std::string>().find(
                "architecture \"rwkv7\" (arbor runs: llama, qwen2, qwen3"),
            std::string::npos)
      << j["arbor"].dump();
}

const std::string kInflateSmall =
    "synth --inflate " + kVocab + " --dim 256 --ffn 512 --layers 8 --kv-ratio 4 --type q8_0";

// The generated ids of greedy `arbor generate` on `model`.
std::string generate_ids(const std::string& model) {
  CommandResult r = run_arbor("generate -m " + model +
                              " -p 'Once upon a time' -n 48 --temp 0 --threads 1 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto ids = r.out.find("\"ids\"");
  EXPECT_NE(ids, std::string::npos) << r.out;
  return ids == std::string::npos ? "" : r.out.substr(ids, r.out.find(']', ids) - ids);
}

TEST_F(SynthTest, InflateWritesTheShapeAndGeneratesTheSameTokens) {
  const std::string path = dir_ + "/inflated.gguf";
  CommandResult r = run_arbor(kInflateSmall + " --seed 3 -o " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("dim 64 -> 256, ffn 172 -> 512, layers 5 -> 8, heads 8 -> 32 (kv 4 -> 8)"),
            std::string::npos)
      << r.err;
  auto file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get_u32("llama.embedding_length"), 256u);
  EXPECT_EQ(*file->get_u32("llama.feed_forward_length"), 512u);
  EXPECT_EQ(*file->get_u32("llama.block_count"), 8u);
  EXPECT_EQ(*file->get_u32("llama.attention.head_count"), 32u);
  EXPECT_EQ(*file->get_u32("llama.attention.head_count_kv"), 8u);
  EXPECT_EQ(*file->get_u32("general.file_type"), 7u);  // MOSTLY_Q8_0
  EXPECT_EQ(file->find_tensor("blk.7.ffn_down.weight")->dims, (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(file->find_tensor("blk.7.ffn_down.weight")->type, gguf::GgmlType::kQ8_0);
  EXPECT_EQ(file->find_tensor("blk.7.ffn_norm.weight")->type, gguf::GgmlType::kF32);
  // Even in Q8_0 (the source's rows are rounded as stories260K's own Q8_0 would be) the text
  // stays stories260K's on this prompt.
  const std::string want = generate_ids(kVocab);
  ASSERT_GT(want.size(), 100u);
  EXPECT_EQ(generate_ids(path), want);
  // Same seed, same bytes with another thread count; the seed reaches the random rows.
  r = run_arbor(kInflateSmall + " --seed 3 --threads 1 -o " + dir_ + "/same.gguf");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(read_file(path) == read_file(dir_ + "/same.gguf"));
  r = run_arbor(kInflateSmall + " --seed 4 -o " + dir_ + "/other.gguf");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(read_file(path) == read_file(dir_ + "/other.gguf"));
}

TEST_F(SynthTest, InflateShapeSuppliesTheDimsAndFlagsOverrideIt) {
  const std::string base = "synth --inflate " + kVocab + " -o " + dir_ + "/x.gguf ";
  // tinyllama-1.1b is dim 2048, ffn 5632, 22 layers, kv-ratio 8 (32 heads / 4 kv heads): with
  // --dim 128 there are 16 heads of 8, so ratio 8 leaves 2 kv heads, fewer than the model's 4.
  CommandResult r = run_arbor(base + "--shape tinyllama-1.1b --dim 128");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-ratio 8 must divide the inflated model's 16 heads (--dim 128 / "
                       "head_dim 8) and leave at least the model's 4 kv heads; at most 4"),
            std::string::npos)
      << r.err;
  r = run_arbor(base + "--shape tinyllama-1.1b --layers 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--layers 3 is fewer than the model's 5 layers"), std::string::npos)
      << r.err;
  r = run_arbor(base + "--shape tinyllama-1.1b --ffn 100");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--ffn 100 is less than the model's feed_forward_length 172"),
            std::string::npos)
      << r.err;
  r = run_arbor(base + "--shape stories110m");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--dim 768 must be the model's embedding length 64 times a power of two"),
            std::string::npos)
      << r.err;
  r = run_arbor(base + "--shape tinyllama-1.1b --dim 256 --ffn 512 --layers 6 --kv-ratio 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-ratio 3 must be a multiple of the model's 2 query heads per kv head"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.gguf"));
}

TEST_F(SynthTest, InflateFlagErrors) {
  const std::string out = " -o " + dir_ + "/x.gguf";
  CommandResult r = run_arbor("synth --inflate " + kVocab + " --dim 256" + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--inflate needs --dim, --ffn, --layers and --kv-ratio > 0, or a --shape "
                       "such as tinyllama-1.1b (got 256, 0, 0, 0)"),
            std::string::npos)
      << r.err;
  r = run_arbor("synth --inflate " + kVocab + " --vocab " + kVocab + " --dim 256" + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--vocab excludes --inflate"), std::string::npos) << r.err;
  r = run_arbor("synth --inflate " + kVocab + " --shape tinyllama-1.1b --heads 8" + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--heads excludes --inflate"), std::string::npos) << r.err;
  r = run_arbor("synth --kv-ratio 2 --vocab " + kVocab + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-ratio requires --inflate"), std::string::npos) << r.err;
  r = run_arbor("synth" + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("synth needs --vocab (or --inflate SMALL.gguf)"), std::string::npos)
      << r.err;
  r = run_arbor("synth --inflate " + dir_ + "/missing.gguf --shape tinyllama-1.1b" + out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(dir_ + "/missing.gguf"), std::string::npos) << r.err;
  r = run_arbor("synth --inflate " + kVocab + " --shape tinyllama-1.1b --type q4_1" + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--type q4_1 is not supported"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.gguf"));
}

}  // namespace
}  // namespace arbor::cli_test
