// Request plans, request bodies and seeded arrival processes.
#include "loadgen/plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace arbor::loadgen {
namespace {

using nlohmann::json;

TEST(SyntheticPlan, TokenIdsHaveExactLengthsAndRange) {
  SyntheticOptions o;
  o.num_prompts = 50;
  o.input_len = 33;
  o.output_len = 7;
  o.vocab_size = 40;
  auto plans = synthetic_plan(o);
  ASSERT_TRUE(plans.ok()) << plans.status().message();
  ASSERT_EQ(plans->size(), 50u);
  std::set<int> seen;
  for (const RequestPlan& p : *plans) {
    const json ids = json::parse(p.prompt_json);
    ASSERT_TRUE(ids.is_array());
    EXPECT_EQ(ids.size(), 33u);
    EXPECT_EQ(p.prompt_len, 33);
    EXPECT_EQ(p.max_tokens, 7);
    for (const json& id : ids) {
      EXPECT_GE(id.get<int>(), 3);
      EXPECT_LT(id.get<int>(), 40);
      seen.insert(id.get<int>());
    }
  }
  EXPECT_EQ(seen.size(), 37u);  // 1650 draws over 37 ids reach every one
  // The first prompt differs from the second (no accidental prefix sharing).
  EXPECT_NE((*plans)[0].prompt_json, (*plans)[1].prompt_json);
}

TEST(SyntheticPlan, SeededAndJittered) {
  SyntheticOptions o;
  o.num_prompts = 400;
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.5;
  const auto a = synthetic_plan(o);
  const auto b = synthetic_plan(o);
  o.seed = 1;
  const auto c = synthetic_plan(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)[5].prompt_json, (*b)[5].prompt_json);
  EXPECT_NE((*a)[5].prompt_json, (*c)[5].prompt_json);
  int min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  for (const RequestPlan& p : *a) {
    min_in = std::min<int>(min_in, p.prompt_len);
    max_in = std::max<int>(max_in, p.prompt_len);
    min_out = std::min(min_out, p.max_tokens);
    max_out = std::max(max_out, p.max_tokens);
  }
  EXPECT_EQ(min_in, 50);  // 400 uniform draws over [50, 150] reach both ends
  EXPECT_EQ(max_in, 150);
  EXPECT_EQ(min_out, 10);
  EXPECT_EQ(max_out, 30);
}

TEST(SyntheticPlan, TextPrompts) {
  SyntheticOptions o;
  o.num_prompts = 3;
  o.input_len = 12;
  o.token_ids = false;
  auto plans = synthetic_plan(o);
  ASSERT_TRUE(plans.ok());
  const json s = json::parse((*plans)[0].prompt_json);
  ASSERT_TRUE(s.is_string());
  const std::string text = s.get<std::string>();
  EXPECT_EQ(std::count(text.begin(), text.end(), ' '), 11);
  EXPECT_EQ((*plans)[0].prompt_len, -1);
}

TEST(SyntheticPlan, RejectsBadOptions) {
  SyntheticOptions o;
  o.input_len = 0;
  EXPECT_FALSE(synthetic_plan(o).ok());
  o = {};
  o.range_ratio = 1.0;
  EXPECT_FALSE(synthetic_plan(o).ok());
  o = {};
  o.vocab_size = 3;
  EXPECT_FALSE(synthetic_plan(o).ok());
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/arbor_plan_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    close(fd);
    path_ = tmpl;
    std::ofstream(path_) << text;
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<int32_t> ids_of(const RequestPlan& p) {
  std::vector<int32_t> ids;
  for (const auto& v : nlohmann::json::parse(p.prompt_json)) ids.push_back(v.get<int32_t>());
  return ids;
}

TEST(SharedPrefixPlan, TurnsExtendTheirChatUnderASharedSystemPrompt) {
  SharedPrefixOptions o;
  o.num_system_prompts = 3;
  o.system_prompt_len = 20;
  o.num_users = 7;
  o.turns = 3;
  o.turn_len = 5;
  o.output_len = 4;
  o.vocab_size = 50;
  o.seed = 9;
  auto plans = shared_prefix_plan(o);
  ASSERT_TRUE(plans.ok());
  ASSERT_EQ(plans->size(), 21u);
  // Round t holds every user's turn t (prompt length 20 + 5 (t + 1)); find each user's chat by
  // its prefix chain: turn t + 1 extends exactly one turn-t prompt, by 5 tokens.
  std::vector<std::vector<int32_t>> round0, round1, round2;
  for (size_t i = 0; i < plans->size(); ++i) {
    const std::vector<int32_t> ids = ids_of((*plans)[i]);
    EXPECT_EQ((*plans)[i].prompt_len, static_cast<int64_t>(ids.size()));
    EXPECT_EQ((*plans)[i].max_tokens, 4);
    for (int32_t t : ids) EXPECT_TRUE(t >= 3 && t < 50) << t;
    const size_t round = i / 7;
    EXPECT_EQ(ids.size(), 20u + 5 * (round + 1)) << i;
    (round == 0 ? round0 : round == 1 ? round1 : round2).push_back(ids);
  }
  auto extends = [](const std::vector<int32_t>& longer, const std::vector<int32_t>& shorter) {
    return std::equal(shorter.begin(), shorter.end(), longer.begin());
  };
  for (const auto& [later, earlier] : {std::pair{&round1, &round0}, std::pair{&round2, &round1}}) {
    for (const auto& p : *later) {
      int parents = 0;
      for (const auto& q : *earlier) parents += extends(p, q);
      EXPECT_EQ(parents, 1) << "each turn extends its own chat's previous prompt";
    }
  }
  // Users share one of 3 system prompts (the first 20 tokens): 3 distinct, user counts 3/2/2.
  std::map<std::vector<int32_t>, int> systems;
  for (const auto& p : round0) ++systems[std::vector<int32_t>(p.begin(), p.begin() + 20)];
  ASSERT_EQ(systems.size(), 3u);
  std::vector<int> counts;
  for (const auto& [sys, n] : systems) counts.push_back(n);
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int>{2, 2, 3}));
  // Seeded: the same seed gives the same plan, another seed another.
  auto again = shared_prefix_plan(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[5].prompt_json, (*plans)[5].prompt_json);
  o.seed = 10;
  EXPECT_NE((*shared_prefix_plan(o))[5].prompt_json, (*plans)[5].prompt_json);
  o.turns = 0;
  EXPECT_FALSE(shared_prefix_plan(o).ok());
}

TEST(JsonlPlan, ReadsAndCycles) {
  TempFile f(
      "{\"prompt\": \"Once upon a time\", \"max_tokens\": 5}\n"
      "\n"
      "{\"prompt\": [1, 2, 3]}\n");
  auto plans = load_jsonl_plan(f.path(), 5, 9);
  ASSERT_TRUE(plans.ok()) << plans.status().message();
  ASSERT_EQ(plans->size(), 5u);
  EXPECT_EQ((*plans)[0].prompt_json, "\"Once upon a time\"");
  EXPECT_EQ((*plans)[0].max_tokens, 5);
  EXPECT_EQ((*plans)[0].prompt_len, -1);
  EXPECT_EQ((*plans)[1].prompt_json, "[1,2,3]");
  EXPECT_EQ((*plans)[1].max_tokens, 9);
  EXPECT_EQ((*plans)[1].prompt_len, 3);
  EXPECT_EQ((*plans)[4].prompt_json, (*plans)[0].prompt_json);
}

TEST(JsonlPlan, ErrorsNameTheLine) {
  TempFile f("{\"prompt\": \"ok\"}\n{\"prompt\": 5}\n");
  auto r = load_jsonl_plan(f.path(), 2, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":2:"), std::string::npos) << r.status().message();
  TempFile g("{\"prompt\": \"ok\", \"max_tokens\": 0}\n");
  EXPECT_FALSE(load_jsonl_plan(g.path(), 1, 9).ok());
  TempFile h("not json\n");
  EXPECT_FALSE(load_jsonl_plan(h.path(), 1, 9).ok());
  EXPECT_FALSE(load_jsonl_plan("/nonexistent/p.jsonl", 1, 9).ok());
}

TEST(Arrivals, InfiniteRateSendsAllAtOnce) {
  const auto a = arrival_offsets(5, kInfiniteRate, 1.0, 0);
  EXPECT_EQ(a, std::vector<double>(5, 0.0));
}

struct GapStats {
  double mean = 0, cv = 0, below_mean = 0;
};
GapStats gap_stats(const std::vector<double>& a) {
  std::vector<double> g;
  for (size_t i = 1; i < a.size(); ++i) g.push_back(a[i] - a[i - 1]);
  GapStats s;
  for (double x : g) s.mean += x;
  s.mean /= static_cast<double>(g.size());
  double var = 0;
  for (double x : g) {
    var += (x - s.mean) * (x - s.mean);
    s.below_mean += x < s.mean ? 1 : 0;
  }
  s.cv = std::sqrt(var / static_cast<double>(g.size())) / s.mean;
  s.below_mean /= static_cast<double>(g.size());
  return s;
}

TEST(Arrivals, PoissonProcessStatistics) {
  // 200k exponential gaps at 50 req/s: mean 20 ms (sd of the sample mean 0.045 ms), coefficient
  // of variation 1, P(gap < mean) = 1 - 1/e = 0.632. Seeded, so the run is reproducible; the
  // bounds are ~5 standard errors wide.
  const uint64_t seed = 42;
  const auto a = arrival_offsets(200001, 50.0, 1.0, seed);
  EXPECT_EQ(a[0], 0.0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  const GapStats s = gap_stats(a);
  EXPECT_NEAR(s.mean, 0.02, 0.0003) << "seed " << seed;
  EXPECT_NEAR(s.cv, 1.0, 0.015) << "seed " << seed;
  EXPECT_NEAR(s.below_mean, 1.0 - std::exp(-1.0), 0.006) << "seed " << seed;
  EXPECT_EQ(arrival_offsets(100, 50.0, 1.0, seed), arrival_offsets(100, 50.0, 1.0, seed));
  EXPECT_NE(arrival_offsets(100, 50.0, 1.0, seed), arrival_offsets(100, 50.0, 1.0, seed + 1));
}

TEST(Arrivals, BurstinessIsTheGammaShape) {
  // Shape k: same mean, CV = 1 / sqrt(k).
  const GapStats smooth = gap_stats(arrival_offsets(100001, 10.0, 4.0, 3));
  EXPECT_NEAR(smooth.mean, 0.1, 0.002);
  EXPECT_NEAR(smooth.cv, 0.5, 0.015);
  const GapStats bursty = gap_stats(arrival_offsets(100001, 10.0, 0.25, 3));
  EXPECT_NEAR(bursty.mean, 0.1, 0.005);
  EXPECT_NEAR(bursty.cv, 2.0, 0.08);
}

TEST(RequestBody, CompletionsAndChat) {
  RequestPlan p;
  p.prompt_json = "[5,6,7]";
  p.prompt_len = 3;
  p.max_tokens = 9;
  BodyOptions o;
  o.model = "m";
  auto b = request_body(p, o);
  ASSERT_TRUE(b.ok());
  const json j = json::parse(*b);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], json::array({5, 6, 7}));
  EXPECT_EQ(j["max_tokens"], 9);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["temperature"], 0.0);
  o.chat = true;
  EXPECT_FALSE(request_body(p, o).ok());  // chat needs text
  p.prompt_json = "\"hi \\\"there\\\"\"";
  o.model.clear();
  auto c = request_body(p, o);
  ASSERT_TRUE(c.ok());
  const json k = json::parse(*c);
  EXPECT_FALSE(k.contains("model"));
  EXPECT_EQ(k["messages"][0]["role"], "user");
  EXPECT_EQ(k["messages"][0]["content"], "hi \"there\"");
  EXPECT_EQ(k["max_completion_tokens"], 9);
}

}  // namespace
}  // namespace arbor::loadgen
