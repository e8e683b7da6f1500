// OutputProcessor on its own: several tokens per sample per step, a stop string inside a step's
// run (reported once, later tokens dropped), the text of EOS/stop-id tokens withheld, best_of
// ranking, aborts, usage with speculation counters, metrics.
#include <gtest/gtest.h>

#include "engine/output_processor.h"
#include "engine_test_util.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {
namespace {

struct Fixture {
  Fixture() {
    auto t = tokenizer::Tokenizer::from_file(testing::stories260k_path());
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    tok = std::move(*t);
    processor = std::make_unique<OutputProcessor>(
        tok.get(), metrics, [this](const std::string& name) { finals.push_back(name); });
  }
  std::shared_ptr<RequestStream> add(sched::RequestId id, int32_t n, int32_t best_of,
                                     std::vector<std::string> stop = {}) {
    OutputGroupSpec spec;
    spec.id = id;
    spec.name = "r" + std::to_string(id);
    spec.stream = std::make_shared<RequestStream>(spec.name);
    spec.n = n;
    spec.best_of = best_of;
    spec.logprobs = true;
    spec.stop = std::move(stop);
    spec.prompt_tail = tok->encode("Once upon a time", {.add_bos = true});
    spec.num_prompt_tokens = static_cast<int64_t>(spec.prompt_tail.size());
    processor->add(spec);
    return spec.stream;
  }
  // The ids of " " + `text` (SentencePiece's dummy prefix adds the space; no BOS), as the model
  // would emit them mid-text.
  std::vector<int32_t> ids(const std::string& text) const {
    return tok->encode(text, {.add_bos = false});
  }
  static sched::RequestOutput output(sched::RequestId id, const std::vector<int32_t>& tokens,
                                     double logprob = -0.5) {
    sched::RequestOutput o;
    o.request_id = id;
    for (int32_t t : tokens) o.new_tokens.push_back({.token_id = t, .logprob = static_cast<float>(logprob)});
    return o;
  }
  std::vector<StreamEvent> drain(RequestStream& s) {
    std::vector<StreamEvent> out;
    while (std::optional<StreamEvent> e = s.try_next()) out.push_back(std::move(*e));
    return out;
  }

  std::unique_ptr<tokenizer::Tokenizer> tok;
  EngineMetricsSnapshot metrics;
  std::vector<std::string> finals;
  std::unique_ptr<OutputProcessor> processor;
};

TEST(OutputProcessor, SeveralTokensPerStepAndAStopStringInsideTheRun) {
  Fixture f;
  auto s = f.add(1, 1, 1, {" park"});
  const std::vector<int32_t> a = f.ids("there was a little girl");
  const std::vector<int32_t> b = f.ids("who went to the park and played");
  sched::RequestOutput o1 = Fixture::output(1, a);
  o1.num_draft_tokens = 4;
  o1.num_accepted_tokens = static_cast<int32_t>(a.size()) - 1;
  EXPECT_FALSE(f.processor->process(o1, 1.0).has_value());
  // The whole second run is committed by the scheduler, but the stop string ends it early.
  const std::optional<sched::StopReason> stop = f.processor->process(Fixture::output(1, b), 2.0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(*stop, (sched::StopReason{.kind = sched::StopKind::kStopString, .stop_string = " park"}));
  const std::vector<StreamEvent> ev = f.drain(*s);
  ASSERT_EQ(ev.size(), 3u);  // run 1, run 2 (final sample event), the request's final event
  EXPECT_EQ(ev[0].token_ids, a);
  EXPECT_EQ(ev[0].logprobs.size(), a.size());
  EXPECT_EQ(ev[0].text + ev[1].text, " there was a little girl who went to the");
  EXPECT_EQ(ev[1].stop_reason, stop);
  EXPECT_LT(ev[1].token_ids.size(), b.size()) << "tokens after the stop string are not emitted";
  EXPECT_TRUE(ev[2].final);
  EXPECT_EQ(ev[2].usage.completion_tokens,
            static_cast<int64_t>(a.size() + ev[1].token_ids.size()));
  EXPECT_EQ(ev[2].usage.draft_tokens, 4);
  EXPECT_EQ(ev[2].usage.accepted_draft_tokens, static_cast<int64_t>(a.size()) - 1);
  EXPECT_EQ(f.finals, std::vector<std::string>{"r1"});
  EXPECT_EQ(f.metrics.num_generation_tokens,
            static_cast<int64_t>(a.size() + ev[1].token_ids.size()));
}

TEST(OutputProcessor, TheStopTokensTextIsWithheld) {
  Fixture f;
  auto s = f.add(2, 1, 1);
  std::vector<int32_t> run = f.ids("the end");
  const int32_t eos = f.tok->eos_id();
  run.push_back(eos);
  sched::RequestOutput o = Fixture::output(2, run);
  o.stop_reason = sched::StopReason{.kind = sched::StopKind::kEos, .token_id = eos};
  EXPECT_FALSE(f.processor->process(o, 1.0).has_value()) << "the scheduler already decided";
  const std::vector<StreamEvent> ev = f.drain(*s);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].token_ids, run) << "the stop token is reported";
  EXPECT_EQ(ev[0].text, " the end") << "but its text is not";
  EXPECT_EQ(ev[0].stop_reason, o.stop_reason);
  EXPECT_EQ(ev[0].finish_reason(), sched::FinishReason::kStop);
}

TEST(OutputProcessor, BestOfSendsTheNMostLikelySamplesAtTheEnd) {
  Fixture f;
  auto s = f.add(3, 2, 3);
  const double logprobs[3] = {-3.0, -1.0, -2.0};
  for (int32_t i = 0; i < 3; ++i) {
    sched::RequestOutput o = Fixture::output(sched::child_request_id(3, i), f.ids("cat"), logprobs[i]);
    o.parent_id = 3;
    o.sample_index = i;
    o.stop_reason = sched::StopReason{.kind = sched::StopKind::kMaxTokens};
    EXPECT_FALSE(f.processor->process(o, 1.0).has_value());
    if (i < 2) EXPECT_TRUE(f.drain(*s).empty()) << "nothing streams with best_of > n";
  }
  const std::vector<StreamEvent> ev = f.drain(*s);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].index, 0);
  EXPECT_EQ(ev[1].index, 1);
  const size_t num = f.ids("cat").size();
  EXPECT_DOUBLE_EQ(ev[0].cumulative_logprob, -1.0 * num) << "sample 1 is the most likely";
  EXPECT_DOUBLE_EQ(ev[1].cumulative_logprob, -2.0 * num) << "then sample 2";
  EXPECT_EQ(ev[0].text, " cat");
  EXPECT_TRUE(ev[2].final);
  EXPECT_EQ(ev[2].usage.completion_tokens, static_cast<int64_t>(3 * num));
}

TEST(OutputProcessor, AbortEndsEveryUnfinishedSampleOnce) {
  Fixture f;
  auto s = f.add(4, 2, 2);
  sched::RequestOutput done = Fixture::output(sched::child_request_id(4, 0), f.ids("a"));
  done.parent_id = 4;
  done.stop_reason = sched::StopReason{.kind = sched::StopKind::kMaxTokens};
  f.processor->process(done, 1.0);
  f.processor->abort(4);
  const std::vector<StreamEvent> ev = f.drain(*s);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].stop_reason->kind, sched::StopKind::kMaxTokens);
  EXPECT_EQ(ev[1].index, 1);
  EXPECT_EQ(ev[1].stop_reason->kind, sched::StopKind::kAbort);
  EXPECT_TRUE(ev[2].final);
  EXPECT_FALSE(f.processor->contains(4));
  EXPECT_FALSE(f.processor->find("r4").has_value());
}

}  // namespace
}  // namespace arbor::engine
