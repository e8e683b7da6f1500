#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/quantize_model.h"
#include "gguf/quants.h"
#include "test_files.h"

namespace arbor::gguf {
namespace {

std::vector<float> tensor_floats(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  const Status s = dequantize_row(t.type, t.data, out.data(), t.num_elements());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

TEST(QuantizeModel, TensorTypeRules) {
  EXPECT_EQ(choose_tensor_type("blk.0.attn_q.weight", {64, 64}, GgmlType::kF32, GgmlType::kQ4_0),
            GgmlType::kQ4_0);
  EXPECT_EQ(choose_tensor_type("blk.0.attn_norm.weight", {64}, GgmlType::kF32, GgmlType::kQ4_0),
            GgmlType::kF32);
  EXPECT_EQ(choose_tensor_type("blk.0.attn_q.bias", {64, 2}, GgmlType::kF32, GgmlType::kQ4_0),
            GgmlType::kF32);
  EXPECT_EQ(choose_tensor_type("blk.0.ffn_gate_inp.weight", {64, 8}, GgmlType::kF32,
                               GgmlType::kQ4_0),
            GgmlType::kF32);
  // Row length 172: no 32-block fits, so f16; 64 fits q5_0 but not q4_K's 256.
  EXPECT_EQ(choose_tensor_type("w.weight", {172, 64}, GgmlType::kF32, GgmlType::kQ8_0),
            GgmlType::kF16);
  EXPECT_EQ(choose_tensor_type("w.weight", {64, 64}, GgmlType::kF32, GgmlType::kQ4_K),
            GgmlType::kQ5_0);
  EXPECT_EQ(choose_tensor_type("w.weight", {64, 64}, GgmlType::kF32, GgmlType::kQ6_K),
            GgmlType::kQ8_0);
  EXPECT_EQ(choose_tensor_type("w.weight", {512, 64}, GgmlType::kF32, GgmlType::kQ6_K),
            GgmlType::kQ6_K);
}

TEST(QuantizeModel, TargetsAndFileTypes) {
  EXPECT_EQ(*parse_quantize_target("Q4_K"), GgmlType::kQ4_K);
  const auto bad = parse_quantize_target("q8_K");  // a ggml type, but not a weight format
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("accepted: f32, f16, q4_0, q4_1, q8_0"),
            std::string::npos);
  EXPECT_EQ(llama_file_type(GgmlType::kF32), 0u);
  EXPECT_EQ(llama_file_type(GgmlType::kF16), 1u);
  EXPECT_EQ(llama_file_type(GgmlType::kQ4_0), 2u);
  EXPECT_EQ(llama_file_type(GgmlType::kQ8_0), 7u);
  EXPECT_EQ(llama_file_type(GgmlType::kQ5_1), 9u);
  EXPECT_EQ(llama_file_type(GgmlType::kQ4_K), 14u);
  EXPECT_EQ(llama_file_type(GgmlType::kQ6_K), 18u);
  EXPECT_EQ(llama_file_type(GgmlType::kBF16), 32u);
  EXPECT_EQ(llama_file_type(GgmlType::kIQ4_NL), 25u);
  EXPECT_EQ(llama_file_type(GgmlType::kIQ4_XS), 30u);
  EXPECT_EQ(llama_file_type(GgmlType::kMXFP4), 38u);
}

// The codebook targets: pure iq4_nl / iq4_xs / mxfp4 (iq4_xs falls back to iq4_nl where a row
// does not fit 256, as llama-quantize), and llama.cpp's MXFP4_MOE mixture: 3-D expert tensors
// with several experts mxfp4, every other matrix (the classifier too) q8_0, routers kept.
TEST(QuantizeModel, CodebookTargetsAndMxfp4Moe) {
  EXPECT_EQ(*parse_quantize_target("IQ4_XS"), GgmlType::kIQ4_XS);
  EXPECT_EQ(*parse_quantize_target("mxfp4"), GgmlType::kMXFP4);
  EXPECT_EQ(choose_tensor_type("w.weight", {64, 64}, GgmlType::kF32, GgmlType::kIQ4_XS),
            GgmlType::kIQ4_NL);
  EXPECT_EQ(choose_tensor_type("w.weight", {512, 64}, GgmlType::kF32, GgmlType::kIQ4_XS),
            GgmlType::kIQ4_XS);
  EXPECT_EQ(choose_tensor_type("w.weight", {48, 64}, GgmlType::kF32, GgmlType::kMXFP4),
            GgmlType::kF16);
  const auto moe = parse_quantize_recipe("MXFP4_MOE");
  ASSERT_TRUE(moe.ok()) << moe.status().to_string();
  EXPECT_EQ(moe->type, GgmlType::kMXFP4);
  EXPECT_EQ(moe->mix, QuantMix::kMxfp4Moe);
  EXPECT_EQ(llama_file_type(*moe), 38u);
  EXPECT_EQ(recipe_name(*moe), "mxfp4_moe");
  auto type = [](const char* name, std::vector<int64_t> dims) {
    return choose_tensor_type(name, dims, GgmlType::kF32, GgmlType::kMXFP4, QuantMix::kMxfp4Moe,
                              4, false);
  };
  EXPECT_EQ(type("blk.0.ffn_up_exps.weight", {64, 128, 8}), GgmlType::kMXFP4);
  EXPECT_EQ(type("blk.0.ffn_down_exps.weight", {128, 64, 8}), GgmlType::kMXFP4);
  EXPECT_EQ(type("blk.0.attn_q.weight", {64, 64}), GgmlType::kQ8_0);
  EXPECT_EQ(type("output.weight", {64, 512}), GgmlType::kQ8_0);
  EXPECT_EQ(type("blk.0.ffn_up_exps.weight", {64, 128, 1}), GgmlType::kQ8_0);
  EXPECT_EQ(type("blk.0.ffn_gate_inp.weight", {64, 8}), GgmlType::kF32);
  EXPECT_EQ(type("blk.0.ffn_up_exps.weight", {48, 128, 8}), GgmlType::kF16);
}

// llama-quantize's K-quant mixtures on a 22-layer model (TinyLlama's depth): which layers get
// more bits, enumerated.
TEST(QuantizeModel, KQuantMixturesFollowLlamaQuantize) {
  constexpr int kLayers = 22;
  const auto type_of = [](std::string_view name, QuantMix mix, GgmlType base) {
    return choose_tensor_type(name, {2048, 256}, GgmlType::kF16, base, mix, kLayers);
  };
  const auto blk = [](int i, std::string_view t) { return str_cat("blk.", i, ".", t, ".weight"); };
  // use_more_bits(i, 22): i < 2, i >= 19, or (i - 2) % 3 == 2.
  const std::vector<int> more_bits = {0, 1, 4, 7, 10, 13, 16, 19, 20, 21};
  for (auto [mix, base] : {std::pair{QuantMix::kQ4_K_M, GgmlType::kQ4_K},
                           std::pair{QuantMix::kQ5_K_M, GgmlType::kQ5_K}}) {
    EXPECT_EQ(type_of("output.weight", mix, base), GgmlType::kQ6_K);
    EXPECT_EQ(type_of("token_embd.weight", mix, base), base);
    std::vector<int> v_layers, down_layers;
    for (int i = 0; i < kLayers; ++i) {
      if (type_of(blk(i, "attn_v"), mix, base) == GgmlType::kQ6_K) v_layers.push_back(i);
      if (type_of(blk(i, "ffn_down"), mix, base) == GgmlType::kQ6_K) down_layers.push_back(i);
      for (const char* t : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"}) {
        EXPECT_EQ(type_of(blk(i, t), mix, base), base) << blk(i, t);
      }
    }
    EXPECT_EQ(v_layers, more_bits);
    EXPECT_EQ(down_layers, more_bits);
  }
  for (int i = 0; i < kLayers; ++i) {
    const GgmlType q3 = GgmlType::kQ3_K;
    EXPECT_EQ(type_of(blk(i, "attn_v"), QuantMix::kQ3_K_M, q3),
              i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K);
    EXPECT_EQ(type_of(blk(i, "ffn_down"), QuantMix::kQ3_K_M, q3),
              i < 1 ? GgmlType::kQ5_K : GgmlType::kQ4_K);
    EXPECT_EQ(type_of(blk(i, "attn_output"), QuantMix::kQ3_K_M, q3), GgmlType::kQ4_K);
    EXPECT_EQ(type_of(blk(i, "attn_q"), QuantMix::kQ3_K_M, q3), q3);
    EXPECT_EQ(type_of(blk(i, "attn_output"), QuantMix::kQ3_K_L, q3), GgmlType::kQ5_K);
    EXPECT_EQ(type_of(blk(i, "attn_v"), QuantMix::kQ4_K_S, GgmlType::kQ4_K),
              i < 4 ? GgmlType::kQ5_K : GgmlType::kQ4_K);
    EXPECT_EQ(type_of(blk(i, "ffn_down"), QuantMix::kQ4_K_S, GgmlType::kQ4_K),
              i < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K);
  }
  // A tied classifier is the embedding: it gets the output's q6_K (llama.cpp's
  // has_tied_embeddings); a fused QKV gets llama.cpp's attn_qkv types.
  EXPECT_EQ(choose_tensor_type("token_embd.weight", {2048, 256}, GgmlType::kF16, GgmlType::kQ4_K,
                               QuantMix::kQ4_K_M, kLayers, /*tied_embeddings=*/true),
            GgmlType::kQ6_K);
  EXPECT_EQ(type_of(blk(3, "attn_qkv"), QuantMix::kQ4_K_M, GgmlType::kQ4_K), GgmlType::kQ5_K);
  EXPECT_EQ(type_of(blk(3, "attn_qkv"), QuantMix::kQ5_K_M, GgmlType::kQ5_K), GgmlType::kQ6_K);
  EXPECT_EQ(type_of(blk(3, "attn_qkv"), QuantMix::kQ3_K_M, GgmlType::kQ3_K), GgmlType::kQ4_K);
  EXPECT_EQ(type_of(blk(3, "attn_qkv"), QuantMix::kQ4_K_S, GgmlType::kQ4_K), GgmlType::kQ4_K);
  // A row that fits no K block falls back after the mixture's choice (q6_K -> q8_0).
  EXPECT_EQ(choose_tensor_type("blk.0.attn_v.weight", {64, 64}, GgmlType::kF32, GgmlType::kQ4_K,
                               QuantMix::kQ4_K_M, kLayers),
            GgmlType::kQ8_0);
}

TEST(QuantizeModel, RecipesParseAndNameTheirFileTypes) {
  const auto r = parse_quantize_recipe("Q4_K_M");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->type, GgmlType::kQ4_K);
  EXPECT_EQ(r->mix, QuantMix::kQ4_K_M);
  EXPECT_EQ(recipe_name(*r), "q4_K_M");
  EXPECT_EQ(llama_file_type(*r), 15u);
  EXPECT_EQ(llama_file_type(*parse_quantize_recipe("q5_k_m")), 17u);
  EXPECT_EQ(llama_file_type(*parse_quantize_recipe("q3_K_M")), 12u);
  EXPECT_EQ(parse_quantize_recipe("q6_K")->mix, QuantMix::kPure);
  EXPECT_EQ(llama_file_type(*parse_quantize_recipe("q6_K")), 18u);
  const auto bad = parse_quantize_recipe("q4_K_X");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q4_K_S, q4_K_M, q5_K_S, q5_K_M"), std::string::npos)
      << bad.status().message();
}

TEST(QuantizeModel, ConvertTensorData) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.1f * i);
  std::span<const uint8_t> src(reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4);
  auto f16 = convert_tensor_data(GgmlType::kF32, src, {32, 2}, GgmlType::kF16);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->size(), 128u);
  auto q8 = convert_tensor_data(GgmlType::kF16, *f16, {32, 2}, GgmlType::kQ8_0);
  ASSERT_TRUE(q8.ok());
  EXPECT_EQ(q8->size(), 68u);
  auto bad = convert_tensor_data(GgmlType::kF32, src, {16, 4}, GgmlType::kQ8_0);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto iq = convert_tensor_data(GgmlType::kF32, src, {64}, GgmlType::kIQ2_XXS);
  EXPECT_EQ(iq.status().code(), StatusCode::kUnimplemented);
}

// Rows are encoded alone: splitting them over threads gives the same bytes, for every split.
TEST(QuantizeModel, ConvertTensorDataIsTheSameOnAnyNumberOfThreads) {
  std::vector<float> x(256 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  std::span<const uint8_t> src(reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kQ6_K}) {
    auto one = convert_tensor_data(GgmlType::kF32, src, {256, 7}, t, 1);
    ASSERT_TRUE(one.ok()) << one.status().to_string();
    for (int threads : {2, 3, 7, 16}) {
      auto many = convert_tensor_data(GgmlType::kF32, src, {256, 7}, t, threads);
      ASSERT_TRUE(many.ok());
      EXPECT_EQ(*many, *one) << ggml_type_name(t) << " on " << threads << " threads";
    }
  }
}

TEST(QuantizeModel, Stories260KToQ8_0) {
  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.gguf"));
  const std::string path = test::shared_path("models/stories260K/stories260K.gguf");
  auto in = GgufFile::open(path);
  ASSERT_TRUE(in.ok());
  QuantizeReport report;
  auto w = quantize_model(*in, {.target = GgmlType::kQ8_0}, &report);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(report.num_converted, 37);  // 2-D weights
  EXPECT_EQ(report.num_fallback, 5);    // ffn_down has rows of 172 -> f16
  EXPECT_EQ(report.num_kept, 11);       // norms
  const std::string bytes = w->serialize();
  auto out = GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()},
                             "q8.gguf");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(report.bytes_out, [&] {
    uint64_t n = 0;
    for (const auto& t : out->tensors()) n += t.size_bytes;
    return n;
  }());
  EXPECT_EQ(*out->get_u32("general.file_type"), 7u);
  EXPECT_EQ(*out->get_u32("general.quantization_version"), 2u);
  EXPECT_EQ(*out->get_u32("llama.block_count"), 5u);
  EXPECT_EQ(out->metadata().size(), in->metadata().size() + 2);
  ASSERT_EQ(out->tensors().size(), in->tensors().size());
  EXPECT_EQ(out->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::kF16);
  EXPECT_EQ(out->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);
  for (const char* name : {"token_embd.weight", "blk.3.attn_q.weight", "blk.4.ffn_down.weight"}) {
    const TensorInfo* a = in->find_tensor(name);
    const TensorInfo* b = out->find_tensor(name);
    ASSERT_NE(b, nullptr);
    const auto x = tensor_floats(*a);
    const auto y = tensor_floats(*b);
    double err2 = 0, x2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err2 += double(y[i] - x[i]) * (y[i] - x[i]);
      x2 += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err2 / x2), 0.01) << name;
  }
}

// A quantised source is decoded first: Q8_0 -> Q4_0 works and keeps the f32 norms.
TEST(QuantizeModel, RequantisesAQuantisedModel) {
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  const std::string path = test::shared_path("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
  auto in = GgufFile::open(path);
  ASSERT_TRUE(in.ok());
  auto w = quantize_model(*in, {.target = GgmlType::kQ4_0}, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const std::string bytes = w->serialize();
  auto out = GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()},
                             "q4.gguf");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out->get_u32("general.file_type"), 2u);
  EXPECT_EQ(out->find_tensor("token_embd.weight")->type, GgmlType::kQ4_0);
  EXPECT_EQ(out->find_tensor("output_norm.weight")->type, GgmlType::kF32);
}

}  // namespace
}  // namespace arbor::gguf
