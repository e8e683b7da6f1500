// The router's pure logic (docs/router.md): the routing policy's decisions as exact tables, the
// prefix index against the KV cache manager's own hashes and events, the replica protocol's
// conversions round-tripping every field and refusing what is out of range.
#include <gtest/gtest.h>

#include <random>

#include "kv/kv_cache_manager.h"
#include "router/prefix_index.h"
#include "router/route_policy.h"
#include "router/wire.h"

namespace arbor::router {
namespace {

constexpr int32_t kBlock = 4;

RouteChoice choose(RoutePolicy p, std::vector<RouteCandidate> c, int64_t prompt,
                   uint64_t rr = 0,
                   RouteWeights w = RouteWeights{.load_tokens = 10, .imbalance = 2.0,
                                                 .balance_abs = 0}) {
  return choose_replica(p, c, prompt, kBlock, w, rr);
}

TEST(RoutePolicy, PrefixGoesToTheLongestCachedPrefixWhenLoadsAreEqual) {
  // 40-token prompt: replica 1 holds 8 of its 10 blocks, replica 2 holds 3.
  const RouteChoice c = choose(RoutePolicy::kPrefix,
                               {{.matched_blocks = 0}, {.matched_blocks = 8}, {.matched_blocks = 3}},
                               40);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.reason, RouteReason::kPrefix);
  EXPECT_EQ(c.new_tokens, 8);
}

TEST(RoutePolicy, CostIsNewTokensPlusLoad) {
  // new tokens 40-32=8 + 3 running x 10 = 38 against 40 + 0 = 40: replica 0.
  const RouteWeights no_cap{.load_tokens = 10, .imbalance = 100, .balance_abs = 100};
  EXPECT_EQ(choose(RoutePolicy::kPrefix,
                   {{.in_flight = 3, .matched_blocks = 8}, {.in_flight = 0, .matched_blocks = 0}}, 40,
                   0, no_cap)
                .index,
            0);
  // One more running request (48 > 40): the load wins, and says so.
  const RouteChoice c = choose(
      RoutePolicy::kPrefix, {{.in_flight = 4, .matched_blocks = 8}, {.in_flight = 0}}, 40, 0, no_cap);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.reason, RouteReason::kLoad);
}

TEST(RoutePolicy, ImbalanceOverridesAffinity) {
  // Replica 0 has everything cached but 7 requests; the least loaded has 1: 7 > 1 + 4 and
  // 7 > 2 x 1, so it is passed over.
  const RouteWeights w{.load_tokens = 0, .imbalance = 2.0, .balance_abs = 4};
  const RouteChoice c = choose(
      RoutePolicy::kPrefix, {{.in_flight = 7, .matched_blocks = 10}, {.in_flight = 1}}, 40, 0, w);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.reason, RouteReason::kImbalance);
  // Within either threshold affinity holds: 5 <= 1 + 4; 7 <= 2 x 4.
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.in_flight = 5, .matched_blocks = 10}, {.in_flight = 1}},
                   40, 0, w).index,
            0);
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.in_flight = 8, .matched_blocks = 10}, {.in_flight = 4}},
                   40, 0, w).index,
            0);
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.in_flight = 9, .matched_blocks = 10}, {.in_flight = 4}},
                   40, 0, w).reason,
            RouteReason::kImbalance);
}

TEST(RoutePolicy, TiesGoToTheLongerAffinityThenFewerInFlightThenTheLowerIndex) {
  // Equal cost (nothing cached anywhere, equal load): where the router sent the prompt's
  // leading blocks before wins, even with more requests in flight (load_tokens 0 makes the
  // costs equal); a longer cached prefix still beats any affinity.
  const RouteWeights flat{.load_tokens = 0, .imbalance = 10, .balance_abs = 100};
  EXPECT_EQ(choose(RoutePolicy::kPrefix,
                   {{.in_flight = 0}, {.in_flight = 2, .affinity_blocks = 3},
                    {.in_flight = 0, .affinity_blocks = 1}},
                   40, 0, flat)
                .index,
            1);
  EXPECT_EQ(choose(RoutePolicy::kPrefix,
                   {{.matched_blocks = 1}, {.affinity_blocks = 9}}, 40, 0, flat)
                .index,
            0);
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.in_flight = 1}, {.in_flight = 0}, {.in_flight = 0}}, 16,
                   0, RouteWeights{.load_tokens = 0, .imbalance = 10, .balance_abs = 0})
                .index,
            1);
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{}, {}, {}}, 16).index, 0);
}

TEST(RoutePolicy, IneligibleReplicasAreNeverChosen) {
  EXPECT_EQ(choose(RoutePolicy::kPrefix,
                   {{.matched_blocks = 10, .eligible = false}, {.in_flight = 5}}, 40).index,
            1);
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.eligible = false}, {.eligible = false}}, 40).index, -1);
  EXPECT_EQ(choose(RoutePolicy::kRoundRobin, {{.eligible = false}}, 40).index, -1);
}

TEST(RoutePolicy, RoundRobinTakesTurnsOverEligibleReplicas) {
  const std::vector<RouteCandidate> c = {{}, {.eligible = false}, {}};
  std::vector<int32_t> got;
  uint64_t next = 0;
  for (int i = 0; i < 5; ++i) {
    const RouteChoice r = choose(RoutePolicy::kRoundRobin, c, 40, next);
    got.push_back(r.index);
    EXPECT_EQ(r.reason, RouteReason::kRoundRobin);
    next = static_cast<uint64_t>(r.index) + 1;
  }
  EXPECT_EQ(got, (std::vector<int32_t>{0, 2, 0, 2, 0}));
}

TEST(RoutePolicy, ASessionStaysOnItsReplicaWhileItsCacheIsNoWorseAndLoadAllows) {
  // Equal caches: the session's replica 2 keeps it (replica 0 would win the tie otherwise).
  RouteChoice c = choose(RoutePolicy::kPrefix, {{}, {}, {.sticky = true}}, 40);
  EXPECT_EQ(c.index, 2);
  EXPECT_EQ(c.reason, RouteReason::kSession);
  // Another replica holds more of the prompt: the cache wins.
  c = choose(RoutePolicy::kPrefix, {{.matched_blocks = 5}, {.sticky = true}}, 40);
  EXPECT_EQ(c.index, 0);
  EXPECT_EQ(c.reason, RouteReason::kPrefix);
  // Overloaded (6 > 0 + 4 and 6 > 2 x 0): load wins.
  c = choose(RoutePolicy::kPrefix, {{}, {.in_flight = 6, .sticky = true}}, 40, 0,
             RouteWeights{.load_tokens = 0, .imbalance = 2, .balance_abs = 4});
  EXPECT_EQ(c.index, 0);
  // Not eligible (unhealthy): ignored.
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{}, {.eligible = false, .sticky = true}}, 40).index, 0);
  // Round robin knows no sessions.
  EXPECT_EQ(choose(RoutePolicy::kRoundRobin, {{}, {.sticky = true}}, 40).index, 0);
}

TEST(RoutePolicy, AFullPromptHitStillComputesOneToken) {
  EXPECT_EQ(choose(RoutePolicy::kPrefix, {{.matched_blocks = 10}}, 40).new_tokens, 1);
}

// The router's hashes are the KV manager's: admit prompts into a real KvCacheManager and compare
// its block_hashes() with prompt_block_hashes(), with and without a salt.
TEST(PrefixIndex, PromptHashesAreTheKvCacheManagersHashes) {
  kv::KvCacheManager kv(kv::KvCacheManagerOptions{.num_blocks = 64, .block_size = kBlock});
  std::mt19937 rng(3);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> tokens(static_cast<size_t>(5 + 7 * i));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 50);
    const std::string salt = i % 2 == 0 ? "" : "tenant-a";
    const auto id = static_cast<kv::KvRequestId>(i + 1);
    const kv::KvRequest waiting{.request_id = id, .token_ids = tokens, .cache_salt = salt};
    const kv::ComputedBlocks hit = kv.get_computed_blocks(waiting);
    ASSERT_TRUE(kv.allocate_slots(waiting, static_cast<int64_t>(tokens.size()) -
                                               hit.num_computed_tokens, hit)
                    .has_value());
    const kv::KvRequest req{.request_id = id, .token_ids = tokens,
                            .num_computed_tokens = static_cast<int64_t>(tokens.size()),
                            .cache_salt = salt};
    kv.cache_full_blocks(req);
    const std::span<const kv::BlockHash> want = kv.block_hashes(req.request_id);
    const std::vector<kv::BlockHash> got = prompt_block_hashes(tokens, kBlock, salt);
    ASSERT_EQ(got.size(), tokens.size() / kBlock);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << "prompt " << i;
  }
}

// The events a KvCacheManager records, applied to a CachedBlockSet, predict exactly the hit
// get_computed_blocks() finds, for random prompts sharing prefixes under eviction pressure.
TEST(PrefixIndex, CachedSetPredictsTheManagersHitsExactly) {
  kv::KvCacheManager kv(kv::KvCacheManagerOptions{.num_blocks = 24, .block_size = kBlock});
  kv.record_kv_events(true);
  CachedBlockSet index(23);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prefixes(4);
  for (auto& p : prefixes) {
    p.resize(12);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % 30);
  }
  int64_t hits = 0;
  for (kv::KvRequestId id = 1; id <= 300; ++id) {
    std::vector<int32_t> tokens = prefixes[rng() % prefixes.size()];
    tokens.resize(tokens.size() - rng() % 6);
    for (uint32_t extra = rng() % 14; extra > 0; --extra) tokens.push_back(static_cast<int32_t>(rng() % 30));
    const kv::KvRequest waiting{.request_id = id, .token_ids = tokens};
    const kv::ComputedBlocks hit = kv.get_computed_blocks(waiting);
    const int64_t predicted = index.matched(prompt_block_hashes(tokens, kBlock, ""));
    // The manager never hits the whole prompt (it must compute the last token).
    const int64_t full = static_cast<int64_t>(tokens.size()) / kBlock;
    const int64_t expect = std::min(predicted, static_cast<int64_t>(tokens.size() - 1) / kBlock);
    ASSERT_EQ(hit.num_computed_tokens / kBlock, expect) << "request " << id << " full " << full;
    hits += predicted > 0;
    const int64_t n = static_cast<int64_t>(tokens.size()) - hit.num_computed_tokens;
    ASSERT_TRUE(kv.allocate_slots(waiting, n, hit).has_value());
    kv.cache_full_blocks(kv::KvRequest{.request_id = id, .token_ids = tokens,
                                       .num_computed_tokens = static_cast<int64_t>(tokens.size())});
    kv.free(id);
    ASSERT_TRUE(index.apply(kv.take_kv_events()).ok());
    ASSERT_EQ(index.size(), kv.block_pool().num_cached_blocks());
  }
  EXPECT_GT(hits, 100) << "the run must share prefixes";
  EXPECT_GT(kv.block_pool().num_evictions(), 50) << "the run must evict";
}

TEST(PrefixIndex, CachedSetRefusesInconsistentEvents) {
  const kv::BlockHash a{1, 2}, b{3, 4};
  CachedBlockSet s(1);
  EXPECT_TRUE(s.apply(std::vector<kv::KvEvent>{{a, true}}).ok());
  EXPECT_EQ(s.apply(std::vector<kv::KvEvent>{{a, true}}).code(), StatusCode::kDataLoss);
  CachedBlockSet t(1);
  EXPECT_EQ(t.apply(std::vector<kv::KvEvent>{{a, false}}).code(), StatusCode::kDataLoss);
  CachedBlockSet u(1);
  EXPECT_EQ(u.apply(std::vector<kv::KvEvent>{{a, true}, {b, true}}).code(), StatusCode::kDataLoss)
      << "more hashes than the replica's pool has blocks";
}

TEST(PrefixIndex, RoutedSetForgetsTheLeastRecentlyRoutedBeyondItsBound) {
  RoutedBlockSet s(3);
  const kv::BlockHash h[4] = {{1, 0}, {2, 0}, {3, 0}, {4, 0}};
  s.add(std::span(h, 2));       // 1 2
  s.add(std::span(h + 2, 1));   // 1 2 3
  s.add(std::span(h, 1));       // 2 3 1
  s.add(std::span(h + 3, 1));   // 3 1 4: 2 dropped
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s.matched(std::span(h, 1)), 1);
  EXPECT_EQ(s.matched(std::span(h, 4)), 1) << "2 was dropped, so the chain stops after 1";
  EXPECT_EQ(s.matched(std::span(h + 2, 2)), 2);
}

TEST(ReplicaWire, RequestRoundTripsEveryField) {
  engine::GenerateRequest r;
  r.request_id = "req-7";
  r.prompt_token_ids = {1, 2, 3};
  r.sampling.temperature = 0.7f;
  r.sampling.top_k = 5;
  r.sampling.seed = 99;
  r.sampling.logprobs = 2;
  r.max_tokens = 33;
  r.ignore_eos = true;
  r.stop_token_ids = {7};
  r.stop = {"\n\n", "END"};
  r.keep_special_ids = {4, 5};
  r.n = 2;
  r.best_of = 3;
  r.priority = -1;
  r.cache_salt = "salt";
  r.speculation = sched::SpecRequest{.mode = sched::SpecMode::kFixed, .k = 3, .tree_nodes = 8};
  r.resume = engine::ResumeFrom{.output_token_ids = {9, 8}, .text_bytes = 12,
                                .cumulative_logprob = -1.5};
  r.one_token_per_event = true;
  wire::GenerateCall m;
  encode_request(r, &m);
  EXPECT_EQ(m.protocol_version(), kReplicaProtocolVersion);
  Result<engine::GenerateRequest> back = decode_request(m);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request_id, r.request_id);
  EXPECT_EQ(back->prompt_token_ids, r.prompt_token_ids);
  EXPECT_EQ(back->sampling.temperature, 0.7f);
  EXPECT_EQ(back->sampling.top_k, 5);
  EXPECT_EQ(back->sampling.seed, std::optional<uint64_t>(99));
  EXPECT_EQ(back->sampling.logprobs, std::optional<int32_t>(2));
  EXPECT_EQ(back->max_tokens, 33);
  EXPECT_TRUE(back->ignore_eos);
  EXPECT_EQ(back->stop_token_ids, r.stop_token_ids);
  EXPECT_EQ(back->stop, r.stop);
  EXPECT_EQ(back->keep_special_ids, r.keep_special_ids);
  EXPECT_EQ(back->n, 2);
  EXPECT_EQ(back->best_of, 3);
  EXPECT_EQ(back->priority, -1);
  EXPECT_EQ(back->cache_salt, "salt");
  EXPECT_EQ(back->speculation.mode, sched::SpecMode::kFixed);
  EXPECT_EQ(back->speculation.k, 3);
  EXPECT_EQ(back->speculation.tree_nodes, 8);
  EXPECT_FALSE(back->pooling.has_value());
  ASSERT_TRUE(back->resume.has_value());
  EXPECT_EQ(back->resume->output_token_ids, (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(back->resume->text_bytes, 12);
  EXPECT_EQ(back->resume->cumulative_logprob, -1.5);
  EXPECT_TRUE(back->one_token_per_event);
  r.pooling = step::PoolingType::kRank;
  r.resume.reset();
  m.Clear();
  encode_request(r, &m);
  back = decode_request(m);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->pooling, std::optional(step::PoolingType::kRank));
  EXPECT_FALSE(back->resume.has_value());
}

TEST(ReplicaWire, DecodingRefusesOutOfRangeEnums) {
  wire::GenerateCall m;
  m.mutable_speculation()->set_mode(3);
  EXPECT_NE(decode_request(m).status().message().find("speculation.mode is 3"), std::string::npos);
  m.mutable_speculation()->set_mode(0);
  m.set_pooling(5);
  EXPECT_NE(decode_request(m).status().message().find("pooling is 5"), std::string::npos);
  wire::GenerateEvent e;
  e.mutable_stop_reason()->set_kind(6);
  EXPECT_NE(decode_event(e).status().message().find("kind is 6"), std::string::npos);
  e.clear_stop_reason();
  e.add_token_ids(1);
  e.add_logprobs();
  e.add_logprobs();
  EXPECT_NE(decode_event(e).status().message().find("2 logprobs for 1 tokens"), std::string::npos);
  wire::GenerateEvent f;
  f.set_error_code(99);
  EXPECT_FALSE(decode_event(f).ok());
  wire::KvEventBatch b;
  b.add_low(1);
  EXPECT_FALSE(decode_kv_events(b).ok());
}

TEST(ReplicaWire, EventRoundTripsEveryField) {
  engine::StreamEvent e;
  e.index = 1;
  e.token_ids = {5, 6};
  e.text = "h\xc3\xa9";
  e.logprobs = {{5, -0.5f, {{5, -0.5f}, {9, -1.0f}}}, {6, -0.25f, {}}};
  e.cumulative_logprob = -0.75;
  e.prompt_logprobs = std::make_shared<engine::PromptLogprobs>(
      engine::PromptLogprobs{{3, -2.0f, 4, {{1, -0.1f}}}});
  e.pooled = {0.5f, -0.5f};
  e.stop_reason = sched::StopReason{.kind = sched::StopKind::kStopString, .stop_string = "END"};
  e.final = false;
  e.usage = engine::Usage{1, 2, 3, 4, 5};
  e.error = invalid_argument("bad");
  wire::GenerateEvent m;
  encode_event(e, &m);
  Result<engine::StreamEvent> b = decode_event(m);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->index, 1);
  EXPECT_EQ(b->token_ids, e.token_ids);
  EXPECT_EQ(b->text, e.text);
  ASSERT_EQ(b->logprobs.size(), 2u);
  EXPECT_EQ(b->logprobs[0].top.size(), 2u);
  EXPECT_EQ(b->logprobs[0].top[1].token_id, 9);
  EXPECT_EQ(b->logprobs[1].logprob, -0.25f);
  EXPECT_EQ(b->cumulative_logprob, -0.75);
  ASSERT_NE(b->prompt_logprobs, nullptr);
  EXPECT_EQ((*b->prompt_logprobs)[0].rank, 4);
  EXPECT_EQ(b->pooled, e.pooled);
  EXPECT_EQ(b->stop_reason, e.stop_reason);
  EXPECT_EQ(b->usage.accepted_draft_tokens, 5);
  EXPECT_EQ(b->error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->error.message(), "bad");
}

}  // namespace
}  // namespace arbor::router
