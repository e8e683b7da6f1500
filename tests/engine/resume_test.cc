// GenerateRequest::resume (the router's failover, docs/router.md): a sample resumed after any
// number k of its tokens continues with exactly the tokens, text, finish reason, usage and
// cumulative logprob of the run that was never interrupted, greedy and seeded, with penalties
// and stop strings, and while other requests share the batch. Bad resumptions are refused.
#include <gtest/gtest.h>

#include <random>

#include "batched_equals_alone.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {
namespace {

using testing::Collected;
using testing::drain;

// One sample's events, kept per event so a test can cut the stream after any token.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::string> text_after;  // [tokens + 1] text received after the first i tokens
  std::vector<double> logprob_after;    // [tokens + 1] cumulative logprob after i tokens
  std::string text;
  std::optional<sched::StopReason> stop;
  StreamEvent final_event;
};

Trace trace(RequestStream& stream) {
  Trace t;
  t.text_after.push_back("");
  t.logprob_after.push_back(0.0);
  while (std::optional<StreamEvent> e = stream.next()) {
    if (e->final) {
      t.final_event = std::move(*e);
      break;
    }
    // Without speculation every event carries one token (or none, on a stop-string finish).
    EXPECT_LE(e->token_ids.size(), 1u);
    t.text += e->text;
    for (int32_t id : e->token_ids) {
      t.tokens.push_back(id);
      t.text_after.push_back(t.text);
      t.logprob_after.push_back(e->cumulative_logprob);
    }
    if (e->stop_reason) t.stop = e->stop_reason;
  }
  return t;
}

class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::from_file(testing::stories260k_path());
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(*tok);
    testing::RunOptions o = testing::alone_options(256, 512);
    o.cpu.num_threads = 1;
    auto exec = executor::LocalExecutor::load(testing::stories260k_path(), o.cpu);
    ASSERT_TRUE(exec.ok()) << exec.status().to_string();
    EngineCoreConfig cfg;
    cfg.options = o.engine;
    cfg.tokenizer = tok_.get();
    engine_ = std::make_unique<EngineCore>(std::move(*exec), cfg);
  }

  GenerateRequest request(float temperature) const {
    GenerateRequest r;
    r.prompt_token_ids = tok_->encode("Once upon a time, there was a little");
    r.sampling.temperature = temperature;
    r.sampling.seed = 1234;
    r.sampling.logprobs = 0;
    r.max_tokens = 48;
    return r;
  }

  // Resumes `r` after k tokens of `full` and checks the continuation against it.
  void check_resumed(const GenerateRequest& r, const Trace& full, size_t k) {
    GenerateRequest again = r;
    again.resume = ResumeFrom{
        .output_token_ids = std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + k),
        .text_bytes = static_cast<int64_t>(full.text_after[k].size()),
        .cumulative_logprob = full.logprob_after[k]};
    // Another request in the batch must not change the continuation (batch invariance).
    GenerateRequest noise = request(0.8f);
    noise.sampling.seed = 77 + k;
    auto other = engine_->submit(noise);
    auto s = engine_->submit(again);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const Trace rest = trace(**s);
    ASSERT_TRUE(other.ok());
    drain(**other);
    std::vector<int32_t> joined(full.tokens.begin(), full.tokens.begin() + k);
    joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
    EXPECT_EQ(joined, full.tokens) << "resumed after " << k;
    EXPECT_EQ(full.text_after[k] + rest.text, full.text) << "resumed after " << k;
    EXPECT_EQ(rest.stop, full.stop) << "resumed after " << k;
    EXPECT_EQ(rest.final_event.usage.completion_tokens, full.final_event.usage.completion_tokens);
    EXPECT_EQ(rest.final_event.usage.prompt_tokens, full.final_event.usage.prompt_tokens);
    if (!rest.logprob_after.empty() && rest.tokens.size() > 0) {
      EXPECT_EQ(rest.logprob_after.back(), full.logprob_after.back()) << "resumed after " << k;
    }
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<EngineCore> engine_;
};

TEST_F(Resume, GreedyContinuesIdenticallyAfterEveryCut) {
  const GenerateRequest r = request(0.0f);
  const Trace full = trace(**engine_->submit(r));
  ASSERT_GE(full.tokens.size(), 10u);
  for (size_t k = 1; k < full.tokens.size(); ++k) check_resumed(r, full, k);
}

TEST_F(Resume, SeededSamplingWithPenaltiesContinuesIdentically) {
  GenerateRequest r = request(1.0f);
  r.sampling.top_p = 0.9f;
  r.sampling.presence_penalty = 0.7f;
  r.sampling.repetition_penalty = 1.2f;
  r.sampling.min_tokens = 20;
  const Trace full = trace(**engine_->submit(r));
  ASSERT_GE(full.tokens.size(), 20u);
  for (size_t k : {size_t{1}, size_t{2}, size_t{5}, size_t{19}, size_t{20}, full.tokens.size() - 1}) {
    check_resumed(r, full, k);
  }
}

TEST_F(Resume, StopStringAcrossTheCutMatchesAsInOneRun) {
  GenerateRequest r = request(0.0f);
  const Trace plain = trace(**engine_->submit(r));
  ASSERT_GT(plain.text.size(), 40u);
  // A stop string from late in the text: the resumed engine must match it even when it began
  // in tokens the first engine produced (held-back text included).
  const size_t at = plain.text.size() * 2 / 3;
  r.stop = {plain.text.substr(at, 6)};
  const Trace full = trace(**engine_->submit(r));
  ASSERT_TRUE(full.stop.has_value());
  ASSERT_EQ(full.stop->kind, sched::StopKind::kStopString);
  for (size_t k = 1; k < full.tokens.size(); ++k) check_resumed(r, full, k);
}

TEST_F(Resume, RefusesWhatItCannotContinueExactly) {
  const GenerateRequest r = request(1.0f);
  const Trace full = trace(**engine_->submit(r));
  ASSERT_GE(full.tokens.size(), 4u);
  auto resumed = [&](size_t k) {
    GenerateRequest a = r;
    a.resume = ResumeFrom{
        .output_token_ids = std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + k),
        .text_bytes = static_cast<int64_t>(full.text_after[k].size())};
    return a;
  };
  auto error_of = [&](GenerateRequest a) {
    auto s = engine_->submit(std::move(a));
    return s.ok() ? std::string("accepted") : s.status().to_string();
  };
  GenerateRequest unseeded = resumed(3);
  unseeded.sampling.seed.reset();
  EXPECT_NE(error_of(unseeded).find("needs its seed"), std::string::npos);
  GenerateRequest wrong_text = resumed(3);
  wrong_text.resume->text_bytes += 1;
  EXPECT_NE(error_of(wrong_text).find("the client received"), std::string::npos);
  GenerateRequest n2 = resumed(3);
  n2.n = 2;
  EXPECT_NE(error_of(n2).find("n = best_of = 1"), std::string::npos);
  GenerateRequest done = resumed(3);
  done.max_tokens = 3;
  EXPECT_NE(error_of(done).find("nothing is left to generate"), std::string::npos);
  GenerateRequest bad_id = resumed(3);
  bad_id.resume->output_token_ids[1] = 1 << 20;
  bad_id.resume->text_bytes = -1;
  EXPECT_NE(error_of(bad_id).find("resumed token 1"), std::string::npos);
  GenerateRequest stopped = resumed(3);
  stopped.stop = {full.text_after[3].substr(full.text_after[3].size() > 2 ? 1 : 0)};
  EXPECT_NE(error_of(stopped).find("the sample had ended"), std::string::npos);
  engine_->wait_idle();
}

}  // namespace
}  // namespace arbor::engine
