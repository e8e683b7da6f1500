// The converted files' tokenizers encode exactly like the reference GGUF files' tokenizers
// (both loaded through the tokenizer module).
#include <gtest/gtest.h>

#include <filesystem>

#include "convert/hf.h"
#include "convert/llama2c.h"
#include "convert/model_plan.h"
#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace arbor::convert {
namespace {

const char* const kTexts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the sun.",
    "One day, she saw a big, red ball in the park.",
    "\"Can I play with you?\" asked Ben.",
    "Tim's dog was happy. The end.",
    "  two leading spaces",
    "trailing spaces   ",
    "line one\nline two\n\nline four",
    "tab\tseparated\twords",
    "1234567890 3.14159 42",
    "!!!???...,,,",
    "unbelievable extraordinary incomprehensible",
    "a",
    " ",
    "",
    "x y z",
    "The cat sat on the mat. It was very happy!",
    "café naïve résumé",
    "日本語のテキスト",
    "emoji 🎉🐶 here",
    "mixed CASE Words And Names Like Max",
    "He said: 'no, no, no'.",
    "dog named Max said.\nBut then, ",
    "<s>not special</s>",
    "<|start_story|>Once upon",
    "<unk> literally",
    "under_score and-dash and/slash",
    "ALLCAPS SHOUTING",
    "Lily and Ben played together all day long.",
    "they were best friends forever",
    "Mom, can we go to the park?",
    "wow!!! so fun",
    "    ",
    "end.",
    "The sun was shining and the birds were singing.",
    "zzz qqq xxx",
};

void expect_same_encodings(const std::string& ours_path, const std::string& ref_path) {
  auto ours_file = gguf::GgufFile::open(ours_path);
  auto ref_file = gguf::GgufFile::open(ref_path);
  ASSERT_TRUE(ours_file.ok() && ref_file.ok());
  auto ours = tokenizer::Tokenizer::from_gguf(*ours_file);
  auto ref = tokenizer::Tokenizer::from_gguf(*ref_file);
  ASSERT_TRUE(ours.ok()) << ours.status().to_string();
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  size_t total = 0;
  for (const char* text : kTexts) {
    const auto want = (*ref)->encode(text);
    EXPECT_EQ((*ours)->encode(text), want) << "'" << text << "'";
    tokenizer::EncodeOptions special;
    special.parse_special = true;
    EXPECT_EQ((*ours)->encode(text, special), (*ref)->encode(text, special)) << "'" << text << "'";
    total += want.size();
  }
  EXPECT_GT(total, 200u);  // the texts really exercise the vocabulary
}

TEST(TokenizerParityTest, TinyStoriesHfConversionEncodesLikeReference) {
  ASSERT_TRUE(test::require_shared_file("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"));
  const std::string dir = test::shared_path("models/tinystories-656K");
  auto model = load_hf(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::string path = testing::temp_path("tinystories_tok_parity.gguf");
  ASSERT_TRUE(write_plan(model->plan, OutputType{}, path).ok());
  expect_same_encodings(path, dir + "/TinyStories-656K-Q8_0.gguf");
}

TEST(TokenizerParityTest, Stories260KLlama2cConversionEncodesLikeReference) {
  ASSERT_TRUE(test::require_shared_file("models/stories260K/stories260K.gguf"));
  const std::string dir = test::shared_path("models/stories260K") + "/";
  auto model = load_llama2c(dir + "stories260K.bin", dir + "tok512.bin");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::string path = testing::temp_path("stories260K_tok_parity.gguf");
  ASSERT_TRUE(write_plan(model->plan, OutputType{}, path).ok());
  expect_same_encodings(path, dir + "stories260K.gguf");
}

}  // namespace
}  // namespace arbor::convert
