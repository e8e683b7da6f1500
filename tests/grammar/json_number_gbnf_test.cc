// integer_range_gbnf and number_range_gbnf: exact text for small ranges, and every integer (or
// decimal) in a window checked through a PCRE2 translation of the expression: accepted iff in
// range and canonically spelled.
#include "grammar/json_number_gbnf.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "support/gbnf_matcher.h"

namespace arbor::grammar {
namespace {

using test::FullMatcher;

FullMatcher matcher_for(const std::string& expr) {
  Result<FullMatcher> m = FullMatcher::from_gbnf_expression(expr);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// Values worth probing for [lo, hi]: the bounds and their neighbours, powers of ten and their
// neighbours, every integer in [-1100, 1100].
std::vector<int64_t> probe_values(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t x = -1100; x <= 1100; ++x) v.push_back(x);
  for (int64_t b : {lo, hi}) {
    for (int64_t d = -2; d <= 2; ++d) {
      if ((d < 0 && b < INT64_MIN + 3) || (d > 0 && b > INT64_MAX - 3)) continue;
      v.push_back(b + d);
    }
  }
  for (int64_t p = 10;; p *= 10) {
    for (int64_t d : {-1, 0, 1}) {
      v.push_back(p + d);
      v.push_back(-(p + d));
    }
    if (p == 1000000000000000000) break;  // the largest power of ten in int64
  }
  return v;
}

void expect_exact_integer_range(int64_t lo, int64_t hi, const std::vector<int64_t>& extra = {}) {
  SCOPED_TRACE("range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const std::string expr = integer_range_gbnf(lo, hi);
  const FullMatcher m = matcher_for(expr);
  std::vector<int64_t> values = probe_values(lo, hi);
  values.insert(values.end(), extra.begin(), extra.end());
  for (int64_t x : values) {
    ASSERT_EQ(m.matches(std::to_string(x)), x >= lo && x <= hi) << x << " with " << expr;
  }
  for (const char* bad : {"", "-", "-0", "00", "01", "+1", "1.0", " 1", "1 ", "--1", "0x1"}) {
    ASSERT_FALSE(m.matches(bad)) << "'" << bad << "' with " << expr;
  }
}

TEST(IntegerRangeGbnf, ExactText) {
  EXPECT_EQ(integer_range_gbnf(1, 12), "( [1-9] | \"1\" [0-2] )");
  EXPECT_EQ(integer_range_gbnf(0, 0), "\"0\"");
  EXPECT_EQ(integer_range_gbnf(7, 7), "\"7\"");
  EXPECT_EQ(integer_range_gbnf(-5, 1000), "( \"-\" [1-5] | \"0\" | [1-9] [0-9]{0,2} | \"1000\" )");
  EXPECT_EQ(integer_range_gbnf(0, 150),
            "( \"0\" | [1-9] [0-9]? | \"1\" ( [0-4] [0-9] | \"50\" ) )");
  EXPECT_EQ(integer_range_gbnf(10, 99), "[1-9] [0-9]");
  EXPECT_EQ(integer_range_gbnf(123, 456),
            "( \"1\" ( \"2\" [3-9] | [3-9] [0-9] ) | [2-3] [0-9]{2} | \"4\" ( [0-4] [0-9] | \"5\" "
            "[0-6] ) )");
  EXPECT_EQ(integer_range_gbnf(0, kMaxUnboundedInteger), "( \"0\" | [1-9] [0-9]{0,15} )");
}

TEST(IntegerRangeGbnf, EveryValueInWindowMatchesIffInRange) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {1, 12},        {0, 0},          {-5, 5},        {-1000, -1},     {-999, 1000},
      {10, 99},       {100, 999},      {1, 1000},      {7, 7},          {-7, -7},
      {13, 987},      {-987, -13},     {0, 999999},    {199, 30001},    {12345, 67890},
      {-10, 0},       {0, 10},         {-1, 1},        {9, 10},         {99, 101},
      {-101, -99},    {5, kMaxUnboundedInteger},       {-kMaxUnboundedInteger, 100},
      {-INT64_MAX, INT64_MAX},         {1000000000000000000, INT64_MAX},
      {-INT64_MAX, -999999999999999999},
  };
  for (const auto& [lo, hi] : ranges) expect_exact_integer_range(lo, hi);
}

TEST(IntegerRangeGbnf, RandomRangesOfEveryMagnitude) {
  std::mt19937_64 rng(20240518);
  auto random_value = [&]() {
    const int digits = std::uniform_int_distribution<int>(1, 18)(rng);
    int64_t limit = 1;
    for (int i = 0; i < digits; ++i) limit *= 10;
    int64_t v = std::uniform_int_distribution<int64_t>(0, limit - 1)(rng);
    return std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? -v : v;
  };
  for (int i = 0; i < 150; ++i) {
    int64_t lo = random_value();
    int64_t hi = random_value();
    if (lo > hi) std::swap(lo, hi);
    std::vector<int64_t> extra;
    for (int k = 0; k < 30; ++k) {
      extra.push_back(std::uniform_int_distribution<int64_t>(lo, hi)(rng));
      extra.push_back(random_value());
    }
    expect_exact_integer_range(lo, hi, extra);
  }
}

// A decimal candidate: its text and its value in thousandths.
struct Decimal {
  std::string text;
  int64_t milli = 0;
  bool negative_zero = false;
};

std::vector<Decimal> decimal_candidates() {
  std::vector<Decimal> out;
  const std::vector<std::pair<std::string, int64_t>> fracs = {
      {"", 0}, {".0", 0}, {".00", 0}, {".5", 500}, {".05", 50}, {".001", 1}, {".999", 999}};
  for (int64_t i = 0; i <= 120; ++i) {
    for (const auto& [frac, milli] : fracs) {
      const int64_t v = i * 1000 + milli;
      out.push_back({std::to_string(i) + frac, v, false});
      out.push_back({"-" + std::to_string(i) + frac, -v, v == 0});
    }
  }
  return out;
}

TEST(NumberRangeGbnf, ExactText) {
  EXPECT_EQ(*number_range_gbnf(NumberBound{0, true}, NumberBound{100, true}),
            "( ( \"0\" | [1-9] [0-9]? ) ( \".\" [0-9]{1,15} )? | \"100\" ( \".\" \"0\"{1,15} )? )");
  EXPECT_EQ(*number_range_gbnf(NumberBound{0, false}, std::nullopt),
            "( [1-9] [0-9]{0,15} ( \".\" [0-9]{1,15} )? | \"0\" \".\" \"0\"{0,14} [1-9] "
            "[0-9]{0,14} )");
  EXPECT_EQ(number_range_gbnf(NumberBound{3, false}, NumberBound{3, true}).status().message(),
            "no number satisfies the bounds");
}

TEST(NumberRangeGbnf, EveryDecimalInWindowMatchesIffInRange) {
  const std::vector<std::optional<NumberBound>> lowers = {
      std::nullopt,        NumberBound{-3, true}, NumberBound{-3, false}, NumberBound{0, true},
      NumberBound{0, false}, NumberBound{5, true},  NumberBound{5, false}};
  const std::vector<std::optional<NumberBound>> uppers = {
      std::nullopt,          NumberBound{-1, true}, NumberBound{-1, false}, NumberBound{0, true},
      NumberBound{0, false}, NumberBound{5, true},  NumberBound{5, false},  NumberBound{100, true}};
  const std::vector<Decimal> candidates = decimal_candidates();
  for (const auto& lower : lowers) {
    for (const auto& upper : uppers) {
      auto in_range = [&](int64_t milli) {
        if (lower && (lower->inclusive ? milli < lower->value * 1000
                                       : milli <= lower->value * 1000)) {
          return false;
        }
        return !upper || (upper->inclusive ? milli <= upper->value * 1000
                                           : milli < upper->value * 1000);
      };
      SCOPED_TRACE("lower " + (lower ? std::to_string(lower->value) + (lower->inclusive ? "" : "x")
                                     : std::string("-")) +
                   " upper " + (upper ? std::to_string(upper->value) + (upper->inclusive ? "" : "x")
                                      : std::string("-")));
      Result<std::string> expr = number_range_gbnf(lower, upper);
      const bool empty = std::none_of(candidates.begin(), candidates.end(),
                                      [&](const Decimal& d) { return in_range(d.milli); });
      ASSERT_EQ(expr.ok(), !empty);
      if (empty) continue;
      const FullMatcher m = matcher_for(*expr);
      for (const Decimal& d : candidates) {
        ASSERT_EQ(m.matches(d.text), in_range(d.milli) && !d.negative_zero)
            << d.text << " with " << *expr;
      }
      for (const char* bad : {"", "-", "01", "1.", ".5", "1e2", "+1", "00.5", "1.5.5"}) {
        ASSERT_FALSE(m.matches(bad)) << bad;
      }
    }
  }
}

}  // namespace
}  // namespace arbor::grammar
