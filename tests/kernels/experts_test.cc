// The mixture-of-experts kernels (kernels/experts.h): the router's choice and weights, the pairs'
// sort by expert, and the grouped matmuls, which must give every pair exactly the bits of its
// token alone through its expert's matrix (matmul() with one token) — for every weight type
// with its own kernels, every ISA this CPU runs, plain and packed experts, 1 and 2 threads, and
// routings from decode-like (one token, k experts) to prefill-like (many tokens, uneven experts,
// some empty).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/experts.h"
#include "kernels/matmul.h"
#include "kernels_test_util.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;
using testing::IsaScope;

TEST(RouteSoftmaxTopK, TiesGoToTheLowerExpertAndWeightsAreRenormalised) {
  const float logits[] = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  int32_t ids[3];
  float w[3];
  route_softmax_top_k(logits, 5, 2, ids, w);
  EXPECT_EQ(ids[0], 1);  // experts 1 and 3 tie: the lower id first
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[1], 0.5f);
  route_softmax_top_k(logits, 5, 3, ids, w);
  EXPECT_EQ(ids[2], 2);
  // Against a double softmax over the chosen logits (what renormalising the top-k means).
  const double e1 = std::exp(2.0), e2 = std::exp(1.0);
  EXPECT_NEAR(w[0], e1 / (2 * e1 + e2), 1e-7);
  EXPECT_NEAR(w[2], e2 / (2 * e1 + e2), 1e-7);
}

TEST(RouteSoftmaxTopK, OneExpertGetsWeightOneExactly) {
  for (float logit : {0.0f, -3.25f, 17.0f, 1e-30f}) {
    int32_t id = -1;
    float w = 0.0f;
    route_softmax_top_k(&logit, 1, 1, &id, &w);
    EXPECT_EQ(id, 0);
    EXPECT_EQ(w, 1.0f) << logit;
  }
}

// 200 seeded routing problems: 2-61 experts of normal(0, 2) logits, k in [1, min(E, 8)].
struct RoutingCase {
  std::vector<float> logits;
  int k;
};
std::vector<RoutingCase> routing_cases(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<RoutingCase> cases;
  for (int trial = 0; trial < 200; ++trial) {
    const int experts = 2 + trial % 60;
    RoutingCase c{std::vector<float>(experts), 1 + trial % std::min(experts, 8)};
    for (float& l : c.logits) l = n(rng);
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(RouteSoftmaxTopK, MatchesADoubleReferenceAndNeverPrefersNaN) {
  const std::vector<RoutingCase> cases = routing_cases(5);
  for (size_t trial = 0; trial < cases.size(); ++trial) {
    const std::vector<float>& logits = cases[trial].logits;
    const int experts = static_cast<int>(logits.size()), k = cases[trial].k;
    std::vector<int32_t> ids(k);
    std::vector<float> w(k);
    route_softmax_top_k(logits.data(), experts, k, ids.data(), w.data());
    std::vector<int32_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    double z = 0.0;
    for (int j = 0; j < k; ++j) z += std::exp(double(logits[order[j]]));
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(ids[j], order[j]) << "trial " << trial;
      EXPECT_NEAR(w[j], std::exp(double(logits[order[j]])) / z, 2e-6) << "trial " << trial;
    }
  }
  const float with_nan[] = {std::numeric_limits<float>::quiet_NaN(), -5.0f, 3.0f};
  int32_t ids[2];
  float w[2];
  route_softmax_top_k(with_nan, 3, 2, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
}

// Qwen2-MoE (renormalize false): the chosen experts' probabilities under the softmax over every
// expert, the same choice as renormalised; a single expert still gets 1 exactly.
TEST(RouteSoftmaxTopK, WithoutRenormalisingTheWeightsAreTheFullSoftmaxProbabilities) {
  const std::vector<RoutingCase> cases = routing_cases(7);
  for (size_t trial = 0; trial < cases.size(); ++trial) {
    const std::vector<float>& logits = cases[trial].logits;
    const int experts = static_cast<int>(logits.size()), k = cases[trial].k;
    std::vector<int32_t> ids(k), renorm_ids(k);
    std::vector<float> w(k), renorm_w(k);
    route_softmax_top_k(logits.data(), experts, k, ids.data(), w.data(), false);
    route_softmax_top_k(logits.data(), experts, k, renorm_ids.data(), renorm_w.data());
    EXPECT_EQ(ids, renorm_ids) << "trial " << trial;
    double z = 0.0;
    for (float l : logits) z += std::exp(double(l));
    for (int j = 0; j < k; ++j) {
      EXPECT_NEAR(w[j], std::exp(double(logits[ids[j]])) / z, 2e-6) << "trial " << trial;
    }
  }
  const float one = 3.5f;
  int32_t id = -1;
  float w = 0.0f;
  route_softmax_top_k(&one, 1, 1, &id, &w, false);
  EXPECT_EQ(w, 1.0f);
}

TEST(SortPairsByExpert, CountingSortByExpertThenTokenThenSlot) {
  // 3 tokens, k = 2, 4 experts; expert 0 unused.
  const int32_t ids[] = {2, 1,   // token 0
                         1, 3,   // token 1
                         2, 1};  // token 2
  int32_t indptr[5], pair_token[6], slot_pair[6];
  sort_pairs_by_expert(ids, 3, 2, 4, indptr, pair_token, slot_pair);
  EXPECT_EQ(std::vector<int32_t>(indptr, indptr + 5), (std::vector<int32_t>{0, 0, 3, 5, 6}));
  EXPECT_EQ(std::vector<int32_t>(pair_token, pair_token + 6),
            (std::vector<int32_t>{0, 1, 2, 0, 2, 1}));
  EXPECT_EQ(std::vector<int32_t>(slot_pair, slot_pair + 6),
            (std::vector<int32_t>{3, 0, 1, 5, 4, 2}));
}

// gpt-oss's per-expert biases: each pair gets its own expert's row, whatever the thread count.
TEST(AddExpertBias, EachPairGetsItsExpertsRow) {
  // 4 experts, pairs 0-1 expert 0, none for expert 1, 2-4 expert 2, 5 expert 3; 3 columns.
  const int32_t indptr[] = {0, 2, 2, 5, 6};
  const ExpertRows rows{4, indptr, nullptr};
  const std::vector<float> bias = {1, 2, 3, 10, 20, 30, 100, 200, 300, -1, -2, -3};
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> y(6 * 3);
    std::iota(y.begin(), y.end(), 0.0f);
    add_expert_bias(y.data(), rows, bias.data(), 3, pool);
    EXPECT_EQ(y, (std::vector<float>{1, 3, 5, 4, 6, 8, 106, 207, 308, 109, 210, 311, 112, 213,
                                     314, 14, 14, 14}))
        << threads << " threads";
  }
}

// ---- grouped matmuls -------------------------------------------------------------------------

int64_t first_differing_bit(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  }
  return -1;
}

struct ExpertSet {
  std::vector<uint8_t> data;           // [experts, rows, row bytes]: one 3-D tensor
  std::vector<WeightView> plain, packed;
  std::vector<PackedWeights> owners;
};

ExpertSet make_experts(GgmlType type, int experts, int64_t rows, int64_t cols, std::mt19937& rng) {
  ExpertSet s;
  const std::vector<float> wf = testing::random_floats(rng, experts * rows * cols);
  s.data = testing::encode_weights(type, wf, experts * rows, cols);
  const size_t bytes = weight_row_bytes(type, cols) * rows;
  for (int e = 0; e < experts; ++e) {
    s.plain.push_back(make_weight_view(type, s.data.data() + e * bytes, rows, cols));
    s.packed.push_back(s.plain.back());
    if (packing_available(type)) {
      s.owners.push_back(pack_weights(s.plain.back()));
      s.packed.back().packed = s.owners.back().data();
    }
  }
  return s;
}

// A routing of `tokens` tokens to k of `experts` experts (skewed: low ids are popular, so some
// experts get many pairs and some none), sorted as the forward sorts it.
struct Routing {
  std::vector<int32_t> indptr, pair_token, slot_pair;
};
Routing make_routing(int32_t tokens, int k, int experts, std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    std::vector<float> key(experts);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int e = 0; e < experts; ++e) key[e] = u(rng) * (1.0f + e);
    std::sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return key[a] < key[b]; });
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  Routing r;
  r.indptr.resize(experts + 1);
  r.pair_token.resize(ids.size());
  r.slot_pair.resize(ids.size());
  sort_pairs_by_expert(ids.data(), tokens, k, experts, r.indptr.data(), r.pair_token.data(),
                       r.slot_pair.data());
  return r;
}

struct GroupedCase {
  GgmlType type;
  int experts;
  int64_t rows, cols;
};

void check_grouped(const GroupedCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  constexpr int kMaxTokens = 40;
  ExpertSet gate = make_experts(c.type, c.experts, c.rows, c.cols, rng);
  ExpertSet up = make_experts(c.type, c.experts, c.rows, c.cols, rng);
  ThreadPool p1(1), p2(2);
  for (Isa isa : testing::testable_isas()) {
    IsaScope scope(isa);
    for (bool packed : {false, true}) {
      if (packed && !packing_available(c.type)) continue;
      const auto& g = packed ? gate.packed : gate.plain;
      const auto& u = packed ? up.packed : up.plain;
      for (ThreadPool* pool : {&p1, &p2}) {
        // Up to 128 pairs each thread quantises the pairs of the experts it runs into its own
        // records (experts.cc, kLocalActsPairs); 40 tokens x 4 share one copy. A fresh x every
        // call: records left from the call before must not be read.
        for (auto [tokens, k] : {std::pair{1, 2}, {3, 1}, {5, 3}, {kMaxTokens, 2}, {kMaxTokens, 4}}) {
          const std::vector<float> x = testing::random_floats(rng, kMaxTokens * c.cols);
          SCOPED_TRACE(std::string(gguf::ggml_type_name(c.type)) + " isa=" +
                       std::string(isa_name(isa)) + (packed ? " packed" : " plain") +
                       " threads=" + std::to_string(pool->num_threads()) + " tokens=" +
                       std::to_string(tokens) + " k=" + std::to_string(k) +
                       " seed=" + std::to_string(seed));
          const Routing r = make_routing(tokens, std::min(k, c.experts), c.experts, rng);
          const int32_t pairs = static_cast<int32_t>(r.pair_token.size());
          std::vector<float> yg(pairs * c.rows, NAN), yu(pairs * c.rows, NAN);
          const ExpertMatmul mats[] = {{g, yg.data()}, {u, yu.data()}};
          const ExpertRows rows{c.experts, r.indptr.data(), r.pair_token.data()};
          matmul_experts(mats, x.data(), rows, *pool);
          // Each pair alone: its token through its expert, one token, one thread.
          std::vector<float> alone(c.rows);
          for (int e = 0; e < c.experts; ++e) {
            for (int32_t p = r.indptr[e]; p < r.indptr[e + 1]; ++p) {
              for (const auto& [views, y] : {std::pair{&g, &yg}, {&u, &yu}}) {
                matmul((*views)[e], x.data() + r.pair_token[p] * c.cols, alone.data(), 1, p1);
                const int64_t at = first_differing_bit(y->data() + p * c.rows, alone.data(),
                                                        c.rows);
                ASSERT_EQ(at, -1) << "expert " << e << " pair " << p << " row " << at << ": "
                                  << (*y)[p * c.rows + at] << " grouped vs " << alone[at];
              }
            }
          }
        }
      }
    }
  }
}

TEST(MatmulExperts, EveryPairEqualsItsTokenAloneBitForBit) {
  uint32_t seed = 900;
  // 70 rows: partial 16-row groups; 4 experts with skewed routing leave some empty.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const bool quant = type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0;
    check_grouped({type, 6, 70, quant ? 320 : 100}, ++seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kMXFP4,
                        GgmlType::kIQ4_XS, GgmlType::kIQ4_NL}) {
    check_grouped({type, 5, 48, 512}, ++seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The down projection's form: no src_rows (pair p reads x[p]), one matrix set; and a call with
// every pair on one expert (prefill through a popular expert) split over threads.
TEST(MatmulExperts, OwnRowsAndOneBusyExpert) {
  std::mt19937 rng(77);
  const int64_t rows = 96, cols = 256;
  ExpertSet down = make_experts(GgmlType::kQ8_0, 3, rows, cols, rng);
  const int32_t pairs = 37;
  const std::vector<float> x = testing::random_floats(rng, pairs * cols);
  const std::vector<int32_t> indptr = {0, 0, pairs, pairs};  // all on expert 1
  ThreadPool pool(2);
  for (const auto* views : {&down.plain, &down.packed}) {
    std::vector<float> y(pairs * rows, NAN), alone(rows);
    const ExpertMatmul mats[] = {{*views, y.data()}};
    matmul_experts(mats, x.data(), ExpertRows{3, indptr.data(), nullptr}, pool);
    ThreadPool p1(1);
    for (int32_t p = 0; p < pairs; ++p) {
      matmul((*views)[1], x.data() + p * cols, alone.data(), 1, p1);
      ASSERT_EQ(first_differing_bit(y.data() + p * rows, alone.data(), rows), -1) << p;
    }
  }
}

}  // namespace
}  // namespace arbor::kernels
