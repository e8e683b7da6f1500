// Report writers: JSON field names and values, the Markdown table, the gnuplot script.
#include "loadgen/report.h"

#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/plan.h"

namespace arbor::loadgen {
namespace {

LoadResult two_request_load() {
  LoadResult l;
  RequestRecord a;
  a.outcome = Outcome::kOk;
  a.ttft_s = 0.010;
  a.e2e_s = 0.030;
  a.itl_s = {0.010, 0.010};
  a.output_tokens = 3;
  a.prompt_tokens = 4;
  RequestRecord b;
  b.outcome = Outcome::kFailed;
  b.error = "HTTP 400: bad";
  RequestRecord c = b;
  l.records = {a, b, c};
  l.duration_s = 0.5;
  l.send_s = {0.0, 0.1, 0.2};
  l.issue_lag_s = {0.001, 0.002, 0.003};
  l.max_in_flight = 2;
  l.connections_opened = 2;
  return l;
}

TEST(Report, RunJsonUsesVllmNamesInMilliseconds) {
  const RunReport r = make_run_report(4.0, 0, {0.0, 0.1, 0.25}, two_request_load(), {});
  EXPECT_DOUBLE_EQ(r.achieved_send_rate, 10.0);  // 2 gaps in 0.2 s
  EXPECT_DOUBLE_EQ(r.scheduled_rate, 8.0);       // 2 gaps in 0.25 s
  ASSERT_EQ(r.first_errors.size(), 1u);          // duplicates folded
  EXPECT_EQ(r.first_errors[0], "HTTP 400: bad");
  const nlohmann::json j = run_json(r);
  EXPECT_EQ(j["request_rate"], 4.0);
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 2);
  EXPECT_EQ(j["total_output_tokens"], 3);
  EXPECT_DOUBLE_EQ(j["duration"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(j["total_token_throughput"].get<double>(), 14.0);
  EXPECT_DOUBLE_EQ(j["median_ttft_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["mean_tpot_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["p99_itl_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["p90_e2el_ms"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(j["max_issue_lag_ms"].get<double>(), 3.0);
  EXPECT_EQ(j["errors"].size(), 1u);
  const nlohmann::json inf =
      run_json(make_run_report(kInfiniteRate, 8, {0, 0, 0}, two_request_load(), {}));
  EXPECT_EQ(inf["request_rate"], "inf");
  EXPECT_EQ(inf["scheduled_rate"], 0.0);
  EXPECT_EQ(inf["max_concurrency"], 8);
}

TEST(Report, MarkdownTableHasOneRowPerRun) {
  SloSpec slos;
  slos.ttft_ms = 100;
  const std::vector<RunReport> runs = {
      make_run_report(1, 0, {}, two_request_load(), slos),
      make_run_report(kInfiniteRate, 4, {}, two_request_load(), slos)};
  const std::string t = markdown_table(runs, slos);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 4);  // header, rule, 2 rows
  EXPECT_NE(t.find("| 1 | 10.0 | 1 | 2 / 0 | 0.50 | 2.00 | 6.0 | 10.0 / 10.0 |"), std::string::npos)
      << t;
  EXPECT_NE(t.find("| inf (max 4) |"), std::string::npos) << t;
  EXPECT_NE(t.find("goodput"), std::string::npos);
  EXPECT_EQ(markdown_table(runs, {}).find("goodput"), std::string::npos);
}

TEST(Report, GnuplotScriptPlotsInfRightOfTheHighestRate) {
  const std::vector<RunReport> runs = {
      make_run_report(kInfiniteRate, 0, {}, two_request_load(), {}),
      make_run_report(1, 0, {}, two_request_load(), {}),
      make_run_report(16, 0, {}, two_request_load(), {})};
  const std::string s = gnuplot_script(runs, "/tmp/x");
  EXPECT_NE(s.find("set output '/tmp/x.svg'"), std::string::npos);
  EXPECT_NE(s.find("set output '/tmp/x.png'"), std::string::npos);
  EXPECT_NE(s.find("\"inf\" 32"), std::string::npos) << s;
  // Rows sorted by x: 1, 16, then inf at 32.
  const size_t r1 = s.find("\n1 10 ");
  const size_t r16 = s.find("\n16 10 ");
  const size_t r32 = s.find("\n32 10 ");
  ASSERT_NE(r1, std::string::npos) << s;
  EXPECT_LT(r1, r16);
  EXPECT_LT(r16, r32);
  EXPECT_NE(s.find("title 'TPOT'"), std::string::npos);
}

}  // namespace
}  // namespace arbor::loadgen
