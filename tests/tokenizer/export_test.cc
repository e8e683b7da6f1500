// to_gguf_metadata(): a tokenizer written as GGUF metadata and loaded back encodes and decodes
// exactly like the original. Plus the error paths of the loaders.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gguf/gguf.h"
#include "test_util.h"

namespace arbor::tokenizer {
namespace {

using testing::ids_to_string;

const char* const kSamples[] = {
    "Hello world! It's 2024 -- isn't it?  Double  spaces\n\nand\ttabs.",
    "Grüße, naïve café — Привет мир, 日本語, 한국어, 🦙🚀 😶‍🌫️",
    "<|im_start|>user\nhi<|im_end|><s></s> <|begin_of_text|>",
    " 3333333 ((((x)))) ''''' \"quoted\" ~~~ ...",
};

void check_export(const std::string& rel) {
  ARBOR_TOKENIZER_OR_FAIL(tok, rel);
  gguf::GgufWriter writer;
  for (const gguf::KeyValue& kv : tok->to_gguf_metadata()) writer.set(kv.key, kv.value);
  const std::string bytes = writer.serialize();
  auto file = gguf::GgufFile::parse(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, rel + " (exported)");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto back = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  const Tokenizer& t2 = **back;
  EXPECT_EQ(t2.vocab_size(), tok->vocab_size()) << rel;
  EXPECT_EQ(t2.bos_id(), tok->bos_id()) << rel;
  EXPECT_EQ(t2.eos_id(), tok->eos_id()) << rel;
  EXPECT_EQ(t2.add_bos(), tok->add_bos()) << rel;
  EXPECT_EQ(t2.eog_ids(), tok->eog_ids()) << rel;
  EXPECT_EQ(t2.chat_template(), tok->chat_template()) << rel;
  for (const char* text : kSamples) {
    for (bool special : {false, true}) {
      const auto a = tok->encode(text, {.parse_special = special});
      const auto b = t2.encode(text, {.parse_special = special});
      EXPECT_EQ(ids_to_string(a), ids_to_string(b)) << rel << ": " << text;
      EXPECT_EQ(tok->decode(a), t2.decode(b)) << rel;
    }
  }
}

// The keys and shapes llama.cpp expects for Llama 3.
void check_llama3_keys() {
  ARBOR_TOKENIZER_OR_FAIL(tok, "tokenizers/hf/llama3/tokenizer.json");
  const auto kvs = tok->to_gguf_metadata();
  auto find = [&](const std::string& key) -> const gguf::Value* {
    for (const auto& kv : kvs) {
      if (kv.key == key) return &kv.value;
    }
    return nullptr;
  };
  ASSERT_NE(find("tokenizer.ggml.model"), nullptr);
  EXPECT_EQ(std::get<std::string>(find("tokenizer.ggml.model")->data), "gpt2");
  EXPECT_EQ(std::get<std::string>(find("tokenizer.ggml.pre")->data), "llama-bpe");
  ASSERT_NE(find("tokenizer.ggml.merges"), nullptr);
  EXPECT_EQ(std::get<gguf::Array>(find("tokenizer.ggml.merges")->data).items.size(), 280147u);
  EXPECT_EQ(std::get<gguf::Array>(find("tokenizer.ggml.tokens")->data).items.size(), 128256u);
  EXPECT_EQ(std::get<uint32_t>(find("tokenizer.ggml.bos_token_id")->data), 128000u);
  EXPECT_EQ(find("tokenizer.ggml.scores"), nullptr);
}

TEST(Export, Llama3Json) {
  check_export("tokenizers/hf/llama3/tokenizer.json");
  check_llama3_keys();
}
TEST(Export, Qwen3Json) { check_export("tokenizers/hf/qwen3/tokenizer.json"); }
TEST(Export, TinyStoriesJson) { check_export("models/tinystories-656K/tokenizer.json"); }
TEST(Export, Stories260KGguf) { check_export("models/stories260K/stories260K.gguf"); }
TEST(Export, Gpt2Gguf) { check_export("tokenizers/llamacpp-vocab/ggml-vocab-gpt-2.gguf"); }
TEST(Export, Phi3Gguf) { check_export("tokenizers/llamacpp-vocab/ggml-vocab-phi-3.gguf"); }

class LoaderErrors : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& contents) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("arbor_tok_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto path = dir / name;
    std::ofstream(path) << contents;
    return path.string();
  }
};

TEST_F(LoaderErrors, BadJsonIsAStatus) {
  auto r = Tokenizer::from_file(write("broken.json", "{\"model\": {"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("broken.json"), std::string::npos);
}

TEST_F(LoaderErrors, UnsupportedModelIsUnimplemented) {
  auto r = Tokenizer::from_hf_json(
      write("unigram.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().to_string();
}

TEST_F(LoaderErrors, WrongTypesAreStatuses) {
  auto r = Tokenizer::from_hf_json(write("types.json", R"({"model": {"type": "BPE", "vocab": 7}})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
}

TEST_F(LoaderErrors, MissingFileAndKeys) {
  EXPECT_FALSE(Tokenizer::from_file("/nonexistent/tokenizer.json").ok());
  gguf::GgufWriter writer;
  writer.set("general.architecture", gguf::Value::str("llama"));
  const std::string bytes = writer.serialize();
  auto file = gguf::GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()},
                                    "empty.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto r = Tokenizer::from_gguf(*file);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("tokenizer.ggml.model"), std::string::npos)
      << r.status().message();
}

// A twelve-token byte-level BPE vocabulary ("a", "b", "ab", "<s>", "</s>", "c" ... "i") named
// `pre`.
Result<std::unique_ptr<Tokenizer>> tiny_bpe(const std::string& pre, bool with_bos_id = true,
                                            std::vector<std::string> regexes = {}) {
  gguf::GgufWriter writer;
  writer.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  writer.set("tokenizer.ggml.pre", gguf::Value::str(pre));
  writer.set("tokenizer.ggml.tokens", gguf::Value::string_array(
      {"a", "b", "ab", "<s>", "</s>", "c", "d", "e", "f", "g", "h", "i"}));
  writer.set("tokenizer.ggml.token_type",
             gguf::Value::i32_array({1, 1, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1}));
  writer.set("tokenizer.ggml.merges", gguf::Value::string_array({"a b"}));
  if (with_bos_id) writer.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(3));
  writer.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(4));
  if (!regexes.empty()) {
    writer.set("tokenizer.arbor.pre_regexes", gguf::Value::string_array(regexes));
  }
  const std::string bytes = writer.serialize();
  auto file = gguf::GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()},
                                    "tiny-" + pre + ".gguf");
  if (!file.ok()) return file.status();
  return Tokenizer::from_gguf(*file);
}

// o200k_harmony (gpt-oss): <|return|> and <|call|> end generation and <|end|> (which ends a
// message, not the turn) does not, as llama.cpp decides when all three are present; a
// vocabulary with <|end|> alone (Phi-3) keeps it as end of generation.
TEST(EndOfGeneration, HarmonyMarkersEndGenerationButNotMessages) {
  auto make = [](std::vector<std::string> specials) {
    std::vector<std::string> tokens = {"a", "b"};
    std::vector<int32_t> types = {1, 1};
    for (std::string& t : specials) {
      tokens.push_back(std::move(t));
      types.push_back(3);
    }
    gguf::GgufWriter writer;
    writer.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    writer.set("tokenizer.ggml.pre", gguf::Value::str("gpt-4o"));
    writer.set("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
    writer.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
    writer.set("tokenizer.ggml.merges", gguf::Value::string_array({"a b"}));
    const std::string bytes = writer.serialize();
    auto file = gguf::GgufFile::parse(
        {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "harmony.gguf");
    EXPECT_TRUE(file.ok());
    return Tokenizer::from_gguf(*file);
  };
  auto harmony = make({"<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>"});
  ASSERT_TRUE(harmony.ok()) << harmony.status().to_string();
  const Tokenizer& h = **harmony;
  EXPECT_TRUE(h.is_eog(h.token_id("<|return|>")));
  EXPECT_TRUE(h.is_eog(h.token_id("<|call|>")));
  EXPECT_FALSE(h.is_eog(h.token_id("<|end|>")));
  EXPECT_FALSE(h.is_eog(h.token_id("<|channel|>")));
  auto phi = make({"<|end|>", "<|endoftext|>"});
  ASSERT_TRUE(phi.ok()) << phi.status().to_string();
  EXPECT_TRUE((*phi)->is_eog((*phi)->token_id("<|end|>")));
}

TEST(PreTokenizerNames, UnknownNameIsRefusedListingTheSupportedOnes) {
  auto r = tiny_bpe("no-such-pre");
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().to_string();
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << msg;
  EXPECT_NE(msg.find("tiny-no-such-pre.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokenizer.ggml.pre = 'no-such-pre'"), std::string::npos) << msg;
  for (const char* name : {"tekken", "qwen2", "qwen35", "llama-bpe", "smollm", "dbrx", "refact",
                           "olmo", "phi-2", "gpt-4o", "deepseek-v3"}) {
    EXPECT_NE(msg.find(std::string(" ") + name + ","), std::string::npos)
        << name << " not listed: " << msg;
  }
  // Names llama.cpp knows whose behaviour arbor does not reproduce are refused too.
  for (const char* name : {"kimi-k2", "chameleon", "superbpe", "tiny_aya", "roberta-bpe"}) {
    EXPECT_FALSE(tiny_bpe(name).ok()) << name;
  }
}

// The flags llama.cpp ties to a name (llama_vocab::impl::load), with no add_bos_token key.
TEST(PreTokenizerNames, NamesSetLlamaCppsFlags) {
  struct Case {
    const char* pre;
    bool add_bos;
    int32_t bos_without_key;  // BOS id when the file has no bos_token_id
  };
  for (const Case& c : {Case{"tekken", true, 11}, Case{"llama-bpe", true, 11},
                        Case{"dbrx", false, 11}, Case{"qwen2", false, 11}, Case{"glm4", false, -1},
                        Case{"", false, 11}}) {
    auto tok = tiny_bpe(c.pre);
    ASSERT_TRUE(tok.ok()) << c.pre << ": " << tok.status().to_string();
    EXPECT_EQ((*tok)->add_bos(), c.add_bos) << c.pre;
    EXPECT_EQ((*tok)->bos_id(), 3) << c.pre;
    EXPECT_EQ((*tok)->pre_name(), *c.pre ? c.pre : "default");
    EXPECT_EQ(ids_to_string((*tok)->encode("ab", {.add_bos = false})), "2") << c.pre;
    auto no_key = tiny_bpe(c.pre, false);
    ASSERT_TRUE(no_key.ok());
    EXPECT_EQ((*no_key)->bos_id(), c.bos_without_key) << c.pre;
  }
  // arbor's own patterns replace the named ones but keep the name's flags.
  auto custom = tiny_bpe("tekken", true, {"a"});
  ASSERT_TRUE(custom.ok()) << custom.status().to_string();
  EXPECT_TRUE((*custom)->add_bos());
  EXPECT_EQ(ids_to_string((*custom)->encode("ab", {.add_bos = false})), "0 1");
}

}  // namespace
}  // namespace arbor::tokenizer
