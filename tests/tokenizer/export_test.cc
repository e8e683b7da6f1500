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

}  // namespace
}  // namespace arbor::tokenizer
