// The shard protocol's two ends without a transport (shard/wire.h): deltas encoded by the
// engine's StepEncoder decode to exactly the SchedulerOutput that was encoded, over random table
// histories; every broken field of a Step is refused with its name and changes nothing; results
// survive the wire, and a malformed reply is refused.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "shard/wire.h"

namespace arbor::shard {
namespace {

constexpr DecoderLimits kLimits{.vocab_size = 512, .num_kv_blocks = 64, .block_size = 16,
                                .num_kv_groups = 1};

step::NewRequestData new_request(step::RequestId id, int32_t num_tokens) {
  step::NewRequestData d;
  d.request_id = id;
  for (int32_t i = 0; i < num_tokens; ++i) d.token_ids.push_back(3 + (i * 7 + id) % 500);
  d.num_prompt_tokens = num_tokens;
  d.sampling.temperature = 0.7f;
  d.sampling.seed = 42;
  d.sampling.logprobs = 2;
  d.sampling.logit_bias = {{5, 1.5f}};
  d.sampling.grammar = grammar::GrammarSpec{.kind = grammar::GrammarKind::kRegex, .source = "a+"};
  d.seed = 1000 + id;
  return d;
}

step::ScheduledRequest scheduled(step::RequestId id, int64_t computed, int32_t num,
                                 std::vector<step::BlockId> table, bool sample) {
  step::ScheduledRequest s;
  s.request_id = id;
  s.num_computed_tokens = computed;
  s.num_scheduled_tokens = num;
  s.block_tables = {std::move(table)};
  s.sample = sample;
  return s;
}

// Step 1: request 1 (20 prompt tokens, blocks 1, 2) and request 2 (5 tokens, block 3).
step::SchedulerOutput first_step() {
  step::SchedulerOutput o;
  o.step = 1;
  o.new_requests = {new_request(1, 20), new_request(2, 5)};
  o.requests = {scheduled(1, 0, 20, {1, 2}, true), scheduled(2, 0, 5, {3}, true)};
  o.total_num_scheduled_tokens = 25;
  return o;
}

// Step 2: both decode one token; request 1 keeps its table, request 2 too.
step::SchedulerOutput second_step() {
  step::SchedulerOutput o;
  o.step = 2;
  o.requests = {scheduled(1, 20, 1, {1, 2}, true), scheduled(2, 5, 1, {3}, true)};
  o.requests[0].new_token_ids = {77};
  o.requests[1].new_token_ids = {88};
  o.total_num_scheduled_tokens = 2;
  return o;
}

void expect_same(const step::SchedulerOutput& a, const step::SchedulerOutput& b) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const step::ScheduledRequest &x = a.requests[i], &y = b.requests[i];
    EXPECT_EQ(x.request_id, y.request_id);
    EXPECT_EQ(x.num_computed_tokens, y.num_computed_tokens);
    EXPECT_EQ(x.num_scheduled_tokens, y.num_scheduled_tokens);
    EXPECT_EQ(x.new_token_ids, y.new_token_ids);
    EXPECT_EQ(x.block_tables, y.block_tables) << "request " << x.request_id;
    EXPECT_EQ(x.sample, y.sample);
    EXPECT_EQ(x.num_drafts, y.num_drafts);
  }
  ASSERT_EQ(a.new_requests.size(), b.new_requests.size());
  for (size_t i = 0; i < a.new_requests.size(); ++i) {
    const step::NewRequestData &x = a.new_requests[i], &y = b.new_requests[i];
    EXPECT_EQ(x.request_id, y.request_id);
    EXPECT_EQ(x.token_ids, y.token_ids);
    EXPECT_EQ(x.num_prompt_tokens, y.num_prompt_tokens);
    EXPECT_EQ(x.seed, y.seed);
    EXPECT_EQ(x.sampling.temperature, y.sampling.temperature);
    EXPECT_EQ(x.sampling.seed, y.sampling.seed);
    EXPECT_EQ(x.sampling.logprobs, y.sampling.logprobs);
    EXPECT_EQ(x.sampling.logit_bias, y.sampling.logit_bias);
    EXPECT_EQ(x.sampling.grammar, y.sampling.grammar);
  }
  EXPECT_EQ(a.finished_ids, b.finished_ids);
  EXPECT_EQ(a.preempted_ids, b.preempted_ids);
  EXPECT_EQ(a.total_num_scheduled_tokens, b.total_num_scheduled_tokens);
}

TEST(ShardWire, TwoStepsRoundTrip) {
  StepEncoder enc;
  StepDecoder dec(kLimits);
  dec.reset(1);
  wire::Step msg;
  step::SchedulerOutput out;
  for (const step::SchedulerOutput& o : {first_step(), second_step()}) {
    enc.encode(o, 1, &msg);
    ASSERT_FALSE(dec.decode(msg, &out).has_value());
    expect_same(o, out);
  }
  // The decode step sent no table (nothing changed) and only the new token.
  EXPECT_EQ(msg.requests(0).tables_size(), 0);
  EXPECT_EQ(msg.requests(0).new_token_ids_size(), 1);
  EXPECT_EQ(msg.step(), 2);
}

// Random histories of two KV groups: appends, truncations, a released front (sliding window),
// replaced tails; the decoded tables equal the encoded ones at every step.
TEST(ShardWire, RandomTableHistoriesRoundTrip) {
  const uint64_t seed = 20261128;
  std::mt19937_64 rng(seed);
  DecoderLimits limits = kLimits;
  limits.num_kv_groups = 2;
  limits.num_kv_blocks = 1000;
  StepEncoder enc;
  StepDecoder dec(limits);
  dec.reset(7);
  std::vector<std::vector<step::BlockId>> tables(2);
  std::uniform_int_distribution<int> op(0, 3), block(1, 999);
  int64_t tokens = 16;
  step::SchedulerOutput o;
  o.new_requests = {new_request(9, 16)};
  for (auto& t : tables) t = {block(rng)};
  wire::Step msg;
  step::SchedulerOutput out;
  for (int s = 0; s < 300; ++s) {
    o.requests = {scheduled(9, tokens - 1, 1, {}, true)};
    if (s > 0) o.requests[0].new_token_ids = {5};
    o.requests[0].block_tables = tables;
    o.total_num_scheduled_tokens = 1;
    enc.encode(o, 7, &msg);
    const std::optional<WireError> e = dec.decode(msg, &out);
    ASSERT_FALSE(e.has_value()) << "seed " << seed << " step " << s << ": " << e->status.message();
    ASSERT_EQ(out.requests[0].block_tables, tables) << "seed " << seed << " step " << s;
    o.new_requests.clear();
    // The next step: one more token; group 0 covers it, sometimes with a lookahead block,
    // truncated back or with its tail replaced; group 1 has the same length and a growing
    // released front below the block being written.
    ++tokens;
    std::vector<step::BlockId>& t0 = tables[0];
    std::vector<step::BlockId>& t1 = tables[1];
    const size_t need = static_cast<size_t>((tokens + 15) / 16);
    switch (op(rng)) {
      case 0: t0.push_back(block(rng)); break;
      case 1: if (t0.size() > need) t0.resize(need); break;
      case 2: t0.back() = block(rng); break;
      case 3: break;
    }
    while (t0.size() < need) t0.push_back(block(rng));
    while (t1.size() < t0.size()) t1.push_back(block(rng));
    t1.resize(t0.size());
    size_t released = 0;
    while (released < t1.size() && t1[released] == 0) ++released;
    const size_t written = static_cast<size_t>((tokens - 1) / 16);
    if (s % 5 == 4 && released < written) t1[released] = 0;
  }
}

// A valid two-step history, then step 3 mutated by `mutate`: refused naming `field`; the
// unmutated step 3 is then accepted (nothing of the refused one was applied).
void expect_refused(const std::function<void(wire::Step&)>& mutate, const std::string& field) {
  StepEncoder enc;
  StepDecoder dec(kLimits);
  dec.reset(3);
  wire::Step msg;
  step::SchedulerOutput out;
  for (const step::SchedulerOutput& o : {first_step(), second_step()}) {
    enc.encode(o, 3, &msg);
    ASSERT_FALSE(dec.decode(msg, &out).has_value());
  }
  step::SchedulerOutput third = second_step();
  third.step = 3;
  third.requests[0].num_computed_tokens = 21;
  third.requests[1].num_computed_tokens = 6;
  third.requests[0].new_token_ids = {99};
  third.requests[1].new_token_ids = {98};
  third.new_requests = {new_request(5, 4)};
  third.requests.push_back(scheduled(5, 0, 4, {4}, true));
  third.total_num_scheduled_tokens = 6;
  enc.encode(third, 3, &msg);
  wire::Step bad = msg;
  mutate(bad);
  const std::optional<WireError> e = dec.decode(bad, &out);
  ASSERT_TRUE(e.has_value()) << "accepted a step with a bad " << field;
  EXPECT_EQ(e->field, field) << e->status.message();
  EXPECT_EQ(e->status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e->status.message().find(field), std::string::npos) << e->status.message();
  EXPECT_EQ(e->status.message().rfind("step ", 0), 0u) << e->status.message();
  const std::optional<WireError> good = dec.decode(msg, &out);
  EXPECT_FALSE(good.has_value()) << "the refused step changed the state: "
                                 << good->status.message();
}

TEST(ShardWire, EveryBadFieldIsRefusedByName) {
  expect_refused([](wire::Step& m) { m.set_incarnation(2); }, "incarnation");
  expect_refused([](wire::Step& m) { m.set_step(4); }, "step");
  expect_refused([](wire::Step& m) { m.set_step(2); }, "step");
  expect_refused([](wire::Step& m) { m.add_finished_ids(17); }, "finished_ids[0]");
  expect_refused([](wire::Step& m) { m.add_preempted_ids(1); m.add_preempted_ids(1); },
                 "preempted_ids[1]");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_request_id(2); },
                 "new_requests[0].request_id");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_num_prompt_tokens(0); },
                 "new_requests[0].num_prompt_tokens");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_num_prompt_tokens(5); },
                 "new_requests[0].num_prompt_tokens");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_token_ids(3, 512); },
                 "new_requests[0].token_ids[3]");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_token_ids(0, -1); },
                 "new_requests[0].token_ids[0]");
  expect_refused(
      [](wire::Step& m) { m.mutable_new_requests(0)->mutable_sampling()->set_temperature(-1); },
      "new_requests[0].sampling");
  expect_refused(
      [](wire::Step& m) { m.mutable_new_requests(0)->mutable_sampling()->set_top_p(1.5f); },
      "new_requests[0].sampling");
  expect_refused([](wire::Step& m) { m.mutable_new_requests(0)->set_pooling(9); },
                 "new_requests[0].pooling");
  expect_refused(
      [](wire::Step& m) {
        m.mutable_new_requests(0)->mutable_sampling()->mutable_grammar()->set_kind(11);
      },
      "new_requests[0].sampling.grammar.kind");
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->set_request_id(33); },
                 "requests[0].request_id");
  expect_refused([](wire::Step& m) { m.mutable_requests(1)->set_request_id(1); },
                 "requests[1].request_id");  // scheduled twice
  expect_refused([](wire::Step& m) { m.add_finished_ids(m.requests(0).request_id()); },
                 "requests[0].request_id");  // forgotten by this step, then scheduled
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->set_num_scheduled_tokens(0); },
                 "requests[0].num_scheduled_tokens");
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->set_num_drafts(1); },
                 "requests[0].num_drafts");
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->set_num_computed_tokens(22); },
                 "requests[0].num_computed_tokens");
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->set_num_computed_tokens(-1); },
                 "requests[0].num_computed_tokens");
  expect_refused([](wire::Step& m) { m.mutable_requests(0)->clear_new_token_ids(); },
                 "requests[0].num_computed_tokens");
  expect_refused([](wire::Step& m) { m.mutable_requests(1)->set_new_token_ids(0, 600); },
                 "requests[1].new_token_ids[0]");
  expect_refused(
      [](wire::Step& m) { m.mutable_requests(2)->mutable_tables(0)->set_append(0, 64); },
      "requests[2].tables[0].append[0]");
  expect_refused(
      [](wire::Step& m) { m.mutable_requests(0)->add_tables()->set_keep(3); },
      "requests[0].tables[0].keep");
  expect_refused([](wire::Step& m) { m.mutable_requests(2)->clear_tables(); },
                 "requests[2].tables");
  expect_refused(
      [](wire::Step& m) {
        m.mutable_requests(0)->add_tables()->set_keep(2);
        m.mutable_requests(0)->add_tables()->set_keep(2);
      },
      "requests[0].tables");
  expect_refused(
      [](wire::Step& m) {
        wire::TableEdit* e = m.mutable_requests(0)->add_tables();
        e->set_keep(1);  // 1 block of 16 slots, the step writes slot 22
      },
      "requests[0].tables");
  expect_refused(
      [](wire::Step& m) {
        wire::TableEdit* e = m.mutable_requests(0)->add_tables();
        e->set_keep(2);
        e->set_num_released(2);  // position 21 lives in block 1, now the null block
      },
      "requests[0].tables[0][1]");
  expect_refused(
      [](wire::Step& m) {
        m.mutable_requests(2)->set_prompt_logprobs_begin(1);
        m.mutable_requests(2)->set_prompt_logprobs_end(6);
      },
      "requests[2].prompt_logprobs_begin");
  expect_refused([](wire::Step& m) { m.mutable_requests(2)->set_pool(true); }, "requests[2].pool");
  expect_refused([](wire::Step& m) { m.set_total_num_scheduled_tokens(7); },
                 "total_num_scheduled_tokens");
  expect_refused([](wire::Step& m) { m.add_block_copies(1); }, "block_copies");
  expect_refused(
      [](wire::Step& m) {
        m.add_block_copies(0);
        m.add_block_copies(5);
        m.add_block_copies(4);
      },
      "block_copies[0]");
  expect_refused(
      [](wire::Step& m) {
        m.add_block_copies(2);
        m.add_block_copies(5);
        m.add_block_copies(17);
      },
      "block_copies[0]");
}

TEST(ShardWire, FinishedIdsOfAnotherIncarnationAreLeftOut) {
  StepEncoder enc;
  wire::Step msg;
  enc.encode(first_step(), 1, &msg);
  enc.reset();  // a new incarnation knows no request
  step::SchedulerOutput o;
  o.finished_ids = {1, 2};
  o.preempted_ids = {2};
  enc.encode(o, 2, &msg);
  EXPECT_EQ(msg.finished_ids_size(), 0);
  EXPECT_EQ(msg.preempted_ids_size(), 0);
  EXPECT_EQ(msg.step(), 1) << "steps restart at 1 in a new incarnation";
  EXPECT_EQ(enc.num_known(), 0u);
}

TEST(ShardWire, ResultsRoundTrip) {
  step::StepResult r;
  step::RequestResult a;
  a.request_id = 4;
  a.tokens = {{.token_id = 9, .logprob = -0.5f, .top_logprobs = {{9, -0.5f}, {3, -1.25f}}},
              {.token_id = 11, .logprob = -2.0f, .top_logprobs = {}}};
  a.num_draft_tokens = 3;
  a.num_accepted = 1;
  a.accepted_draft_indices = {0};
  a.next_drafts.parent_ids = {-1, 0, 0};
  a.next_drafts.probs = {0.5f, 0.25f, 0.125f};
  step::RequestResult b;
  b.request_id = 5;
  b.error = internal_error("logits of row 3 are not finite");
  b.num_draft_tokens = 0;
  r.requests = {a, b};
  r.prompt_logprobs = {{.request_id = 4, .first_position = 2,
                        .entries = {{.token_id = 7, .logprob = -3.5f, .rank = 12,
                                     .top = {{1, -0.1f}, {2, -0.2f}}},
                                    {.token_id = 8, .logprob = -0.25f, .rank = 1, .top = {}}}}};
  r.pooled = {{.request_id = 6, .error = ok_status(), .values = {0.5f, -1.0f}}};
  r.experts_touched = 12.5;
  r.propose_seconds = 0.0025;
  wire::StepReply m;
  encode_result(r, &m);
  Result<step::StepResult> back = decode_result(m);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->experts_touched, 12.5);
  EXPECT_EQ(back->propose_seconds, 0.0025);
  ASSERT_EQ(back->requests.size(), 2u);
  const step::RequestResult& x = back->requests[0];
  EXPECT_EQ(x.tokens.size(), 2u);
  EXPECT_EQ(x.tokens[0].token_id, 9);
  EXPECT_EQ(x.tokens[0].logprob, -0.5f);
  ASSERT_EQ(x.tokens[0].top_logprobs.size(), 2u);
  EXPECT_EQ(x.tokens[0].top_logprobs[1].token_id, 3);
  EXPECT_EQ(x.tokens[0].top_logprobs[1].logprob, -1.25f);
  EXPECT_EQ(x.num_accepted, 1);
  EXPECT_EQ(x.accepted_draft_indices, std::vector<int32_t>{0});
  EXPECT_EQ(x.next_drafts.parent_ids, (std::vector<int32_t>{-1, 0, 0}));
  EXPECT_EQ(x.next_drafts.probs, (std::vector<float>{0.5f, 0.25f, 0.125f}));
  EXPECT_EQ(back->requests[1].error.code(), StatusCode::kInternal);
  EXPECT_EQ(back->requests[1].error.message(), "logits of row 3 are not finite");
  ASSERT_EQ(back->prompt_logprobs.size(), 1u);
  const auto& p = back->prompt_logprobs[0];
  EXPECT_EQ(p.first_position, 2);
  ASSERT_EQ(p.entries.size(), 2u);
  EXPECT_EQ(p.entries[0].rank, 12);
  ASSERT_EQ(p.entries[0].top.size(), 2u);
  EXPECT_EQ(p.entries[0].top[1].token_id, 2);
  EXPECT_TRUE(p.entries[1].top.empty());
  ASSERT_EQ(back->pooled.size(), 1u);
  EXPECT_EQ(back->pooled[0].values, (std::vector<float>{0.5f, -1.0f}));
}

TEST(ShardWire, MalformedRepliesAreRefused) {
  wire::StepReply m;
  wire::Token* t = m.add_requests()->add_tokens();
  t->add_top_ids(3);  // no logprob for it
  EXPECT_FALSE(decode_result(m).ok());
  wire::StepReply p;
  wire::PromptLogprobs* w = p.add_prompt_logprobs();
  w->add_token_ids(1);
  w->add_logprobs(-1);
  w->add_ranks(1);
  w->add_num_top(2);  // two alternatives named, one sent
  w->add_top_ids(4);
  w->add_top_logprobs(-2);
  EXPECT_FALSE(decode_result(p).ok());
  wire::StepReply e;
  e.add_requests()->set_error("boom");  // an error without a code
  EXPECT_FALSE(decode_result(e).ok());
}

}  // namespace
}  // namespace arbor::shard
