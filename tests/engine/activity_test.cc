// The engine's activity summaries (engine/activity.h): a step's composition, request rows, the
// board's ring, and what EngineCore publishes for a scripted run on the fake executor.
#include "engine/activity.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "executor/fake_executor.h"

namespace arbor::engine {
namespace {

using sched::RequestStatus;

sched::ScheduledRequest scheduled(sched::RequestId id, int64_t computed, int32_t tokens,
                                  int32_t drafts, bool prompt_chunk, bool is_new = false) {
  sched::ScheduledRequest s;
  s.request_id = id;
  s.num_computed_tokens = computed;
  s.num_scheduled_tokens = tokens;
  s.num_drafts = drafts;
  s.is_prompt_chunk = prompt_chunk;
  s.is_new = is_new;
  return s;
}

sched::RequestOutput output(sched::RequestId id, int32_t tokens, int32_t drafts, int32_t accepted,
                            bool tree) {
  sched::RequestOutput o;
  o.request_id = id;
  o.new_tokens.resize(static_cast<size_t>(tokens));
  o.num_draft_tokens = drafts;
  o.num_accepted_tokens = accepted;
  o.draft_tree = tree;
  return o;
}

TEST(Activity, SummarizeStepCountsPrefillDecodeAndDrafts) {
  sched::SchedulerOutput out;
  out.requests = {
      scheduled(1, 0, 16, 0, /*prompt_chunk=*/true, /*is_new=*/true),  // a first prompt chunk
      scheduled(2, 40, 4, 3, false),   // decode + a 3-node tree
      scheduled(3, 12, 3, 2, false),   // decode + a 2-draft chain
      scheduled(4, 30, 1, 0, false),   // plain decode
      scheduled(5, 0, 21, 0, false, true),  // recompute of prompt + outputs after preemption
      scheduled(6, 7, 1, 0, true),     // the last token of a prompt: a one-token chunk
  };
  out.preempted_ids = {9};
  const std::vector<sched::RequestOutput> outs = {
      output(2, 2, 3, 1, /*tree=*/true), output(3, 3, 2, 2, false), output(4, 1, 0, 0, false),
      output(5, 1, 0, 0, false), output(6, 1, 0, 0, false)};
  const StepSummary s = summarize_step(7, out, outs, 0.025);
  EXPECT_EQ(s.step, 7);
  EXPECT_DOUBLE_EQ(s.duration_s, 0.025);
  EXPECT_EQ(s.num_requests, 6);
  EXPECT_EQ(s.num_prefill_requests, 3);          // 1, 5, 6
  EXPECT_EQ(s.num_prefill_tokens, 16 + 21 + 1);
  EXPECT_EQ(s.num_decode_requests, 3);           // 2, 3, 4
  EXPECT_EQ(s.num_new_requests, 2);
  EXPECT_EQ(s.num_draft_tokens, 5);
  EXPECT_EQ(s.num_tree_nodes, 3);
  EXPECT_EQ(s.num_accepted_tokens, 3);
  EXPECT_EQ(s.num_generated_tokens, 2 + 3 + 1 + 1 + 1);
  EXPECT_EQ(s.num_preempted, 1);
  EXPECT_EQ(s.kv_used_blocks, 0);  // filled by the engine
}

sched::Request request(sched::RequestId id, RequestStatus status, int64_t prompt, int64_t outputs,
                       int64_t computed) {
  sched::Request r;
  r.request_id = id;
  r.status = status;
  r.token_ids.assign(static_cast<size_t>(prompt + outputs), 5);
  r.num_prompt = prompt;
  r.num_computed_tokens = computed;
  r.arrival_time = 100.0;
  return r;
}

TEST(Activity, SummarizeRequestOfOneSample) {
  sched::Request r = request(3, RequestStatus::kRunning, 12, 5, 16);
  r.num_cached_tokens = 8;
  r.priority = -2;
  r.num_preemptions = 1;
  r.spec.stats.num_draft_tokens = 20;
  r.spec.stats.num_accepted_tokens = 11;
  r.spec.drafts.parent_ids = {step::kDraftRoot, step::kDraftRoot, 0};  // a tree of 3 nodes
  const std::vector<const sched::Request*> samples = {&r};
  const RequestSummary s = summarize_request("http-7", samples, {{3, 4}}, 102.5);
  EXPECT_EQ(s.id, "http-7");
  EXPECT_EQ(s.engine_id, 3u);
  EXPECT_EQ(s.status, RequestStatus::kRunning);
  EXPECT_EQ(s.num_samples, 1);
  EXPECT_EQ(s.priority, -2);
  EXPECT_DOUBLE_EQ(s.age_s, 2.5);
  EXPECT_EQ(s.num_prompt_tokens, 12);
  EXPECT_EQ(s.num_cached_tokens, 8);
  EXPECT_EQ(s.num_computed_tokens, 16);
  EXPECT_EQ(s.num_output_tokens, 5);
  EXPECT_EQ(s.num_draft_tokens, 20);
  EXPECT_EQ(s.num_accepted_tokens, 11);
  EXPECT_EQ(s.num_step_drafts, 4);
  EXPECT_EQ(s.num_pending_drafts, 3);
  EXPECT_TRUE(s.draft_tree);
  EXPECT_EQ(s.num_preemptions, 1);
}

TEST(Activity, SummarizeRequestOfForkedSamples) {
  const sched::RequestId parent = 4;
  sched::Request a = request(sched::child_request_id(parent, 0), RequestStatus::kPreempted, 6, 3, 0);
  sched::Request b = request(sched::child_request_id(parent, 2), RequestStatus::kWaiting, 6, 2, 7);
  a.parent_id = b.parent_id = parent;
  a.spec.drafts.parent_ids = {step::kDraftRoot, 0};  // chains: no tree
  b.spec.drafts.parent_ids = {step::kDraftRoot};
  const std::vector<const sched::Request*> samples = {&a, &b};
  RequestSummary s = summarize_request("n3", samples, {{b.request_id, 1}}, 100.0);
  EXPECT_EQ(s.engine_id, parent);
  EXPECT_EQ(s.status, RequestStatus::kPreempted);  // none runs, one was preempted
  EXPECT_EQ(s.num_samples, 2);
  EXPECT_EQ(s.num_prompt_tokens, 6);
  EXPECT_EQ(s.num_computed_tokens, 7);
  EXPECT_EQ(s.num_output_tokens, 5);
  EXPECT_EQ(s.num_step_drafts, 1);
  EXPECT_EQ(s.num_pending_drafts, 3);
  EXPECT_FALSE(s.draft_tree);
  b.status = RequestStatus::kRunning;
  s = summarize_request("n3", samples, {}, 100.0);
  EXPECT_EQ(s.status, RequestStatus::kRunning);
  EXPECT_EQ(s.num_step_drafts, 0);
}

TEST(Activity, BoardKeepsTheLatestStepsOldestFirst) {
  ActivityBoard board;
  EXPECT_TRUE(board.read().steps.empty());
  for (int64_t i = 1; i <= 70; ++i) {
    StepSummary s;
    s.step = i;
    s.num_prefill_tokens = static_cast<int32_t>(10 * i);
    RequestSummary row;
    row.id = "r" + std::to_string(i);
    board.publish(&s, {row}, KvSummary{.usable_blocks = 9, .used_blocks = static_cast<int32_t>(i)});
    if (i == 3) {
      const EngineActivity a = board.read();
      ASSERT_EQ(a.steps.size(), 3u);
      EXPECT_EQ(a.steps[0].step, 1);
      EXPECT_EQ(a.steps[2].num_prefill_tokens, 30);
      EXPECT_EQ(a.kv.used_blocks, 3);
    }
  }
  // An iteration without a step: rows and KV replaced, ring unchanged.
  board.publish(nullptr, {}, KvSummary{.usable_blocks = 9, .used_blocks = 4, .shared_blocks = 2,
                                       .cached_blocks = 3});
  const EngineActivity a = board.read();
  EXPECT_EQ(a.kv.usable_blocks, 9);
  EXPECT_EQ(a.kv.used_blocks, 4);
  EXPECT_EQ(a.kv.shared_blocks, 2);
  EXPECT_EQ(a.kv.cached_blocks, 3);
  ASSERT_EQ(a.steps.size(), static_cast<size_t>(ActivityBoard::kMaxSteps));
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].step, static_cast<int64_t>(70 - 64 + 1 + i));
    EXPECT_EQ(a.steps[i].num_prefill_tokens, 10 * a.steps[i].step);
  }
  EXPECT_TRUE(a.requests.empty());
  EXPECT_EQ(a.num_published, 71);
}

std::unique_ptr<EngineCore> fake_engine(const EngineOptions& o, const executor::FakeExecutorOptions& f) {
  EngineCoreConfig cfg;
  cfg.options = o;
  cfg.eos_token_ids = std::vector<int32_t>{2};
  return std::make_unique<EngineCore>(std::make_unique<executor::FakeExecutor>(f), cfg);
}

GenerateRequest greedy(std::string id, int32_t prompt_len, int32_t max_tokens) {
  GenerateRequest r;
  r.request_id = std::move(id);
  r.prompt_token_ids.resize(static_cast<size_t>(prompt_len));
  std::iota(r.prompt_token_ids.begin(), r.prompt_token_ids.end(), 10);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  return r;
}

// One 20-token prompt, 8-token step budget, 4-token blocks, 4 tokens generated: three prompt
// chunks (8, 8, 4: the last samples the first token), then three one-token decode steps.
TEST(ActivityEngine, ScriptedRunPublishesEveryStep) {
  EngineOptions o;
  o.max_num_batched_tokens = 8;
  executor::FakeExecutorOptions f;
  f.block_size = 4;
  f.num_kv_blocks = 64;
  auto engine = fake_engine(o, f);
  // Before any step: the idle pool.
  EXPECT_EQ(engine->activity().kv.usable_blocks, 63);
  EXPECT_EQ(engine->metrics().kv_usable_blocks, 63);
  EXPECT_TRUE(engine->activity().steps.empty());
  auto stream = engine->submit(greedy("solo", 20, 4));
  ASSERT_TRUE(stream.ok());
  testing::drain(**stream);
  engine->wait_idle();
  const EngineActivity a = engine->activity();
  EXPECT_TRUE(a.requests.empty());
  EXPECT_EQ(a.kv.used_blocks, 0);
  EXPECT_EQ(a.kv.usable_blocks, 63);
  // Cached: the 5 full blocks of the 22 committed tokens (the last, 23rd, was never computed).
  EXPECT_EQ(a.kv.cached_blocks, 5);
  ASSERT_EQ(a.steps.size(), 6u);
  struct Row {
    int32_t prefill_requests, prefill_tokens, decode_requests, new_requests, generated, kv_used;
  };
  // K/V after each step: 8 tokens = 2 blocks, 16 = 4, 20 = 5, 21 and 22 = 6; the last step
  // finishes the request and frees its blocks (prefix caching keeps them cached, not used).
  const std::vector<Row> want = {{1, 8, 0, 1, 0, 2}, {1, 8, 0, 0, 0, 4}, {1, 4, 0, 0, 1, 5},
                                 {0, 0, 1, 0, 1, 6}, {0, 0, 1, 0, 1, 6}, {0, 0, 1, 0, 1, 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    const StepSummary& s = a.steps[i];
    EXPECT_EQ(s.step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(s.num_requests, 1);
    EXPECT_EQ(s.num_prefill_requests, want[i].prefill_requests);
    EXPECT_EQ(s.num_prefill_tokens, want[i].prefill_tokens);
    EXPECT_EQ(s.num_decode_requests, want[i].decode_requests);
    EXPECT_EQ(s.num_new_requests, want[i].new_requests);
    EXPECT_EQ(s.num_generated_tokens, want[i].generated);
    EXPECT_EQ(s.kv_used_blocks, want[i].kv_used);
    EXPECT_EQ(s.kv_shared_blocks, 0);
    EXPECT_EQ(s.num_draft_tokens, 0);
    EXPECT_GE(s.duration_s, 0.0);
    if (i > 0) {
      EXPECT_GE(s.end_time_s, a.steps[i - 1].end_time_s);
    }
  }
}

// A second request with the first one's prompt hits its cached blocks while both run: the
// shared blocks show in the step, and both rows are published while they run.
TEST(ActivityEngine, RowsAndSharedBlocksWhileRequestsRun) {
  EngineOptions o;
  executor::FakeExecutorOptions f;
  f.block_size = 4;
  f.step_delay_us = 2000;
  auto engine = fake_engine(o, f);
  auto first = engine->submit(greedy("first", 16, 200));
  ASSERT_TRUE(first.ok());
  // Wait until the first prompt is computed (its 4 blocks are cached), then send the second.
  EngineActivity a;
  for (int i = 0; i < 2000 && (a.requests.empty() || a.requests[0].num_output_tokens == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a = engine->activity();
  }
  ASSERT_EQ(a.requests.size(), 1u);
  auto second = engine->submit(greedy("second", 16, 200));
  ASSERT_TRUE(second.ok());
  for (int i = 0; i < 2000 && a.requests.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a = engine->activity();
  }
  ASSERT_EQ(a.requests.size(), 2u);
  EXPECT_EQ(a.requests[0].id, "first");
  EXPECT_EQ(a.requests[1].id, "second");
  EXPECT_LT(a.requests[0].engine_id, a.requests[1].engine_id);
  for (const RequestSummary& r : a.requests) {
    EXPECT_EQ(r.status, RequestStatus::kRunning);
    EXPECT_EQ(r.num_prompt_tokens, 16);
    EXPECT_EQ(r.num_samples, 1);
  }
  // The second prompt's first 3 blocks (12 tokens: one token must stay to compute) are the first
  // request's: shared by both tables.
  EXPECT_EQ(a.requests[1].num_cached_tokens, 12);
  EXPECT_EQ(a.steps.back().kv_shared_blocks, 3);
  EXPECT_EQ(a.kv.shared_blocks, 3);
  EXPECT_EQ(a.kv.used_blocks, a.steps.back().kv_used_blocks);
  EXPECT_GE(a.kv.cached_blocks, 4);  // the first prompt's 4 full blocks at least
  // The rows and the ring are one publish: the tokens the first request generated are the ones
  // the ring's steps generated for it (all its steps are in the ring while it is young).
  if (a.steps.front().step == 1) {
    int64_t generated = 0;
    for (const StepSummary& s : a.steps) generated += s.num_generated_tokens;
    EXPECT_EQ(generated, a.requests[0].num_output_tokens + a.requests[1].num_output_tokens);
  }
  engine->abort("first");
  engine->abort("second");
  testing::drain(**first);
  testing::drain(**second);
  engine->wait_idle();
  EXPECT_TRUE(engine->activity().requests.empty());
}

// Speculation on the fake (its first draft is right, the rest wrong): every verification shows in
// the steps and the rows, and the ring's sums equal the engine's counters.
TEST(ActivityEngine, DraftsVerifiedAndAccepted) {
  EngineOptions o;
  o.max_spec_tokens = 3;
  executor::FakeExecutorOptions f;
  f.draft_correct_prefix = 1;
  auto engine = fake_engine(o, f);
  GenerateRequest r = greedy("spec", 8, 21);
  r.speculation = sched::SpecRequest{.mode = sched::SpecMode::kFixed, .k = 3};
  auto stream = engine->submit(std::move(r));
  ASSERT_TRUE(stream.ok());
  testing::drain(**stream);
  engine->wait_idle();
  const EngineActivity a = engine->activity();
  const EngineMetricsSnapshot m = engine->metrics();
  ASSERT_EQ(static_cast<int64_t>(a.steps.size()), m.num_steps);
  int64_t drafts = 0, accepted = 0, generated = 0;
  int full_verifications = 0;
  for (const StepSummary& s : a.steps) {
    drafts += s.num_draft_tokens;
    accepted += s.num_accepted_tokens;
    generated += s.num_generated_tokens;
    full_verifications += s.num_draft_tokens == 3 && s.num_accepted_tokens == 1 ? 1 : 0;
    EXPECT_EQ(s.num_tree_nodes, 0);
    // A decode step commits the accepted drafts and one more token.
    if (s.num_decode_requests == 1) {
      EXPECT_EQ(s.num_generated_tokens, s.num_accepted_tokens + 1);
    }
  }
  EXPECT_EQ(drafts, m.num_draft_tokens);
  EXPECT_EQ(accepted, m.num_accepted_draft_tokens);
  EXPECT_EQ(generated, 21);
  EXPECT_GT(full_verifications, 5);
}

}  // namespace
}  // namespace arbor::engine
