// arbor bench: the model benchmark runs every test and reports sane figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::cli_test {
namespace {

using test::CommandResult;
using test::run_arbor;

const std::string kModel = test::shared_path(test::kStories260K);

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(test::require_shared_file(test::kStories260K)); }
};

TEST_F(BenchTest, JsonHasEveryTestWithOrderedStatistics) {
  CommandResult r = run_arbor("bench -m " + kModel +
                                  " -t 1 -r 3 -p 32 -n 8 --batch 1,3 --batch-steps 4"
                                  " --bandwidth-mib 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GT(j["bandwidth_gbs"].get<double>(), 0.1);
  EXPECT_EQ(j["threads"], 1);
  const std::vector<std::string> names = {"pp32", "tg8", "batch 1", "batch 3"};
  const std::vector<int> tokens = {32, 8, 4, 12};
  ASSERT_EQ(j["tests"].size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& t = j["tests"][i];
    EXPECT_EQ(t["name"], names[i]);
    EXPECT_EQ(t["tokens"], tokens[i]);
    EXPECT_EQ(t["tokens_per_second"].size(), 3u);
    EXPECT_GT(t["min"].get<double>(), 0.0);
    EXPECT_LE(t["min"].get<double>(), t["median"].get<double>());
    EXPECT_LE(t["median"].get<double>(), t["max"].get<double>());
  }
  // The default verification curve: K = 0 (the 1-token step, cost 1) then K = 1..16, each with
  // its K + 1 tokens per step and one time per round.
  ASSERT_EQ(j["verify"].size(), 17u);
  for (int k = 0; k <= 16; ++k) {
    const nlohmann::json& v = j["verify"][k];
    EXPECT_EQ(v["name"], "verify " + std::to_string(k));
    EXPECT_EQ(v["tokens_per_step"], k + 1);
    EXPECT_EQ(v["seconds_per_step"].size(), 3u);
    EXPECT_GT(v["median_seconds"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["verify"][0]["cost_vs_decode_step"].get<double>(), 1.0);
  // Decode tests read at least every weight once per step: stories260K holds ~1 MB of f32.
  EXPECT_EQ(j["tests"][0]["bytes_per_step"].get<double>(), 0.0);
  EXPECT_GT(j["tests"][1]["bytes_per_step"].get<double>(), 0.9e6);
}

TEST_F(BenchTest, TablePrintsAndArgumentsAreChecked) {
  CommandResult r = run_arbor("bench -m " + kModel + " -t 1 -r 1 -p 16 -n 4 --batch 2 "
                                  "--batch-steps 2 --bandwidth-mib 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| pp16 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| batch 2 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read bandwidth:"), std::string::npos) << r.out;
  r = run_arbor("bench -m " + kModel + " -t 1 -r 1 -p 16 -n 4 --batch 1 --batch-steps 2 "
                "--bandwidth-mib 16 --verify 2,5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| verify 0     |           1 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| verify 5     |           6 |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("| verify 4 "), std::string::npos) << r.out;
  r = run_arbor("bench -m " + kModel + " --verify 65");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--verify entry 65 must be in [1, 64]"), std::string::npos) << r.err;
  r = run_arbor("bench");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs -m MODEL"), std::string::npos) << r.err;
  r = run_arbor("bench -m " + kModel + " -p 4096");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("needs 4096 positions; the model's context_length is 2048"),
            std::string::npos) << r.err;
  r = run_arbor("bench -m " + kModel + " --batch 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--batch entry 0 must be in [1, 256]"), std::string::npos) << r.err;
}

// The measurement: a Gemma 3 shape at 32k context holds at most a quarter of the KV
// bytes of a full-attention layout. The block counts follow from the windows alone: the full
// group holds every block of 32768 tokens (2048 of 16), each sliding group the blocks of the
// last W - 1 positions (511 / 1023 of them: 32 / 64 blocks of 16, 511 / 1023 blocks of 1).
TEST(BenchKvLayoutTest, Gemma3At32kHoldsUnderAQuarterOfFullAttention) {
  for (int bs : {16, 1}) {
    CommandResult r = run_arbor("bench kv-layout --block-size " + std::to_string(bs) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    ASSERT_EQ(j["shapes"].size(), 2u);
    const nlohmann::json& g1 = j["shapes"][0];
    const nlohmann::json& g4 = j["shapes"][1];
    EXPECT_EQ(g1["name"], "gemma3-1b");
    // 4 full layers, 22 sliding in 6 groups of at most 4 (4 pools).
    EXPECT_EQ(g1["groups"], 7);
    EXPECT_EQ(g1["pools"], 4);
    const int64_t full_blocks = 32768 / bs;
    const int64_t w1 = (511 + bs - 1) / bs, w4 = (1023 + bs - 1) / bs;
    EXPECT_EQ(g1["blocks"].get<int64_t>(), full_blocks + 6 * w1);
    EXPECT_EQ(g1["bytes_per_block"].get<int64_t>(), int64_t{4} * 2 * 1 * 256 * 2 * bs);
    EXPECT_EQ(g1["full_attention_bytes"].get<int64_t>(), int64_t{32768} * 26 * 2 * 1 * 256 * 2);
    EXPECT_EQ(g4["groups"], 7);
    EXPECT_EQ(g4["pools"], 5);
    EXPECT_EQ(g4["blocks"].get<int64_t>(), full_blocks + 6 * w4);
    EXPECT_EQ(g4["full_attention_bytes"].get<int64_t>(), int64_t{32768} * 34 * 2 * 4 * 256 * 2);
    for (const nlohmann::json* g : {&g1, &g4}) {
      EXPECT_EQ((*g)["kv_bytes"].get<int64_t>(),
                (*g)["blocks"].get<int64_t>() * (*g)["bytes_per_block"].get<int64_t>());
      EXPECT_LE((*g)["ratio"].get<double>(), 0.25) << (*g)["name"];
      EXPECT_GT((*g)["ratio"].get<double>(), 0.15) << (*g)["name"];
    }
  }
  // -m: a file's own layers. A 12-layer Gemma 3 (layers 5 and 11 global, window 64, head_dim
  // 32, 1 KV head): 2 full + 10 sliding layers in 5 groups of 2 (2 pools); at 1024 tokens the
  // full group holds 64 blocks of 16, each sliding group ceil(63 / 16) = 4.
  test::TempDir dir("bench_kv_layout");
  const std::string file = dir / "gemma3.gguf";
  CommandResult synth = run_arbor(
      "synth --shape custom --arch gemma3 --dim 64 --ffn 128 --layers 12 --heads 2 --kv-heads 1 "
      "--head-dim 32 --window 64 --context 2048 --type f32 --vocab " + kModel + " -o " + file);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  CommandResult m = run_arbor("bench kv-layout -m " + file + " --context 1024 --json");
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const nlohmann::json jm = nlohmann::json::parse(m.out, nullptr, false);
  ASSERT_TRUE(jm.is_object()) << m.out;
  const nlohmann::json& g = jm["shapes"][0];
  EXPECT_EQ(g["name"], "gemma3");
  EXPECT_EQ(g["groups"], 6);
  EXPECT_EQ(g["pools"], 2);
  EXPECT_EQ(g["group_blocks"], (std::vector<int>{64, 4, 4, 4, 4, 4}));
  EXPECT_EQ(g["bytes_per_block"].get<int64_t>(), int64_t{2} * 2 * 1 * 32 * 2 * 16);
  EXPECT_DOUBLE_EQ(g["ratio"].get<double>(), 84.0 * 2 / (64.0 * 12));

  CommandResult bad = run_arbor("bench kv-layout --shape gemma9");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown shape 'gemma9' (known: gemma3-12b, gemma3-1b"), std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace arbor::cli_test
