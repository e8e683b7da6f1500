#include "spec/flat_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace arbor::spec {
namespace {

TEST(FlatMap, InsertOverwriteFindErase) {
  FlatMap m;
  EXPECT_EQ(m.find(7), nullptr);
  m.insert_or_assign(7, 1);
  m.insert_or_assign(7, 2);
  ASSERT_NE(m.find(7), nullptr);
  EXPECT_EQ(*m.find(7), 2);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_FALSE(m.erase(8));
  EXPECT_TRUE(m.erase(7));
  EXPECT_EQ(m.find(7), nullptr);
  EXPECT_EQ(m.size(), 0u);
}

// Random inserts and erases over a small key space (long probe runs, many backward shifts,
// several growths) against std::unordered_map.
TEST(FlatMap, MatchesUnorderedMapOnRandomOperations) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    FlatMap m;
    std::unordered_map<uint64_t, int32_t> ref;
    const uint64_t num_keys = 1 + seed * 97;
    for (int op = 0; op < 20000; ++op) {
      // Structured keys like the trie's (node << 32 | token).
      const uint64_t k = ((rng() % num_keys) << 32) | (rng() % 3);
      if (rng() % 3 == 0) {
        EXPECT_EQ(m.erase(k), ref.erase(k) == 1);
      } else {
        const auto v = static_cast<int32_t>(rng());
        m.insert_or_assign(k, v);
        ref[k] = v;
      }
      ASSERT_EQ(m.size(), ref.size());
      ASSERT_LE(2 * m.size(), m.capacity());
    }
    for (uint64_t node = 0; node < num_keys; ++node) {
      for (uint64_t t = 0; t < 3; ++t) {
        const uint64_t k = (node << 32) | t;
        auto it = ref.find(k);
        const int32_t* v = m.find(k);
        ASSERT_EQ(v != nullptr, it != ref.end()) << "key " << k;
        if (v != nullptr) {
          EXPECT_EQ(*v, it->second);
        }
      }
    }
  }
}

}  // namespace
}  // namespace arbor::spec
