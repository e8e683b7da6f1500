#include "convert/llama2c.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "convert/model_plan.h"
#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "test_util.h"

namespace arbor::convert {
namespace {

using gguf::GgufFile;
using testing::append_f32s;
using testing::append_i32;
using testing::temp_path;

// A tiny llama2.c model with distinct, recognisable values in every tensor.
struct TinyLlama2c {
  int version = 0;  // 0 legacy, 1 or 2 ak42
  bool shared = true;
  int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 6, seq_len = 4;
  int32_t group_size = 4;

  std::map<std::string, std::vector<float>> expected;  // by GGUF name
  std::vector<uint8_t> bytes;

  int32_t kv_dim() const { return dim / heads * kv_heads; }

  // Distinct values per tensor: 0.5 * (index + 1) - 1 + i / 128.
  const std::string& make(const std::string& name, size_t n) {
    std::vector<float> v(n);
    const float base = static_cast<float>(expected.size() + 1) * 0.5f;
    for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i) * 0.0078125f - 1.0f;
    expected[name] = v;
    return name;
  }

  // Appends tensor `name`; for version 2 as int8 groups + scales, and the expectation becomes
  // the dequantised values (q * scale, as llama2.c's runq.c computes them).
  void put(const std::string& name) {
    auto& v = expected[name];
    if (version != 2) return append_f32s(&bytes, v);
    std::vector<float> scales;
    for (size_t g = 0; g < v.size(); g += group_size) {
      float amax = 0;
      for (size_t i = g; i < g + group_size; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float scale = amax / 127.0f;
      for (size_t i = g; i < g + group_size; ++i) {
        const auto q = static_cast<int8_t>(std::lround(v[i] / scale));
        bytes.push_back(static_cast<uint8_t>(q));
        v[i] = static_cast<float>(q) * scale;
      }
      scales.push_back(scale);
    }
    append_f32s(&bytes, scales);
  }

  void layered(const char* gguf_suffix, size_t n) {
    for (int l = 0; l < layers; ++l) {
      put(make("blk." + std::to_string(l) + "." + gguf_suffix, n));
    }
  }
  void norms_f32(const char* suffix) {
    for (int l = 0; l < layers; ++l)
      append_f32s(&bytes, expected[make("blk." + std::to_string(l) + "." + suffix, dim)]);
  }
  void header() {
    if (version == 0) {
      for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq_len})
        append_i32(&bytes, v);
      return;
    }
    append_i32(&bytes, 0x616b3432);
    append_i32(&bytes, version);
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq_len}) append_i32(&bytes, v);
    bytes.push_back(shared ? 1 : 0);
    if (version == 2) append_i32(&bytes, group_size);
    bytes.resize(256, 0);
  }

  void build() {
    header();
    const size_t d = dim, h = hidden, kv = kv_dim(), v = vocab;
    if (version == 0) {
      put(make("token_embd.weight", v * d));
      layered("attn_norm.weight", d);
      layered("attn_q.weight", d * d);
      layered("attn_k.weight", kv * d);
      layered("attn_v.weight", kv * d);
      layered("attn_output.weight", d * d);
      layered("ffn_norm.weight", d);
      layered("ffn_gate.weight", h * d);
      layered("ffn_down.weight", h * d);
      layered("ffn_up.weight", h * d);
      put(make("output_norm.weight", d));
      bytes.resize(bytes.size() + 2 * seq_len * (dim / heads / 2) * 4, 0x7f);  // freq_cis
    } else {
      norms_f32("attn_norm.weight");
      norms_f32("ffn_norm.weight");
      append_f32s(&bytes, expected[make("output_norm.weight", d)]);
      put(make("token_embd.weight", v * d));
      layered("attn_q.weight", d * d);
      layered("attn_k.weight", kv * d);
      layered("attn_v.weight", kv * d);
      layered("attn_output.weight", d * d);
      layered("ffn_gate.weight", h * d);
      layered("ffn_down.weight", h * d);
      layered("ffn_up.weight", h * d);
    }
    if (shared) {
      expected["output.weight"] = expected["token_embd.weight"];
    } else {
      put(make("output.weight", v * d));
    }
  }
};

std::vector<uint8_t> tiny_tokenizer(int n) {
  const char* pieces[] = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " a", "b c", "x", "y"};
  std::vector<uint8_t> b;
  append_i32(&b, 6);
  for (int i = 0; i < n; ++i) {
    testing::append_f32(&b, -static_cast<float>(i));
    const std::string p = pieces[i % 8];
    append_i32(&b, static_cast<int32_t>(p.size()));
    b.insert(b.end(), p.begin(), p.end());
  }
  return b;
}

// Converts `m` and checks every tensor's dims and values against what was written in.
void convert_and_check(TinyLlama2c& m, const std::string& file) {
  m.build();
  const auto tok = tiny_tokenizer(m.vocab);
  Llama2cHeader header;
  auto plan = plan_llama2c(m.bytes, tok, "tiny.bin", "tok.bin", &header);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(header.version, m.version);
  EXPECT_EQ(header.shared_classifier, m.shared);
  const std::string path = temp_path(file);
  ASSERT_TRUE(write_plan(*plan, OutputType{}, path).ok());
  auto gguf = GgufFile::open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().to_string();
  ASSERT_EQ(gguf->tensors().size(), m.expected.size());
  for (const auto& [name, values] : m.expected) {
    const auto* t = gguf->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, gguf::GgmlType::kF32) << name;
    EXPECT_EQ(testing::gguf_tensor_f32(*t), values) << name;
    EXPECT_EQ(t->num_elements(), static_cast<int64_t>(values.size())) << name;
  }
  EXPECT_EQ(gguf->find_tensor("blk.1.attn_k.weight")->dims,
            (std::vector<int64_t>{m.dim, m.kv_dim()}));
  EXPECT_EQ(gguf->find_tensor("blk.0.ffn_down.weight")->dims,
            (std::vector<int64_t>{m.hidden, m.dim}));
  EXPECT_EQ(gguf->find_tensor("blk.0.ffn_up.weight")->dims,
            (std::vector<int64_t>{m.dim, m.hidden}));
  EXPECT_EQ(gguf->find_tensor("output.weight")->dims, (std::vector<int64_t>{m.dim, m.vocab}));
  EXPECT_EQ(*gguf->get_u32("llama.attention.head_count_kv"), static_cast<uint32_t>(m.kv_heads));
  EXPECT_EQ(*gguf->get_u32("llama.context_length"), static_cast<uint32_t>(m.seq_len));
  EXPECT_EQ(*gguf->get_u32("llama.rope.dimension_count"), static_cast<uint32_t>(m.dim / m.heads));
}

TEST(Llama2cTest, LegacySharedClassifier) {
  TinyLlama2c m;
  convert_and_check(m, "legacy_shared.gguf");
}

TEST(Llama2cTest, LegacySeparateClassifier) {
  TinyLlama2c m;
  m.shared = false;
  convert_and_check(m, "legacy_separate.gguf");
  EXPECT_NE(m.expected["output.weight"], m.expected["token_embd.weight"]);
}

TEST(Llama2cTest, Ak42Version1Shared) {
  TinyLlama2c m;
  m.version = 1;
  convert_and_check(m, "v1_shared.gguf");
}

TEST(Llama2cTest, Ak42Version1Separate) {
  TinyLlama2c m;
  m.version = 1;
  m.shared = false;
  m.kv_heads = 2;
  convert_and_check(m, "v1_separate.gguf");
}

TEST(Llama2cTest, Ak42Version2Q80IsDequantised) {
  TinyLlama2c m;
  m.version = 2;
  m.shared = false;
  convert_and_check(m, "v2.gguf");
}

TEST(Llama2cTest, TokenizerPiecesTypesAndScores) {
  const auto tok = tiny_tokenizer(8);
  auto kv = llama2c_tokenizer_metadata(tok, 8, "tok.bin");
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  gguf::GgufWriter w;
  for (auto& e : *kv) w.set(e.key, e.value);
  const std::string bytes = w.serialize();
  auto f = GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "mem");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*f->get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"<unk>", "<s>", "</s>", "<0x41>",
                                      "\xe2\x96\x81"
                                      "a",
                                      "b\xe2\x96\x81"
                                      "c",
                                      "x", "y"}));
  EXPECT_EQ(*f->get_i32_array("tokenizer.ggml.token_type"),
            (std::vector<int32_t>{2, 3, 3, 6, 1, 1, 1, 1}));
  EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores")->at(5), -5.0f);
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.eos_token_id"), 2u);
}

TEST(Llama2cTest, TruncatedModelFile) {
  TinyLlama2c m;
  m.shared = false;
  m.build();
  m.bytes.resize(m.bytes.size() - 4);
  auto plan = plan_llama2c(m.bytes, tiny_tokenizer(m.vocab), "cut.bin", "tok.bin", nullptr);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("cut.bin: truncated: wcls needs 192 bytes"),
            std::string::npos)
      << plan.status().message();
}

TEST(Llama2cTest, TrailingBytesAreRejected) {
  TinyLlama2c m;
  m.version = 1;
  m.build();
  m.bytes.resize(m.bytes.size() + 8);
  auto plan = plan_llama2c(m.bytes, tiny_tokenizer(m.vocab), "long.bin", "tok.bin", nullptr);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("8 unexpected bytes after the weights"), std::string::npos)
      << plan.status().message();
}

TEST(Llama2cTest, AbsurdHeaderDims) {
  struct Case {
    std::vector<int32_t> header;
    const char* message;
  };
  const Case cases[] = {
      {{1 << 30, 12, 2, 2, 1, 6, 4}, "dim = 1073741824 is outside [2, 65536]"},
      {{8, 12, 2, 3, 1, 6, 4}, "dim 8 is not n_heads 3"},
      {{8, 12, 2, 4, 3, 6, 4}, "n_kv_heads 3"},
      {{8, 12, 0, 2, 1, 6, 4}, "n_layers = 0"},
      {{8, 12, 2, 2, 1, INT32_MIN, 4}, "vocab_size = 0"},
      {{8, -5, 2, 2, 1, 6, 4}, "hidden_dim = -5"},
  };
  for (const auto& c : cases) {
    std::vector<uint8_t> bytes;
    for (int32_t v : c.header) append_i32(&bytes, v);
    bytes.resize(4096, 0);
    auto h = parse_llama2c_header(bytes, "absurd.bin");
    ASSERT_FALSE(h.ok()) << c.message;
    EXPECT_NE(h.status().message().find(c.message), std::string::npos) << h.status().message();
    EXPECT_NE(h.status().message().find("absurd.bin: header"), std::string::npos);
  }
}

TEST(Llama2cTest, TooSmallAndUnknownVersion) {
  std::vector<uint8_t> bytes = {1, 2, 3};
  auto h = parse_llama2c_header(bytes, "tiny.bin");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("file has 3 bytes"), std::string::npos);
  bytes.clear();
  append_i32(&bytes, 0x616b3432);
  append_i32(&bytes, 3);
  bytes.resize(256, 0);
  h = parse_llama2c_header(bytes, "v3.bin");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(h.status().message().find("version 3 is not supported"), std::string::npos);
}

TEST(Llama2cTest, TruncatedTokenizer) {
  auto tok = tiny_tokenizer(6);
  tok.resize(tok.size() - 2);
  auto kv = llama2c_tokenizer_metadata(tok, 6, "tok.bin");
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("tok.bin: token 5 has length 3 but 1 bytes remain"),
            std::string::npos)
      << kv.status().message();
  kv = llama2c_tokenizer_metadata(tiny_tokenizer(6), 7, "tok.bin");
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("truncated at token 6 of 7"), std::string::npos);
}

TEST(Llama2cTest, OutputTypeRules) {
  TinyLlama2c m;
  m.hidden = 40;  // ffn_down rows of 40 are not a multiple of 32
  m.dim = 32;
  m.build();
  auto plan = plan_llama2c(m.bytes, tiny_tokenizer(m.vocab), "t.bin", "tok.bin", nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto f16 = parse_output_type("f16");
  ASSERT_TRUE(f16.ok());
  const std::string path = temp_path("types_f16.gguf");
  ASSERT_TRUE(write_plan(*plan, *f16, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, gguf::GgmlType::kF16);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, gguf::GgmlType::kF32);
  EXPECT_EQ(*f->get_u32("general.file_type"), 1u);
  const auto q = testing::gguf_tensor_f32(*f->find_tensor("blk.1.ffn_up.weight"));
  const auto& want = m.expected["blk.1.ffn_up.weight"];
  ASSERT_EQ(q.size(), want.size());
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], want[i], std::fabs(want[i]) * 1e-3f) << i;

  const PlannedTensor& down = plan->tensors[9];
  ASSERT_EQ(down.name, "blk.0.ffn_down.weight");
  EXPECT_EQ(choose_tensor_type(down, OutputType{false, gguf::GgmlType::kQ8_0}),
            gguf::GgmlType::kF16);
  EXPECT_EQ(choose_tensor_type(plan->tensors[3], OutputType{false, gguf::GgmlType::kQ8_0}),
            gguf::GgmlType::kQ8_0);
  EXPECT_FALSE(parse_output_type("q9_9").ok());
  EXPECT_TRUE(parse_output_type("source").ok());
}

// The reference conversion (llama.cpp's convert-llama2c-to-ggml) of the real model: same
// tensor names, order, types, dims and bytes; same tokenizer arrays and shape metadata.
TEST(Llama2cTest, Stories260KMatchesReferenceGguf) {
  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.gguf"));
  const std::string dir = test::shared_path("models/stories260K") + "/";
  auto model = load_llama2c(dir + "stories260K.bin", dir + "tok512.bin");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::string path = temp_path("stories260K.gguf");
  ASSERT_TRUE(write_plan(model->plan, OutputType{}, path).ok());
  auto ours = GgufFile::open(path);
  auto ref = GgufFile::open(dir + "stories260K.gguf");
  ASSERT_TRUE(ours.ok() && ref.ok());
  ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
  for (size_t i = 0; i < ref->tensors().size(); ++i) {
    const auto& a = ours->tensors()[i];
    const auto& b = ref->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type) << b.name;
    EXPECT_EQ(a.dims, b.dims) << b.name;
    ASSERT_EQ(a.size_bytes, b.size_bytes) << b.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.size_bytes), 0) << b.name;
  }
  for (const char* key : {"tokenizer.ggml.tokens"}) {
    EXPECT_EQ(*ours->get_string_array(key), *ref->get_string_array(key));
  }
  EXPECT_EQ(*ours->get_f32_array("tokenizer.ggml.scores"),
            *ref->get_f32_array("tokenizer.ggml.scores"));
  EXPECT_EQ(*ours->get_i32_array("tokenizer.ggml.token_type"),
            *ref->get_i32_array("tokenizer.ggml.token_type"));
  for (const char* key :
       {"llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
        "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id"}) {
    EXPECT_EQ(*ours->get_u32(key), *ref->get_u32(key)) << key;
  }
  EXPECT_EQ(*ours->get_f32("llama.attention.layer_norm_rms_epsilon"),
            *ref->get_f32("llama.attention.layer_norm_rms_epsilon"));
  EXPECT_EQ(*ours->get_string("tokenizer.ggml.model"), "llama");
  // The reference's 2048 is llama.cpp's default n_ctx, not the model's; we write seq_len.
  EXPECT_EQ(*ours->get_u32("llama.context_length"), 512u);
}

}  // namespace
}  // namespace arbor::convert
