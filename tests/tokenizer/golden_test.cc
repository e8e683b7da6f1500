// Encodings and decodings pinned by the model goldens in shared/goldens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "test_util.h"

namespace arbor::tokenizer {
namespace {

using testing::ids_to_string;
using testing::shared_path;

nlohmann::json load_golden(const std::string& rel) {
  EXPECT_TRUE(::arbor::test::require_shared_file(rel));
  auto text = read_file(shared_path(rel));
  if (!text.ok()) return nlohmann::json();
  return nlohmann::json::parse(*text);
}

// stories260K (llama2.c run.c): BOS, then the prompt with SentencePiece's dummy prefix;
// ids_after_bos starts with the prompt's tokens, and `text` decodes all of ids_after_bos.
TEST(Stories260K, PromptsEncodeAndGenerationsDecode) {
  ARBOR_TOKENIZER_OR_FAIL(tok, "models/stories260K/stories260K.gguf");
  const nlohmann::json golden = load_golden("goldens/stories260K_greedy.json");
  ASSERT_TRUE(golden.contains("cases"));
  ASSERT_EQ(tok->bos_id(), 1);
  ASSERT_EQ(tok->vocab_size(), 512);
  for (const auto& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt");
    const auto after_bos = c.at("ids_after_bos").get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tok->encode(prompt);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), 1) << prompt;
    const std::vector<int32_t> prompt_ids(ids.begin() + 1, ids.end());
    ASSERT_LE(prompt_ids.size(), after_bos.size());
    EXPECT_EQ(ids_to_string(prompt_ids),
              ids_to_string({after_bos.begin(), after_bos.begin() + prompt_ids.size()}))
        << prompt;
    if (!prompt.empty()) {
      EXPECT_GE(prompt_ids.size(), 2u) << prompt;
    }
    EXPECT_EQ(tok->decode(after_bos), c.at("text").get<std::string>()) << prompt;
    // With BOS in front the text is the same: BOS is skipped and the dummy prefix still goes.
    std::vector<int32_t> with_bos = {1};
    with_bos.insert(with_bos.end(), after_bos.begin(), after_bos.end());
    EXPECT_EQ(tok->decode(with_bos), c.at("text").get<std::string>()) << prompt;
  }
  // Exact ids for the first prompt, independent of the golden's prefix rule.
  EXPECT_EQ(ids_to_string(tok->encode("Once upon a time")), "1 403 407 261 378");
}

// TinyStories-656K: the tokenizer.json (BPE + SentencePiece-style normaliser) and the GGUF's
// embedded vocabulary (SentencePiece scores, all -1000) both give the golden prompt ids.
class TinyStories : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyStories, PromptIdsMatchGolden) {
  ARBOR_TOKENIZER_OR_FAIL(tok, GetParam());
  const nlohmann::json golden = load_golden("goldens/tinystories656K_greedy.json");
  ASSERT_TRUE(golden.contains("cases"));
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->is_eog(2));
  for (const auto& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt");
    EXPECT_EQ(ids_to_string(tok->encode(prompt)),
              ids_to_string(c.at("prompt_ids").get<std::vector<int32_t>>()))
        << prompt;
    // The golden's text keeps the dummy-prefix space; decode() drops it, as HF's Strip does.
    std::string text = c.at("text");
    ASSERT_FALSE(text.empty());
    std::string decoded = " ";
    decoded += tok->decode(c.at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(decoded, text) << prompt;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, TinyStories,
                         ::testing::Values("models/tinystories-656K/tokenizer.json",
                                           "models/tinystories-656K/TinyStories-656K-Q8_0.gguf"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Json" : "Gguf");
                         });

}  // namespace
}  // namespace arbor::tokenizer
