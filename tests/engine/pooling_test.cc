// Pooling requests (embeddings, reranking) through the engine and the real CPU executor on a tiny
// Qwen3-style file: batched equals alone bit for bit (many pooling requests of every type and a
// few generation requests chunked through one small step budget, against each alone in one
// chunk), blocks back after an abort mid-prompt, an input may fill max_model_len, rank pooling
// without a rank head fails that request alone; and the fake executor's pooled vectors reach the
// stream. llama.cpp agreement is tests/engine/pooling_reference_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "executor/fake_executor.h"
#include "pooling_models.h"
#include "support/temp_dir.h"

namespace arbor::engine {
namespace {

using step::PoolingType;
using testing::drain_pooled;
using testing::make_pooling_engine;
using testing::submit_pooling;

constexpr PoolingType kTypes[] = {PoolingType::kMean, PoolingType::kCls, PoolingType::kLast,
                                  PoolingType::kRank};

std::vector<std::vector<int32_t>> prompts(int num, int32_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < num; ++i) {
    const int32_t len = 1 + static_cast<int32_t>((int64_t{i} * (max_len - 1)) / (num - 1));
    out.push_back(testing::random_prompt(rng, len, testing::kPoolingVocab));
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> greedy_alone(EngineCore& engine, const std::vector<int32_t>& prompt) {
  GenerateRequest g;
  g.prompt_token_ids = prompt;
  g.sampling.temperature = 0.0f;
  g.max_tokens = 6;
  auto s = engine.submit(std::move(g));
  EXPECT_TRUE(s.ok());
  return testing::drain(**s).token_ids[0];
}

// 10 prompts of 1..120 tokens x every pooling type, submitted at once beside 3 greedy generation
// requests to an engine with a 24-token step budget (prompts in chunks, many requests per step),
// give the vectors and tokens each gives alone in one chunk, bit for bit; the KV pool is whole
// again afterwards.
TEST(Pooling, BatchedEqualsAloneBitForBit) {
  test::TempDir dir("pooling");
  const std::string path = dir / "embed.gguf";
  testing::write_pooling_model(path, 3, 2);
  const auto inputs = prompts(10, 120, 5);
  const auto gen = prompts(3, 40, 6);
  std::map<std::pair<size_t, int>, std::vector<float>> alone;
  std::vector<std::vector<int32_t>> gen_alone;
  {
    auto engine = make_pooling_engine(path, {.budget = 2048});
    ASSERT_NE(engine, nullptr);
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (PoolingType t : kTypes) {
        alone[{i, static_cast<int>(t)}] = drain_pooled(*submit_pooling(*engine, inputs[i], t));
      }
    }
    for (const auto& p : gen) gen_alone.push_back(greedy_alone(*engine, p));
  }
  EXPECT_EQ((alone[{0, 1}].size()), 128u);
  EXPECT_EQ((alone[{0, 4}].size()), 2u);
  auto engine = make_pooling_engine(path, {.budget = 24});
  ASSERT_NE(engine, nullptr);
  const int32_t free_before = engine->num_free_blocks();
  std::vector<std::pair<std::pair<size_t, int>, std::shared_ptr<RequestStream>>> streams;
  std::vector<std::shared_ptr<RequestStream>> gen_streams;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (PoolingType t : kTypes) {
      streams.emplace_back(std::pair{i, static_cast<int>(t)}, submit_pooling(*engine, inputs[i], t));
    }
    if (i < gen.size()) {
      GenerateRequest g;
      g.prompt_token_ids = gen[i];
      g.sampling.temperature = 0.0f;
      g.max_tokens = 6;
      gen_streams.push_back(*engine->submit(std::move(g)));
    }
  }
  for (auto& [key, stream] : streams) {
    StreamEvent final_event;
    const std::vector<float> v = drain_pooled(*stream, &final_event);
    EXPECT_TRUE(same_bits(v, alone[key])) << "input " << key.first << " pooling " << key.second;
    EXPECT_EQ(final_event.usage.prompt_tokens, static_cast<int64_t>(inputs[key.first].size()));
    EXPECT_EQ(final_event.usage.completion_tokens, 0);
  }
  for (size_t i = 0; i < gen.size(); ++i) {
    EXPECT_EQ(testing::drain(*gen_streams[i]).token_ids[0], gen_alone[i]) << "generation " << i;
  }
  engine->wait_idle();
  EXPECT_EQ(engine->num_free_blocks(), free_before);
  const EngineMetricsSnapshot m = engine->metrics();
  EXPECT_GT(m.batch_size.mean(), 1.5) << "requests shared steps";
  EXPECT_GT(m.num_steps, 50) << "prompts ran in chunks";
}

// A mean-pooling request aborted mid-prompt returns every block; the same input afterwards
// gives the vector it gives alone.
TEST(Pooling, AbortMidPromptFreesItsBlocks) {
  test::TempDir dir("pooling");
  const std::string path = dir / "embed.gguf";
  testing::write_pooling_model(path, 1, 0);
  std::mt19937_64 rng(9);
  const std::vector<int32_t> prompt = testing::random_prompt(rng, 900, testing::kPoolingVocab);
  std::vector<float> want;
  {
    auto engine = make_pooling_engine(path, {.budget = 2048});
    want = drain_pooled(*submit_pooling(*engine, prompt, PoolingType::kMean));
  }
  auto engine = make_pooling_engine(path, {.budget = 8});
  const int32_t free_before = engine->num_free_blocks();
  GenerateRequest g;
  g.request_id = "long";
  g.prompt_token_ids = prompt;
  g.pooling = PoolingType::kMean;
  auto stream = engine->submit(std::move(g));
  ASSERT_TRUE(stream.ok());
  while (engine->metrics().num_steps < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->abort("long");
  int events = 0;
  while (std::optional<StreamEvent> e = (*stream)->next()) {
    if (e->final) break;
    ++events;
    EXPECT_TRUE(e->pooled.empty());
    ASSERT_TRUE(e->stop_reason.has_value());
    EXPECT_EQ(e->stop_reason->kind, sched::StopKind::kAbort);
  }
  EXPECT_EQ(events, 1);
  engine->wait_idle();
  EXPECT_EQ(engine->num_free_blocks(), free_before);
  EXPECT_TRUE(same_bits(drain_pooled(*submit_pooling(*engine, prompt, PoolingType::kMean)), want));
}

// An input may fill max_model_len (nothing is generated after it); one token more is refused at
// submit, naming both numbers, as is a generation prompt of max_model_len tokens.
TEST(Pooling, InputMayFillMaxModelLen) {
  test::TempDir dir("pooling");
  const std::string path = dir / "embed.gguf";
  testing::write_pooling_model(path, 3, 0);
  executor::ExecutorOptions eo;
  eo.num_kv_blocks = 16;
  eo.num_threads = 1;
  auto exec = executor::LocalExecutor::load(path, eo);
  ASSERT_TRUE(exec.ok());
  EngineCoreConfig cfg;
  cfg.options.max_model_len = 64;
  EngineCore engine(std::move(exec).value(), cfg);
  std::mt19937_64 rng(3);
  const auto full = testing::random_prompt(rng, 64, testing::kPoolingVocab);
  EXPECT_EQ(drain_pooled(*submit_pooling(engine, full, PoolingType::kLast)).size(), 128u);
  auto longer = full;
  longer.push_back(7);
  GenerateRequest g;
  g.prompt_token_ids = longer;
  g.pooling = PoolingType::kLast;
  const auto refused = engine.submit(g);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "input has 65 tokens, max_model_len is 64");
  g.prompt_token_ids = full;
  g.pooling.reset();
  EXPECT_FALSE(engine.submit(g).ok());
}

// Rank pooling on a file without a rank head fails that request alone (the server refuses the
// route before it gets here); a mean request beside it is served.
TEST(Pooling, RankWithoutAHeadFailsThatRequestOnly) {
  test::TempDir dir("pooling");
  const std::string path = dir / "embed.gguf";
  testing::write_pooling_model(path, 1, 0);
  executor::LocalExecutor* exec = nullptr;
  auto engine = make_pooling_engine(path, {}, &exec);
  ASSERT_FALSE(exec->rank_head().has_value());
  auto rank = submit_pooling(*engine, {1, 5, 9}, PoolingType::kRank);
  auto mean = submit_pooling(*engine, {1, 5, 9}, PoolingType::kMean);
  StreamEvent final_event;
  while (std::optional<StreamEvent> e = rank->next()) {
    if (e->final) {
      final_event = *e;
      break;
    }
  }
  EXPECT_EQ(final_event.error.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(final_event.error.message().find("no rank head"), std::string::npos);
  EXPECT_EQ(drain_pooled(*mean).size(), 128u);
}

// The fake executor's vectors reach the stream unchanged, with the prompt's usage.
TEST(Pooling, FakeExecutorVectorsReachTheStream) {
  executor::FakeExecutorOptions f;
  EngineCoreConfig cfg;
  EngineCore engine(std::make_unique<executor::FakeExecutor>(f), cfg);
  const std::vector<int32_t> prompt = {5, 9, 11, 300};
  for (PoolingType t : kTypes) {
    StreamEvent final_event;
    const auto v = drain_pooled(*submit_pooling(engine, prompt, t), &final_event);
    EXPECT_EQ(v, executor::fake_pooled_vector(prompt, t));
    EXPECT_EQ(final_event.usage.prompt_tokens, 4);
  }
}

}  // namespace
}  // namespace arbor::engine
