// arbor generate: greedy output against llama2.c's reference ids, seeded sampling, --json.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::cli_test {
namespace {

using test::CommandResult;
using test::read_file;
using test::run_arbor;

const std::string kModel = test::shared_path(test::kStories260K);
const std::string kGolden = test::shared_path("goldens/stories260K_greedy.json");

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    ASSERT_TRUE(test::require_shared_file("goldens/stories260K_greedy.json"));
  }

  nlohmann::json generate_json(const std::string& prompt, const std::string& flags) {
    CommandResult r = run_arbor("generate -m " + kModel + " -p '" + prompt + "' --json " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }
};

// The golden's ids_after_bos holds the prompt then the generated ids; "steps" counts positions.
// It was made by llama2.c, which stops when it samples BOS (1); stories260K's vocabulary has
// EOS 2 and the path holds neither, so -n equal to the generated count reproduces it whole.
TEST_F(GenerateTest, GreedyMatchesLlama2cGoldenForFirstCase) {
  const nlohmann::json golden = nlohmann::json::parse(read_file(kGolden));
  const nlohmann::json& c = golden["cases"][0];
  const std::vector<int32_t> expected = c["ids_after_bos"].get<std::vector<int32_t>>();
  const std::string prompt = c["prompt"];
  ASSERT_EQ(prompt, "Once upon a time");
  const std::vector<int32_t> prompt_ids = {1, 403, 407, 261, 378};  // BOS + 4 prompt tokens
  ASSERT_EQ(std::vector<int32_t>(expected.begin(), expected.begin() + 4),
            std::vector<int32_t>(prompt_ids.begin() + 1, prompt_ids.end()));
  const int n = static_cast<int>(expected.size()) - 4;
  const nlohmann::json out =
      generate_json(prompt, "-n " + std::to_string(n) + " --temp 0 --threads 1");
  ASSERT_TRUE(out.is_object());
  EXPECT_EQ(out["prompt_ids"].get<std::vector<int32_t>>(), prompt_ids);
  EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(expected.begin() + 4, expected.end()));
  const std::string text = c["text"];
  EXPECT_EQ(out["text"].get<std::string>(), text.substr(prompt.size()));
  EXPECT_EQ(out["stop_reason"], "length");
  EXPECT_GT(out["timings"]["generation_tokens_per_second"].get<double>(), 0.0);
}

// Every golden case (an empty prompt; paths that llama2.c ended early on BOS, which the exact -n
// reproduces): BOS + prompt + generated ids equal the reference.
TEST_F(GenerateTest, GreedyMatchesLlama2cGoldenForEveryCase) {
  const nlohmann::json golden = nlohmann::json::parse(read_file(kGolden));
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string prompt = c["prompt"];
    const std::vector<int32_t> expected = c["ids_after_bos"].get<std::vector<int32_t>>();
    const nlohmann::json probe = generate_json(prompt, "-n 1 --temp 0 --threads 1");
    ASSERT_TRUE(probe.is_object()) << prompt;
    std::vector<int32_t> ids = probe["prompt_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(ids.front(), 1) << prompt;
    const int n = static_cast<int>(expected.size() + 1 - ids.size());
    const nlohmann::json out =
        generate_json(prompt, "-n " + std::to_string(n) + " --temp 0 --threads 1");
    const std::vector<int32_t> generated = out["ids"].get<std::vector<int32_t>>();
    ids.insert(ids.end(), generated.begin(), generated.end());
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), expected) << prompt;
  }
}

// llama2.c stops when the model samples BOS; so does arbor generate (stop_reason "bos"), and
// --ignore-eos goes on past it.
TEST_F(GenerateTest, StopsAtBosLikeTheReferenceUnlessIgnoreEos) {
  const nlohmann::json golden = nlohmann::json::parse(read_file(kGolden));
  const nlohmann::json& c = golden["cases"][2];
  ASSERT_EQ(c["prompt"], "The cat");
  const std::vector<int32_t> expected = c["ids_after_bos"].get<std::vector<int32_t>>();
  ASSERT_LT(expected.size() + 1, c["steps"].get<size_t>());  // the reference stopped early
  nlohmann::json out = generate_json("The cat", "-n 400 --temp 0 --threads 1");
  EXPECT_EQ(out["stop_reason"], "bos");
  std::vector<int32_t> ids = out["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> generated = out["ids"].get<std::vector<int32_t>>();
  ids.insert(ids.end(), generated.begin(), generated.end());
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), expected);
  out = generate_json("The cat", "-n 400 --temp 0 --threads 1 --ignore-eos");
  EXPECT_EQ(out["stop_reason"], "length");
  EXPECT_EQ(out["ids"].size(), 400u);
}

// generate runs the serving engine and takes its flags: prefill in chunks of 3 tokens over KV
// blocks of 4 still gives the reference's greedy ids.
TEST_F(GenerateTest, EngineFlagsApplyAndKeepTheGreedyPath) {
  const nlohmann::json golden = nlohmann::json::parse(read_file(kGolden));
  const nlohmann::json& c = golden["cases"][0];
  const std::vector<int32_t> expected = c["ids_after_bos"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(expected.size()) - 4;
  const nlohmann::json out = generate_json(
      c["prompt"], "-n " + std::to_string(n) +
                       " --temp 0 --threads 1 --max-num-batched-tokens 3 --block-size 4");
  ASSERT_TRUE(out.is_object());
  EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(expected.begin() + 4, expected.end()));
  EXPECT_EQ(out["timings"]["decode_forwards"], n - 1);
}

TEST_F(GenerateTest, SeededSamplingIsReproducibleAndSeedMatters) {
  const std::string flags = "-n 40 --temp 1.0 --top-k 0 --top-p 1 --min-p 0 --ignore-eos ";
  auto a = generate_json("Once upon a time", flags + "--seed 11");
  auto b = generate_json("Once upon a time", flags + "--seed 11 --threads 1");
  auto c = generate_json("Once upon a time", flags + "--seed 12");
  ASSERT_TRUE(a.is_object() && b.is_object() && c.is_object());
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_NE(a["ids"], c["ids"]);
  EXPECT_EQ(a["ids"].size(), 40u);
}

TEST_F(GenerateTest, StreamsPromptAndTextToStdoutAndTimingsToStderr) {
  CommandResult r = run_arbor("generate -m " + kModel + " -p 'Once upon a time' -n 8 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("prompt:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generation: 8 tokens"), std::string::npos) << r.err;
}

TEST_F(GenerateTest, BadArgumentsNameTheLimit) {
  CommandResult r = run_arbor("generate -m " + kModel + " -p 'Hi' -n 5000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("max_model_len is 2048"), std::string::npos) << r.err;
  // The engine's --max-model-len is the limit when it is lower.
  r = run_arbor("generate -m " + kModel + " -p 'Hi' -n 100 --max-model-len 64");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-n asks for 100 more; max_model_len is 64"), std::string::npos) << r.err;
  r = run_arbor("generate -m " + kModel + " -p 'Hi' --top-p 1.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("top_p is 1.5, must be in (0, 1]"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace arbor::cli_test
