// default_stop_token_ids: eog ids plus BOS, on a llama2.c vocabulary (BOS 1, EOS 2), on Llama 3
// (BOS and several end-of-turn markers) and on Qwen3 (no BOS at all).
#include "engine/stop_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "engine_test_util.h"

namespace arbor::engine {
namespace {

std::unique_ptr<tokenizer::Tokenizer> load(const std::string& rel) {
  if (!::arbor::test::expect_shared_file(rel)) return nullptr;  // fails, naming the path
  const std::string path = ::arbor::test::shared_path(rel);
  auto tok = tokenizer::Tokenizer::from_file(path);
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(StopRules, Llama2cVocabularyStopsAtBosAndEos) {
  auto tok = tokenizer::Tokenizer::from_file(testing::stories260k_path());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  ASSERT_EQ((*tok)->bos_id(), 1);
  ASSERT_EQ((*tok)->eog_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(default_stop_token_ids(**tok), (std::vector<int32_t>{1, 2}));
}

TEST(StopRules, Llama3AddsBosToEveryEndOfTurnMarker) {
  auto tok = load("tokenizers/hf/llama3/tokenizer.json");
  if (tok == nullptr) GTEST_SKIP() << "shared data missing";
  const int32_t bos = tok->token_id("<|begin_of_text|>");
  ASSERT_EQ(tok->bos_id(), bos);
  std::vector<int32_t> expected = tok->eog_ids();
  ASSERT_GE(expected.size(), 2u);  // <|end_of_text|>, <|eot_id|>, ...
  ASSERT_TRUE(std::find(expected.begin(), expected.end(), bos) == expected.end());
  expected.push_back(bos);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(default_stop_token_ids(*tok), expected);
}

TEST(StopRules, NoBosMeansExactlyTheEogIds) {
  auto tok = load("tokenizers/hf/qwen3/tokenizer.json");
  if (tok == nullptr) GTEST_SKIP() << "shared data missing";
  ASSERT_EQ(tok->bos_id(), -1);
  ASSERT_FALSE(tok->eog_ids().empty());
  EXPECT_EQ(default_stop_token_ids(*tok), tok->eog_ids());
}

}  // namespace
}  // namespace arbor::engine
