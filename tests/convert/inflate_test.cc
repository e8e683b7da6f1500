// convert::inflate_model on stories260K: metadata, tensor order/shapes/types, the source's
// values where the construction puts them, exact zeros where it promises them, random rows where
// nobody reads them, determinism, and the errors for impossible shapes.
#include "convert/inflate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <thread>

#include "gguf/quantize_model.h"
#include "support/shared_data.h"
#include "test_util.h"

namespace arbor::convert::testing {
namespace {

using gguf::GgmlType;
using gguf::GgufFile;

// dim 64 -> 256, kv-ratio 2 -> 4 (so source heads move: 0,1,2,...,7 -> 0,1,4,5,8,9,12,13, and
// kv heads 4..7 are new), ffn 172 -> 512, layers 5 -> 7.
InflateOptions small(GgmlType type = GgmlType::kF32) {
  InflateOptions o;
  o.dim = 256;
  o.ffn = 512;
  o.layers = 7;
  o.kv_ratio = 4;
  o.type = type;
  o.seed = 5;
  return o;
}

class InflateStructureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    auto src = GgufFile::open(test::shared_path(test::kStories260K));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    src_ = std::move(*src);
  }

  // The inflated file's bytes (kept in `bytes_` so that the parsed file can point into them).
  GgufFile inflated(const InflateOptions& o) {
    auto writer = inflate_model(src_, o);
    EXPECT_TRUE(writer.ok()) << writer.status().to_string();
    if (!writer.ok()) return {};
    bytes_.push_back(writer->serialize());
    const std::string& b = bytes_.back();
    auto file = GgufFile::parse({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, "inflated");
    EXPECT_TRUE(file.ok()) << file.status().to_string();
    return file.ok() ? std::move(*file) : GgufFile();
  }

  // The source tensor as floats.                                    // [rows, cols] row-major
  std::vector<float> source(const std::string& name) {
    return gguf_tensor_f32(*src_.find_tensor(name));
  }

  std::string error(const InflateOptions& o) {
    auto r = inflate_model(src_, o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : r.status().to_string();
  }

  GgufFile src_;
  std::deque<std::string> bytes_;  // a deque: parsed files point into its strings
};

// A tensor's values and its row length.
struct Matrix {
  std::vector<float> v;  // [rows, cols]
  int64_t cols = 0;
  float at(int64_t r, int64_t c) const { return v[r * cols + c]; }
  int64_t rows() const { return static_cast<int64_t>(v.size()) / cols; }
};

Matrix matrix(const GgufFile& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {{0.0f}, 1};
  return {gguf_tensor_f32(*t), t->dims[0]};
}

// Row r's columns [c0, c1) are all zero / all within the random range and not all zero.
bool zero(const Matrix& m, int64_t r, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    if (m.at(r, c) != 0.0f) return false;
  }
  return true;
}
bool random(const Matrix& m, int64_t r, int64_t c0, int64_t c1) {
  const float bound = 0.02f * std::sqrt(3.0f);
  bool any = false;
  for (int64_t c = c0; c < c1; ++c) {
    if (std::fabs(m.at(r, c)) > bound) return false;
    any = any || m.at(r, c) != 0.0f;
  }
  return any;
}

std::string layer(int64_t l, const char* t) { return str_cat("blk.", l, ".", t, ".weight"); }

TEST_F(InflateStructureTest, MetadataAndTensorLayout) {
  const GgufFile f = inflated(small());
  EXPECT_EQ(*f.get_u32("llama.embedding_length"), 256u);
  EXPECT_EQ(*f.get_u32("llama.feed_forward_length"), 512u);
  EXPECT_EQ(*f.get_u32("llama.block_count"), 7u);
  EXPECT_EQ(*f.get_u32("llama.attention.head_count"), 32u);
  EXPECT_EQ(*f.get_u32("llama.attention.head_count_kv"), 8u);
  EXPECT_EQ(*f.get_u32("llama.rope.dimension_count"), 8u);
  EXPECT_EQ(*f.get_u32("llama.context_length"), 2048u);
  EXPECT_EQ(*f.get_f32("llama.attention.layer_norm_rms_epsilon"),
            *src_.get_f32("llama.attention.layer_norm_rms_epsilon") / 4.0f);
  EXPECT_EQ(*f.get_string("general.name"), "inflated-llama-256x7");
  EXPECT_EQ(*f.get_u32("general.file_type"), 0u);
  // The source's keys first, in their order and (tokenizer) with their values; then file_type.
  ASSERT_EQ(f.metadata().size(), src_.metadata().size() + 1);
  for (size_t i = 0; i < src_.metadata().size(); ++i) {
    const gguf::KeyValue& kv = src_.metadata()[i];
    EXPECT_EQ(f.metadata()[i].key, kv.key);
    if (kv.key.starts_with("tokenizer.")) {
      EXPECT_TRUE(f.metadata()[i].value == kv.value) << kv.key;
    }
  }
  // token_embd, 7 x 9 layer tensors in the reference's order, output_norm, output.
  ASSERT_EQ(f.tensors().size(), 66u);
  const char* order[] = {"attn_norm", "attn_q",   "attn_k",   "attn_v", "attn_output",
                         "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};
  const std::vector<int64_t> shapes[] = {{256}, {256, 256}, {256, 64},  {256, 64}, {256, 256},
                                         {256}, {256, 512}, {512, 256}, {256, 512}};
  EXPECT_EQ(f.tensors()[0].name, "token_embd.weight");
  EXPECT_EQ(f.tensors()[0].dims, (std::vector<int64_t>{256, 512}));
  for (int l = 0; l < 7; ++l) {
    for (int i = 0; i < 9; ++i) {
      const gguf::TensorInfo& t = f.tensors()[1 + 9 * l + i];
      EXPECT_EQ(t.name, layer(l, order[i]));
      EXPECT_EQ(t.dims, shapes[i]) << t.name;
      EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
    }
  }
  EXPECT_EQ(f.tensors()[64].name, "output_norm.weight");
  EXPECT_EQ(f.tensors()[65].name, "output.weight");
  EXPECT_EQ(f.tensors()[65].dims, (std::vector<int64_t>{256, 512}));
}

TEST_F(InflateStructureTest, EmbeddingClassifierAndNormsPadTheSource) {
  const GgufFile f = inflated(small());
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    const Matrix m = matrix(f, name);
    const std::vector<float> s = source(name);
    ASSERT_EQ(m.rows(), 512);
    for (int64_t r = 0; r < 512; ++r) {
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(m.at(r, c), s[r * 64 + c]) << name << " " << r;
      ASSERT_TRUE(zero(m, r, 64, 256)) << name << " row " << r;
    }
  }
  // Norm weights: the source's times sqrt(64/256) = 0.5 (exact), the new dims 0.5; new layers
  // all 0.5.
  for (const std::string& name : {layer(0, "attn_norm"), layer(4, "ffn_norm"),
                                 std::string("output_norm.weight"), layer(6, "attn_norm")}) {
    const Matrix m = matrix(f, name);
    const bool real = name != layer(6, "attn_norm");
    const std::vector<float> s = real ? source(name) : std::vector<float>(64, 1.0f);
    for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(m.v[i], i < 64 ? s[i] * 0.5f : 0.5f) << name << i;
  }
}

TEST_F(InflateStructureTest, AttentionHeadsMoveWithTheirKvHead) {
  const GgufFile f = inflated(small());
  for (int64_t l : {0, 4}) {
    const Matrix q = matrix(f, layer(l, "attn_q")), o = matrix(f, layer(l, "attn_output"));
    const std::vector<float> sq = source(layer(l, "attn_q")), so = source(layer(l, "attn_output"));
    std::vector<int64_t> source_head(32, -1);
    for (int64_t h = 0; h < 8; ++h) source_head[(h / 2) * 4 + h % 2] = h;  // kv head h / 2
    for (int64_t r = 0; r < 256; ++r) {
      const int64_t h = source_head[r / 8];
      if (h >= 0) {
        for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(q.at(r, c), sq[(h * 8 + r % 8) * 64 + c]);
      } else {
        ASSERT_TRUE(random(q, r, 0, 64)) << "q row " << r;  // a new head reads the live columns
      }
      ASSERT_TRUE(zero(q, r, 64, 256)) << "q row " << r;
    }
    // attn_output: row i < 64 holds source head h's columns at its new head, all else 0.
    for (int64_t i = 0; i < 256; ++i) {
      for (int64_t c = 0; c < 256; ++c) {
        const int64_t h = source_head[c / 8];
        const float want = (i < 64 && h >= 0) ? so[i * 64 + h * 8 + c % 8] : 0.0f;
        ASSERT_EQ(o.at(i, c), want) << "attn_output " << i << ", " << c;
      }
    }
    for (const char* kv : {"attn_k", "attn_v"}) {
      const Matrix m = matrix(f, layer(l, kv));
      const std::vector<float> s = source(layer(l, kv));
      for (int64_t r = 0; r < 64; ++r) {
        if (r < 32) {  // kv heads 0..3 stay where they were
          for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(m.at(r, c), s[r * 64 + c]) << kv << r;
          ASSERT_TRUE(zero(m, r, 64, 256)) << kv << " row " << r;
        } else {
          ASSERT_TRUE(random(m, r, 0, 256)) << kv << " row " << r;
        }
      }
    }
  }
}

TEST_F(InflateStructureTest, FeedForwardUnitsAndNewLayers) {
  const GgufFile f = inflated(small());
  for (const char* name : {"ffn_gate", "ffn_up"}) {
    const Matrix m = matrix(f, layer(2, name));
    const std::vector<float> s = source(layer(2, name));
    for (int64_t r = 0; r < 512; ++r) {
      if (r < 172) {
        for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(m.at(r, c), s[r * 64 + c]) << name << r;
        ASSERT_TRUE(zero(m, r, 64, 256)) << name << " row " << r;
      } else {
        ASSERT_TRUE(random(m, r, 0, 256)) << name << " row " << r;
      }
    }
  }
  const Matrix down = matrix(f, layer(2, "ffn_down"));
  const std::vector<float> s = source(layer(2, "ffn_down"));
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 512; ++c) {
      ASSERT_EQ(down.at(r, c), r < 64 && c < 172 ? s[r * 172 + c] : 0.0f) << r << ", " << c;
    }
  }
  // Layers 5 and 6 are new: real work whose outputs are multiplied by zero.
  for (int64_t l : {5, 6}) {
    const Matrix q = matrix(f, layer(l, "attn_q"));
    for (int64_t r = 0; r < 256; ++r) {
      ASSERT_TRUE(random(q, r, 0, 64) && zero(q, r, 64, 256)) << "layer " << l << " q row " << r;
    }
    for (const char* name : {"attn_k", "attn_v", "ffn_gate", "ffn_up"}) {
      const Matrix m = matrix(f, layer(l, name));
      for (int64_t r = 0; r < m.rows(); ++r) ASSERT_TRUE(random(m, r, 0, 256)) << name << r;
    }
    for (const char* name : {"attn_output", "ffn_down"}) {
      const Matrix m = matrix(f, layer(l, name));
      EXPECT_TRUE(std::all_of(m.v.begin(), m.v.end(), [](float x) { return x == 0.0f; })) << name;
    }
  }
}

TEST_F(InflateStructureTest, ExpertsAreTheGrownFeedForwardEachWithItsOwnDeadUnits) {
  InflateOptions o = small();
  o.experts = 4;
  o.experts_used = 2;
  const GgufFile f = inflated(o);
  EXPECT_EQ(*f.get_u32("llama.expert_count"), 4u);
  EXPECT_EQ(*f.get_u32("llama.expert_used_count"), 2u);
  EXPECT_EQ(f.find_tensor(layer(2, "ffn_gate")), nullptr);
  // Rows of the 3-D tensors run expert by expert: [4 x 512] gate/up rows, [4 x 256] down rows.
  for (const char* name : {"ffn_gate", "ffn_up"}) {
    const Matrix m = matrix(f, layer(2, (std::string(name) + "_exps").c_str()));
    ASSERT_EQ(m.rows(), 4 * 512);
    const std::vector<float> s = source(layer(2, name));
    for (int64_t e = 0; e < 4; ++e) {
      for (int64_t u = 0; u < 512; ++u) {
        const int64_t r = e * 512 + u;
        if (u < 172) {
          for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(m.at(r, c), s[u * 64 + c]) << name << r;
          ASSERT_TRUE(zero(m, r, 64, 256)) << name << " row " << r;
        } else {
          ASSERT_TRUE(random(m, r, 0, 256)) << name << " row " << r;
          // Each expert's dead units are its own rows, not copies of expert 0's.
          if (e > 0) ASSERT_NE(m.at(r, 0), m.at(u, 0)) << name << " row " << r;
        }
      }
    }
  }
  const Matrix down = matrix(f, layer(2, "ffn_down_exps"));
  ASSERT_EQ(down.rows(), 4 * 256);
  const std::vector<float> s = source(layer(2, "ffn_down"));
  for (int64_t r = 0; r < 4 * 256; ++r) {
    for (int64_t c = 0; c < 512; ++c) {
      ASSERT_EQ(down.at(r, c), r % 256 < 64 && c < 172 ? s[(r % 256) * 172 + c] : 0.0f)
          << r << ", " << c;
    }
  }
  // The router: random over the live columns, zero beyond; in new layers too.
  for (int64_t l : {2, 6}) {
    const Matrix router = matrix(f, layer(l, "ffn_gate_inp"));
    ASSERT_EQ(router.rows(), 4);
    for (int64_t r = 0; r < 4; ++r) {
      ASSERT_TRUE(random(router, r, 0, 64) && zero(router, r, 64, 256)) << l << " row " << r;
    }
  }
}

TEST_F(InflateStructureTest, DeterministicAcrossThreadsAndSeedsDiffer) {
  // Rows in chunks of 7 on three threads, each thread taking its chunks from the end.
  InflateOptions threaded = small();
  threaded.parallel_for = [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (int64_t c = (n + 6) / 7 - 1 - t; c >= 0; c -= 3) fn(c * 7, std::min(n, c * 7 + 7));
      });
    }
    for (std::thread& t : threads) t.join();
  };
  inflated(small());
  inflated(threaded);
  InflateOptions other_seed = small();
  other_seed.seed = 6;
  inflated(other_seed);
  ASSERT_EQ(bytes_.size(), 3u);
  EXPECT_TRUE(bytes_[0] == bytes_[1]) << "thread count changed the bytes";
  EXPECT_EQ(bytes_[0].size(), bytes_[2].size());
  EXPECT_FALSE(bytes_[0] == bytes_[2]) << "seed did not change the random rows";
}

TEST_F(InflateStructureTest, TypesApplyToMatricesOnly) {
  const GgufFile f32 = inflated(small());
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const GgufFile f = inflated(small(type));
    EXPECT_EQ(*f.get_u32("general.file_type"), gguf::llama_file_type(type));
    EXPECT_EQ(f.find("general.quantization_version") != nullptr, type != GgmlType::kF16);
    for (const gguf::TensorInfo& t : f.tensors()) {
      EXPECT_EQ(t.type, t.dims.size() == 1 ? GgmlType::kF32 : type) << t.name;
    }
    // Zeros survive any encoding exactly: a new layer's attn_output, the padded embedding.
    if (type == GgmlType::kQ4_0) continue;  // gguf_tensor_f32 reads F32/F16/BF16/Q8_0
    const Matrix o = matrix(f, layer(6, "attn_output"));
    EXPECT_TRUE(std::all_of(o.v.begin(), o.v.end(), [](float x) { return x == 0.0f; }));
    const Matrix e = matrix(f, "token_embd.weight"), e32 = matrix(f32, "token_embd.weight");
    for (int64_t r = 0; r < 512; ++r) ASSERT_TRUE(zero(e, r, 64, 256)) << r;
    if (type == GgmlType::kF16) {
      for (size_t i = 0; i < e.v.size(); ++i) {
        ASSERT_EQ(e.v[i], fp16_to_fp32(fp32_to_fp16(e32.v[i]))) << i;
      }
    }
  }
}

TEST_F(InflateStructureTest, ImpossibleShapesNameTheLimit) {
  auto with = [](auto change) {
    InflateOptions o = small();
    change(o);
    return o;
  };
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  std::string e = error(with([](InflateOptions& o) { o.dim = 192; }));
  EXPECT_TRUE(has(e, "--dim 192 must be the model's embedding length 64 times a power of two"))
      << e;
  e = error(with([](InflateOptions& o) { o.dim = 32; }));
  EXPECT_TRUE(has(e, "--dim 32 must be")) << e;
  e = error(with([](InflateOptions& o) { o.ffn = 160; }));
  EXPECT_TRUE(has(e, "--ffn 160 is less than the model's feed_forward_length 172")) << e;
  e = error(with([](InflateOptions& o) { o.layers = 4; }));
  EXPECT_TRUE(has(e, "--layers 4 is fewer than the model's 5 layers")) << e;
  e = error(with([](InflateOptions& o) { o.kv_ratio = 3; }));
  EXPECT_TRUE(has(e, "--kv-ratio 3 must be a multiple of the model's 2 query heads per kv head"))
      << e;
  e = error(with([](InflateOptions& o) { o.kv_ratio = 16; }));
  EXPECT_TRUE(has(e, "--kv-ratio 16 must divide the inflated model's 32 heads")) << e;
  EXPECT_TRUE(has(e, "leave at least the model's 4 kv heads; at most 8")) << e;
  e = error(with([](InflateOptions& o) {
    o.ffn = 500;
    o.type = GgmlType::kQ8_0;
  }));
  EXPECT_TRUE(has(e, "--dim 256 and --ffn 500 must be multiples of 32 for type q8_0")) << e;
  e = error(with([](InflateOptions& o) { o.type = GgmlType::kQ4_1; }));
  EXPECT_TRUE(has(e, "--type q4_1 is not supported")) << e;
  e = error(with([](InflateOptions& o) {
    o.experts = 4;
    o.experts_used = 5;
  }));
  EXPECT_TRUE(has(e, "--experts 4 and --experts-used 5: a mixture needs 1 <= experts used <= "
                     "experts")) << e;
  e = error(with([](InflateOptions& o) { o.experts_used = 2; }));
  EXPECT_TRUE(has(e, "--experts 0 and --experts-used 2")) << e;
  e = error(with([](InflateOptions& o) { o.kv_ratio = 0; }));
  EXPECT_TRUE(has(e, "must be > 0")) << e;
}

TEST_F(InflateStructureTest, SourceMustBeAnF32Llama) {
  auto f16 = gguf::quantize_model(src_, {.target = GgmlType::kF16}, nullptr);
  ASSERT_TRUE(f16.ok());
  const std::string f16_bytes = f16->serialize();
  auto f16_file = GgufFile::parse(
      {reinterpret_cast<const uint8_t*>(f16_bytes.data()), f16_bytes.size()}, "f16.gguf");
  ASSERT_TRUE(f16_file.ok());
  auto r = inflate_model(*f16_file, small());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("f16.gguf: token_embd.weight is f16; --inflate needs an "
                                      "all-F32 model"),
            std::string::npos)
      << r.status().to_string();

  gguf::GgufWriter qwen = gguf::GgufWriter::from_file(src_);
  qwen.set("general.architecture", gguf::Value::str("qwen2"));
  const std::string qwen_bytes = qwen.serialize();
  auto qwen_file = GgufFile::parse(
      {reinterpret_cast<const uint8_t*>(qwen_bytes.data()), qwen_bytes.size()}, "qwen.gguf");
  ASSERT_TRUE(qwen_file.ok());
  r = inflate_model(*qwen_file, small());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("qwen.gguf is a qwen2 model; --inflate handles llama"),
            std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace arbor::convert::testing
