// EngineCore over the real CPU executor and stories260K (F32): batched equals alone (small
// variant), seeded n = 4, abort, stop strings.
#include <gtest/gtest.h>

#include <thread>

#include "batched_equals_alone.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {
namespace {

using testing::drain;

TEST(EngineModel, BatchedEqualsAloneSmall) {
  // 12 requests, prompts 1..100, up to 16 new tokens; 12 blocks of 16 force preemption.
  testing::check_batched_equals_alone(12, 100, 16, 12);
}

std::unique_ptr<EngineCore> make_engine(const testing::RunOptions& o,
                                        const tokenizer::Tokenizer* tok = nullptr) {
  auto exec = executor::LocalExecutor::load(testing::stories260k_path(), o.cpu);
  EXPECT_TRUE(exec.ok()) << exec.status().to_string();
  EngineCoreConfig cfg;
  cfg.options = o.engine;
  cfg.tokenizer = tok;
  if (tok == nullptr) cfg.eos_token_ids = std::vector<int32_t>{};
  return std::make_unique<EngineCore>(std::move(*exec), cfg);
}

GenerateRequest sampled_request(uint64_t seed, int32_t n) {
  std::mt19937_64 rng(7);
  GenerateRequest r;
  r.prompt_token_ids = testing::random_prompt(rng, 45, 512);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.n = n;
  r.max_tokens = 24;
  return r;
}

TEST(EngineModel, SeededNEquals4IsReproducible) {
  testing::RunOptions o = testing::alone_options(256, 256);
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (int run = 0; run < 2; ++run) {
    auto engine = make_engine(o);
    // A second, unrelated request in the batch must not change the samples.
    auto noise = engine->submit(sampled_request(run + 100, 1));
    auto s = engine->submit(sampled_request(5, 4));
    ASSERT_TRUE(s.ok());
    runs.push_back(drain(**s, 4).token_ids);
    drain(**noise);
  }
  EXPECT_EQ(runs[0], runs[1]);
  int distinct = 0;
  for (int i = 1; i < 4; ++i) distinct += runs[0][i] != runs[0][0];
  EXPECT_GT(distinct, 0) << "samples share one Rng stream";
}

TEST(EngineModel, AbortMidGenerationReturnsEveryBlock) {
  testing::RunOptions o = testing::alone_options(64, 128);
  auto engine = make_engine(o);
  const int32_t free_at_start = engine->num_free_blocks();
  GenerateRequest r = sampled_request(3, 4);
  r.max_tokens = 400;
  r.request_id = "long";
  auto s = engine->submit(std::move(r));
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE((*s)->next().has_value());
  engine->abort("long");
  const testing::Collected c = drain(**s, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.finish[i], sched::FinishReason::kAbort);
  engine->wait_idle();
  for (int i = 0; i < 200 && engine->num_free_blocks() != free_at_start; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine->num_free_blocks(), free_at_start);
}

TEST(EngineModel, MaxModelLenIsCheckedBeforeTheEngineStarts) {
  // stories260K has a context length of 2048.
  testing::RunOptions o = testing::alone_options(64, 2048);
  auto exec = executor::LocalExecutor::load(testing::stories260k_path(), o.cpu);
  ASSERT_TRUE(exec.ok()) << exec.status().to_string();
  EXPECT_EQ((*exec)->max_model_len(), 2048);
  EngineCoreConfig cfg;
  cfg.options.max_model_len = 2048;
  EXPECT_TRUE(EngineCore::validate_config(**exec, cfg).ok());
  cfg.options.max_model_len = 4096;
  Status st = EngineCore::validate_config(**exec, cfg);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--max-model-len is 4096, the model's context length is 2048"),
            std::string::npos)
      << st.to_string();
  // 5 blocks of 16 tokens: the null block and 4 usable ones cap sequences at 64 tokens.
  o = testing::alone_options(64, 5);
  exec = executor::LocalExecutor::load(testing::stories260k_path(), o.cpu);
  ASSERT_TRUE(exec.ok()) << exec.status().to_string();
  EXPECT_EQ((*exec)->max_model_len(), 64);
  cfg.options.max_model_len = 100;
  st = EngineCore::validate_config(**exec, cfg);
  EXPECT_NE(st.message().find("the KV pool holds only 64 tokens"), std::string::npos)
      << st.to_string();
}

TEST(EngineModel, MaxModelLenCutsGreedyOutputWithLength) {
  testing::RunOptions o = testing::alone_options(256, 256);
  std::mt19937_64 rng(11);
  GenerateRequest r;
  r.prompt_token_ids = testing::random_prompt(rng, 30, 512);
  r.sampling.temperature = 0.0f;
  r.max_tokens = 10;
  const testing::Collected full = drain(**make_engine(o)->submit(r));
  o.engine.max_model_len = 40;  // 30 prompt tokens + 10 generated
  auto engine = make_engine(o);
  r.max_tokens = 50;
  const testing::Collected cut = drain(**engine->submit(r));
  EXPECT_EQ(cut.token_ids[0], full.token_ids[0]);
  EXPECT_EQ(cut.finish[0], sched::FinishReason::kLength);
}

TEST(EngineModel, StopStringEndsTheTextBeforeIt) {
  auto tok = tokenizer::Tokenizer::from_file(testing::stories260k_path());
  ASSERT_TRUE(tok.ok());
  testing::RunOptions o = testing::alone_options(256, 256);
  auto engine = make_engine(o, tok->get());
  GenerateRequest r;
  r.prompt_token_ids = (*tok)->encode("Once upon a time");
  r.sampling.temperature = 0.0f;
  r.max_tokens = 60;
  r.ignore_eos = true;
  const testing::Collected full = drain(**engine->submit(r));
  const std::string& text = full.text[0];
  ASSERT_GT(text.size(), 20u) << text;
  // Stop at a word from the middle of the greedy text.
  const size_t from = text.find(' ', text.size() / 2);
  ASSERT_NE(from, std::string::npos);
  const std::string stop = text.substr(from, 4);
  r.stop = {stop};
  const testing::Collected cut = drain(**engine->submit(r));
  EXPECT_EQ(cut.text[0], text.substr(0, text.find(stop))) << "stop '" << stop << "'";
  EXPECT_EQ(cut.finish[0], sched::FinishReason::kStop);
  EXPECT_LT(cut.token_ids[0].size(), full.token_ids[0].size());
}

}  // namespace
}  // namespace arbor::engine
