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

}  // namespace
}  // namespace arbor::cli_test
