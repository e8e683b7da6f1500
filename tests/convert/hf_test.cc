#include "convert/hf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "convert/hf_tokenizer.h"
#include "convert/model_plan.h"
#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "safetensors_builder.h"

namespace arbor::convert {
namespace {

using gguf::GgufFile;
using Json = nlohmann::json;
using testing::st_entry;
using testing::StEntry;

const char* kTinyTokenizer = R"({
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                   {"id": 1, "content": "<s>", "special": true},
                   {"id": 2, "content": "</s>", "special": true}],
  "model": {"type": "BPE", "byte_fallback": true, "merges": ["b c"],
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "\u2581a": 4, "b": 5,
                      "c": 6, "bc": 7}}})";

// A tiny Hugging Face checkpoint written to a temp directory.
struct TinyHf {
  std::string arch = "LlamaForCausalLM";
  std::string dtype = "F16";
  int64_t hidden = 8, ffn = 16, layers = 2, heads = 2, kv_heads = 1, vocab = 8;
  bool store_embed = true, store_head = false, tie = true, sharded = false, biases = false;
  std::map<std::string, std::vector<float>> values;  // by HF name
  std::map<std::string, std::vector<int64_t>> shapes;

  int64_t head_dim() const { return hidden / heads; }

  Json config() const {
    return {{"architectures", {arch}},
            {"hidden_size", hidden},
            {"intermediate_size", ffn},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 50000.0},
            {"max_position_embeddings", 64},
            {"tie_word_embeddings", tie},
            {"vocab_size", vocab},
            {"bos_token_id", 1},
            {"eos_token_id", 2}};
  }

  // Multiples of 1/8 in [-12, 13): exact in F16 and BF16; distinct per tensor and row.
  void add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    const int64_t salt = static_cast<int64_t>(values.size()) * 37;
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((salt + i * 7) % 200) / 8.0f - 12.0f;
    values[name] = v;
    shapes[name] = std::move(shape);
  }

  void build() {
    const int64_t q = heads * head_dim(), kv = kv_heads * head_dim();
    if (store_embed) add("model.embed_tokens.weight", {vocab, hidden});
    if (store_head) add("lm_head.weight", {vocab, hidden});
    add("model.norm.weight", {hidden});
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {q, hidden});
      add(p + "self_attn.k_proj.weight", {kv, hidden});
      add(p + "self_attn.v_proj.weight", {kv, hidden});
      add(p + "self_attn.o_proj.weight", {hidden, q});
      add(p + "mlp.gate_proj.weight", {ffn, hidden});
      add(p + "mlp.up_proj.weight", {ffn, hidden});
      add(p + "mlp.down_proj.weight", {hidden, ffn});
      if (biases) {
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
    }
  }

  std::string write(const std::string& name) {
    build();
    const std::string dir = testing::temp_path(name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    testing::write_text(dir + "/config.json", config().dump());
    testing::write_text(dir + "/tokenizer.json", kTinyTokenizer);
    std::vector<StEntry> shard[2];
    Json weight_map = Json::object();
    int i = 0;
    for (const auto& [n, v] : values) {
      const int s = sharded ? (i++ % 2) : 0;
      shard[s].push_back(st_entry(n, dtype, shapes[n], v));
      weight_map[n] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
    }
    if (!sharded) {
      testing::write_bytes(dir + "/model.safetensors", testing::st_bytes(shard[0]));
      return dir;
    }
    for (int s = 0; s < 2; ++s) {
      testing::write_bytes(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors",
                           testing::st_bytes(shard[s]));
    }
    testing::write_text(dir + "/model.safetensors.index.json",
                        Json{{"weight_map", weight_map}}.dump());
    return dir;
  }
};

Result<GgufFile> convert_dir(const std::string& dir, const std::string& out_name,
                             const std::string& type = "f32") {
  ARBOR_ASSIGN_OR_RETURN(HfModel m, load_hf(dir));
  ARBOR_ASSIGN_OR_RETURN(OutputType t, parse_output_type(type));
  const std::string path = testing::temp_path(out_name);
  auto st = write_plan(m.plan, t, path);
  if (!st.ok()) return st;
  return GgufFile::open(path);
}

// Row `r` of a [rows, row_len] matrix.
std::vector<float> row(const std::vector<float>& m, int64_t row_len, int64_t r) {
  return {m.begin() + r * row_len, m.begin() + (r + 1) * row_len};
}

// q/k rows in GGUF order for head_dim 4: within each head, rows 0, 2, 1, 3 (the first half of
// a head holds the real parts, the second half the imaginary parts; GGUF interleaves them).
void expect_permuted(const TinyHf& m, const GgufFile& f, int64_t layer) {
  const std::string hp = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::string gp = "blk." + std::to_string(layer) + ".";
  ASSERT_EQ(m.head_dim(), 4);
  const std::vector<int64_t> q_order = {0, 2, 1, 3, 4, 6, 5, 7};
  const std::vector<int64_t> k_order = {0, 2, 1, 3};
  const auto q = testing::gguf_tensor_f32(*f.find_tensor(gp + "attn_q.weight"));
  const auto k = testing::gguf_tensor_f32(*f.find_tensor(gp + "attn_k.weight"));
  for (size_t r = 0; r < q_order.size(); ++r) {
    EXPECT_EQ(row(q, m.hidden, r), row(m.values.at(hp + "q_proj.weight"), m.hidden, q_order[r]))
        << r;
  }
  for (size_t r = 0; r < k_order.size(); ++r) {
    EXPECT_EQ(row(k, m.hidden, r), row(m.values.at(hp + "k_proj.weight"), m.hidden, k_order[r]))
        << r;
  }
  // v is never permuted.
  EXPECT_EQ(testing::gguf_tensor_f32(*f.find_tensor(gp + "attn_v.weight")),
            m.values.at(hp + "v_proj.weight"));
}

TEST(HfConvertTest, F16SingleFilePermutesQK) {
  TinyHf m;
  auto f = convert_dir(m.write("hf_f16"), "hf_f16.gguf", "source");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, gguf::GgmlType::kF16);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->dims, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(f->find_tensor("blk.0.attn_k.weight")->dims, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(f->find_tensor("blk.1.ffn_down.weight")->dims, (std::vector<int64_t>{16, 8}));
  expect_permuted(m, *f, 0);
  expect_permuted(m, *f, 1);
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.1.ffn_gate.weight")),
            m.values.at("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(*f->get_u32("llama.attention.head_count_kv"), 1u);
  EXPECT_EQ(*f->get_u32("llama.context_length"), 64u);
  EXPECT_EQ(*f->get_f32("llama.rope.freq_base"), 50000.0f);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied
}

TEST(HfConvertTest, Bf16ShardedPermutesQK) {
  TinyHf m;
  m.dtype = "BF16";
  m.sharded = true;
  const std::string dir = m.write("hf_bf16");
  ASSERT_TRUE(std::filesystem::exists(dir + "/model-00002-of-00002.safetensors"));
  auto f = convert_dir(dir, "hf_bf16.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->find_tensor("blk.1.attn_q.weight")->type, gguf::GgmlType::kF32);
  expect_permuted(m, *f, 0);
  expect_permuted(m, *f, 1);
}

TEST(HfConvertTest, Qwen2IsNotPermutedAndKeepsBiases) {
  TinyHf m;
  m.arch = "Qwen2ForCausalLM";
  m.dtype = "F32";
  m.biases = true;
  auto f = convert_dir(m.write("hf_qwen2"), "hf_qwen2.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_string("general.architecture"), "qwen2");
  EXPECT_EQ(*f->get_u32("qwen2.block_count"), 2u);
  const std::string p = "model.layers.1.self_attn.";
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.1.attn_q.weight")),
            m.values.at(p + "q_proj.weight"));
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.1.attn_k.weight")),
            m.values.at(p + "k_proj.weight"));
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.1.attn_q.bias")),
            m.values.at(p + "q_proj.bias"));
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.1.attn_v.bias")),
            m.values.at(p + "v_proj.bias"));
  EXPECT_EQ(f->find_tensor("blk.1.attn_k.bias")->dims, (std::vector<int64_t>{4}));
}

TEST(HfConvertTest, LlamaBiasIsPermutedLikeItsWeight) {
  TinyHf m;
  m.dtype = "F32";
  m.biases = true;
  auto f = convert_dir(m.write("hf_llama_bias"), "hf_llama_bias.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto& b = m.values.at("model.layers.0.self_attn.q_proj.bias");
  const std::vector<float> want = {b[0], b[2], b[1], b[3], b[4], b[6], b[5], b[7]};
  EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("blk.0.attn_q.bias")), want);
}

TEST(HfConvertTest, TieRules) {
  struct Case {
    bool embed, head, tie;
    const char* token_embd_source;  // HF tensor that becomes token_embd.weight
    bool has_output;
  };
  const Case cases[] = {
      {true, false, true, "model.embed_tokens.weight", false},
      {false, true, true, "lm_head.weight", false},
      {false, true, false, "lm_head.weight", false},
      {true, true, true, "model.embed_tokens.weight", false},
      {true, true, false, "model.embed_tokens.weight", true},
  };
  int i = 0;
  for (const auto& c : cases) {
    TinyHf m;
    m.dtype = "F32";
    m.store_embed = c.embed;
    m.store_head = c.head;
    m.tie = c.tie;
    const std::string name = "hf_tie" + std::to_string(i++);
    auto f = convert_dir(m.write(name), name + ".gguf");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("token_embd.weight")),
              m.values.at(c.token_embd_source))
        << name;
    ASSERT_EQ(f->find_tensor("output.weight") != nullptr, c.has_output) << name;
    if (c.has_output) {
      EXPECT_EQ(testing::gguf_tensor_f32(*f->find_tensor("output.weight")),
                m.values.at("lm_head.weight"));
    }
  }
}

TEST(HfConvertTest, ConfigErrors) {
  TinyHf m;
  const std::string dir = m.write("hf_bad_config");
  struct Case {
    std::string drop_key;
    Json set_value;
    const char* set_key;
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", nullptr, "", "missing required key \"hidden_size\""},
      {"num_hidden_layers", nullptr, "", "missing required key \"num_hidden_layers\""},
      {"rms_norm_eps", nullptr, "", "missing required key \"rms_norm_eps\""},
      {"architectures", nullptr, "", "missing required key \"architectures\""},
      {"", Json::array({"GPT2LMHeadModel"}), "architectures",
       "architecture 'GPT2LMHeadModel' is not supported"},
      {"", -3, "num_attention_heads", "\"num_attention_heads\" = -3 is not a positive integer"},
      {"", 3, "num_key_value_heads",
       "num_attention_heads 2 is not a multiple of num_key_value_heads 3"},
      {"", Json{{"rope_type", "yarn"}}, "rope_scaling",
       "rope_scaling type 'yarn' is not supported"},
      {"", Json{{"rope_type", 5}}, "rope_scaling", "rope_scaling.rope_type = 5 is not a string"},
  };
  for (const auto& c : cases) {
    Json config = m.config();
    if (!c.drop_key.empty()) config.erase(c.drop_key);
    if (*c.set_key) config[c.set_key] = c.set_value;
    testing::write_text(dir + "/config.json", config.dump());
    auto r = load_hf(dir);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status().message();
  }
}

// Rewrites dir/model.safetensors from `m`'s tensors after `edit` has changed the entries.
template <typename Edit>
std::string load_error_after(TinyHf& m, const std::string& name, Edit edit) {
  const std::string dir = m.write(name);
  std::vector<StEntry> entries;
  for (const auto& [n, v] : m.values) entries.push_back(st_entry(n, m.dtype, m.shapes[n], v));
  edit(entries);
  testing::write_bytes(dir + "/model.safetensors", testing::st_bytes(entries));
  auto r = load_hf(dir);
  return r.ok() ? "loaded fine" : r.status().message();
}

TEST(HfConvertTest, CheckpointErrors) {
  TinyHf m;
  auto msg = load_error_after(m, "hf_err_shape", [](std::vector<StEntry>& e) {
    for (auto& t : e) {
      if (t.name == "model.layers.1.mlp.up_proj.weight") {
        t.shape = {8, 16};
      }
    }
  });
  EXPECT_NE(msg.find("tensor 'model.layers.1.mlp.up_proj.weight' has shape [8, 16], config.json "
                     "implies [16, 8]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("hf_err_shape/model.safetensors"), std::string::npos) << msg;

  msg = load_error_after(m, "hf_err_dtype", [](std::vector<StEntry>& e) {
    for (auto& t : e) {
      if (t.name == "model.norm.weight") t.dtype = "I16";
    }
  });
  EXPECT_NE(msg.find("tensor 'model.norm.weight' has dtype I16 (supported: F32, F16, BF16)"),
            std::string::npos)
      << msg;

  msg = load_error_after(m, "hf_err_missing", [](std::vector<StEntry>& e) {
    std::erase_if(e,
                  [](const StEntry& t) { return t.name == "model.layers.1.mlp.down_proj.weight"; });
  });
  EXPECT_NE(msg.find("tensor 'model.layers.1.mlp.down_proj.weight' is missing"), std::string::npos)
      << msg;

  msg = load_error_after(m, "hf_err_unknown", [](std::vector<StEntry>& e) {
    e.push_back(st_entry("model.layers.0.mlp.extra.weight", "F16", {2}, {1, 2}));
  });
  EXPECT_NE(msg.find("tensor 'model.layers.0.mlp.extra.weight' has no GGUF mapping"),
            std::string::npos)
      << msg;

  msg = load_error_after(m, "hf_err_layer", [](std::vector<StEntry>& e) {
    e.push_back(
        st_entry("model.layers.2.input_layernorm.weight", "F16", {8}, std::vector<float>(8, 1)));
  });
  EXPECT_NE(msg.find("tensor 'model.layers.2.input_layernorm.weight' has no GGUF mapping for llama "
                     "with 2 layers"),
            std::string::npos)
      << msg;
}

TEST(HfConvertTest, CorruptSafetensorsNamesTheFile) {
  TinyHf m;
  const std::string dir = m.write("hf_corrupt");
  std::vector<StEntry> entries = {
      st_entry("model.norm.weight", "F32", {8}, std::vector<float>(8, 1))};
  auto bytes = testing::st_bytes(entries);
  bytes.resize(bytes.size() - 4);  // the data section is cut short
  testing::write_bytes(dir + "/model.safetensors", bytes);
  auto r = load_hf(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(
                dir + "/model.safetensors: tensor 'model.norm.weight': data_offsets end 32 is past "
                      "the end of the 28-byte data buffer"),
            std::string::npos)
      << r.status().message();
}

TEST(HfConvertTest, Llama3RopeFactors) {
  HfConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope.type = RopeScalingType::kLlama3;  // factor 8, low 1, high 4, original context 8192
  c.rope.factor = 8.0f;
  const auto f = llama3_rope_factors(c);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.0f);  // short wavelengths are unscaled
  EXPECT_EQ(f.back(), 8.0f);   // long wavelengths are divided by the factor
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]) << i;
  int smooth = 0;
  for (float v : f) smooth += v > 1.0f && v < 8.0f;
  EXPECT_GT(smooth, 0);  // the band between the two wavelengths is interpolated

  TinyHf m;
  m.dtype = "F32";
  const std::string dir = m.write("hf_llama3");
  Json config = m.config();
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 16}};
  testing::write_text(dir + "/config.json", config.dump());
  auto g = convert_dir(dir, "hf_llama3.gguf");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto* rope = g->find_tensor("rope_freqs.weight");
  ASSERT_NE(rope, nullptr);
  EXPECT_EQ(rope->dims, (std::vector<int64_t>{2}));
  EXPECT_EQ(rope->type, gguf::GgmlType::kF32);
}

TEST(HfTokenizerTest, ByteLevelBpeBecomesGpt2WithMergesAndPadding) {
  HfTokenizerFiles files;
  files.tokenizer_json = R"({
    "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": true},
                     {"id": 6, "content": "<tool>", "special": false}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120a": 3, "c": 4},
              "merges": [["a", "b"], "\u0120 a"]}})";
  files.tokenizer_config_json =
      R"({"eos_token": "<|endoftext|>", "pad_token": {"content": "<|endoftext|>"},
                                    "add_bos_token": false, "chat_template": "{{ x }}"})";
  files.model_vocab_size = 9;
  files.pre_name = "qwen2";
  auto kv = hf_tokenizer_metadata(files);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  gguf::GgufWriter w;
  for (auto& e : *kv) w.set(e.key, e.value);
  const std::string bytes = w.serialize();
  auto f = GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "mem");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(*f->get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab",
                                      "\xc4\xa0"
                                      "a",
                                      "c", "<|endoftext|>", "<tool>", "[PAD7]", "[PAD8]"}));
  EXPECT_EQ(*f->get_i32_array("tokenizer.ggml.token_type"),
            (std::vector<int32_t>{1, 1, 1, 1, 1, 3, 4, 5, 5}));
  EXPECT_EQ(*f->get_string_array("tokenizer.ggml.merges"),
            (std::vector<std::string>{"a b", "\xc4\xa0 a"}));
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.eos_token_id"), 5u);
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.padding_token_id"), 5u);
  EXPECT_EQ(f->find("tokenizer.ggml.bos_token_id"), nullptr);
  EXPECT_FALSE(*f->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f->get_string("tokenizer.chat_template"), "{{ x }}");
  EXPECT_EQ(f->find("tokenizer.ggml.scores"), nullptr);

  HfTokenizerFiles bad = files;
  bad.tokenizer_json = R"({"model": {"type": 7}})";
  kv = hf_tokenizer_metadata(bad);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("type must be string"), std::string::npos)
      << kv.status().message();

  files.model_vocab_size = 6;  // id 6 does not fit
  kv = hf_tokenizer_metadata(files);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("token id 6 does not fit the model's vocabulary of 6"),
            std::string::npos);
}

// Q8_0 stores d = fp16(amax / 127) per 32 values; rounding to the grid costs at most d/2, and
// the fp16 rounding of d at most 127 * d * 2^-11.
bool within_q8(const std::vector<float>& ours, const std::vector<float>& ref,
               const uint8_t* ref_blocks, size_t* bad_index) {
  for (size_t i = 0; i < ours.size(); ++i) {
    uint16_t d16;
    std::memcpy(&d16, ref_blocks + (i / 32) * 34, 2);
    const float d = fp16_to_fp32(d16);
    if (std::fabs(ours[i] - ref[i]) > 0.6f * d + 1e-7f) {
      *bad_index = i;
      return false;
    }
  }
  return true;
}

const std::string kTinyStoriesDir = test::shared_path("models/tinystories-656K");

TEST(HfConvertTest, TinyStoriesMatchesReferenceQ80) {
  const std::string ref_path = kTinyStoriesDir + "/TinyStories-656K-Q8_0.gguf";
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  auto ours = convert_dir(kTinyStoriesDir, "tinystories656K.gguf");
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  auto ref = GgufFile::open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
  for (const auto& r : ref->tensors()) {
    const auto* t = ours->find_tensor(r.name);
    ASSERT_NE(t, nullptr) << r.name;
    EXPECT_EQ(t->dims, r.dims) << r.name;
    const auto a = testing::gguf_tensor_f32(*t);
    const auto b = testing::gguf_tensor_f32(r);
    ASSERT_EQ(a.size(), b.size()) << r.name;
    if (r.type == gguf::GgmlType::kF32) {
      EXPECT_EQ(a, b) << r.name;
      continue;
    }
    ASSERT_EQ(r.type, gguf::GgmlType::kQ8_0) << r.name;
    size_t bad = 0;
    EXPECT_TRUE(within_q8(a, b, r.data, &bad))
        << r.name << " element " << bad << ": " << a[bad] << " vs " << b[bad];
  }
  // The comparison can tell a missing permutation: the unpermuted q rows are far off.
  auto weights = SafetensorsModel::open_dir(kTinyStoriesDir);
  ASSERT_TRUE(weights.ok());
  const StTensor* q = weights->find("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> raw(q->num_elements());
  std::memcpy(raw.data(), q->bytes.data(), q->bytes.size());
  size_t bad = 0;
  EXPECT_FALSE(within_q8(raw, testing::gguf_tensor_f32(*ref->find_tensor("blk.0.attn_q.weight")),
                         ref->find_tensor("blk.0.attn_q.weight")->data, &bad));
}

// --type q8_0 reproduces llama.cpp's conversion byte for byte (same quantiser, same permutation).
TEST(HfConvertTest, TinyStoriesQ80IsByteIdenticalToReference) {
  const std::string ref_path = kTinyStoriesDir + "/TinyStories-656K-Q8_0.gguf";
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  auto ours = convert_dir(kTinyStoriesDir, "tinystories656K_q8.gguf", "q8_0");
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  auto ref = GgufFile::open(ref_path);
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
  for (const auto& r : ref->tensors()) {
    const auto* t = ours->find_tensor(r.name);
    ASSERT_NE(t, nullptr) << r.name;
    EXPECT_EQ(t->type, r.type) << r.name;
    EXPECT_EQ(t->dims, r.dims) << r.name;
    ASSERT_EQ(t->size_bytes, r.size_bytes) << r.name;
    EXPECT_EQ(std::memcmp(t->data, r.data, r.size_bytes), 0) << r.name;
  }
  EXPECT_EQ(*ours->get_u32("general.file_type"), *ref->get_u32("general.file_type"));
  EXPECT_EQ(*ours->get_u32("general.quantization_version"), 2u);
}

// The converted vocabulary has the reference's arrays and special-token keys (which determine
// how it encodes; tokenizer_parity_test.cc checks the encodings themselves).
TEST(HfConvertTest, TinyStoriesTokenizerMetadataMatchesReference) {
  const std::string ref_path = kTinyStoriesDir + "/TinyStories-656K-Q8_0.gguf";
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  auto ours = convert_dir(kTinyStoriesDir, "tinystories656K_tok.gguf");
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  auto ref = GgufFile::open(ref_path);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*ours->get_string_array("tokenizer.ggml.tokens"),
            *ref->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(*ours->get_f32_array("tokenizer.ggml.scores"),
            *ref->get_f32_array("tokenizer.ggml.scores"));
  EXPECT_EQ(*ours->get_i32_array("tokenizer.ggml.token_type"),
            *ref->get_i32_array("tokenizer.ggml.token_type"));
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.pre", "general.architecture"}) {
    EXPECT_EQ(*ours->get_string(key), *ref->get_string(key)) << key;
  }
  for (const char* key :
       {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
        "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
        "llama.block_count", "llama.attention.head_count", "llama.attention.head_count_kv",
        "llama.rope.dimension_count", "llama.vocab_size"}) {
    EXPECT_EQ(*ours->get_u32(key), *ref->get_u32(key)) << key;
  }
  for (const char* key : {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}) {
    EXPECT_EQ(*ours->get_bool(key), *ref->get_bool(key)) << key;
  }
  for (const char* key : {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"}) {
    EXPECT_EQ(*ours->get_f32(key), *ref->get_f32(key)) << key;
  }
}

}  // namespace
}  // namespace arbor::convert
