#include "grammar/json_number_gbnf.h"

#include <algorithm>
#include <vector>

#include "grammar/gbnf_text.h"

namespace arbor::grammar {

namespace {

constexpr char kFracAny[] = "( \".\" [0-9]{1,15} )?";
constexpr char kFracZero[] = "( \".\" \"0\"{1,15} )?";
constexpr char kFracNonzero[] = "\".\" \"0\"{0,14} [1-9] [0-9]{0,14}";

std::string digit_class(char lo, char hi) {
  if (lo == hi) return gbnf_literal_ascii(std::string(1, lo));
  return std::string("[") + lo + "-" + hi + "]";
}

// `digit` followed by the alternatives: one literal when they are a single digit literal.
std::string digit_then(char digit, const std::vector<std::string>& alts) {
  const std::string& a = alts[0];
  const bool digit_literal =
      a.size() >= 3 && a.front() == '"' && a.back() == '"' &&
      std::all_of(a.begin() + 1, a.end() - 1, [](char c) { return c >= '0' && c <= '9'; });
  if (alts.size() == 1 && digit_literal) {
    return "\"" + std::string(1, digit) + a.substr(1);
  }
  return gbnf_sequence({gbnf_literal_ascii(std::string(1, digit)), gbnf_group(alts)});
}

std::string any_digits(size_t n) {
  return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}";
}

void append_all(std::vector<std::string> more, std::vector<std::string>* out) {
  for (std::string& s : more) out->push_back(std::move(s));
}

// Alternatives matching the digit strings in [x, y]; x and y have the same length n >= 1 and
// x <= y. Digits are split at the first position where x and y differ: x's leading digit with
// any suffix >= x's, the digits strictly between with any suffix, y's leading digit with any
// suffix <= y's; a side whose suffix bound is trivial (all zeros / all nines) joins the middle.
std::vector<std::string> same_length_alts(const std::string& x, const std::string& y) {
  if (x == y) return {gbnf_literal_ascii(x)};
  size_t k = 0;
  while (x[k] == y[k]) ++k;
  if (k > 0) {
    return {gbnf_sequence({gbnf_literal_ascii(x.substr(0, k)),
                           gbnf_group(same_length_alts(x.substr(k), y.substr(k)))})};
  }
  const size_t rest = x.size() - 1;
  if (rest == 0) return {digit_class(x[0], y[0])};
  const std::string xt = x.substr(1);
  const std::string yt = y.substr(1);
  const bool x_floor = xt == std::string(rest, '0');
  const bool y_ceil = yt == std::string(rest, '9');
  const char lo_digit = x_floor ? x[0] : static_cast<char>(x[0] + 1);
  const char hi_digit = y_ceil ? y[0] : static_cast<char>(y[0] - 1);
  std::vector<std::string> alts;
  if (!x_floor) {
    alts.push_back(digit_then(x[0], same_length_alts(xt, std::string(rest, '9'))));
  }
  if (lo_digit <= hi_digit) {
    alts.push_back(gbnf_sequence({digit_class(lo_digit, hi_digit), any_digits(rest)}));
  }
  if (!y_ceil) {
    alts.push_back(digit_then(y[0], same_length_alts(std::string(rest, '0'), yt)));
  }
  return alts;
}

uint64_t pow10(size_t n) {
  uint64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// Alternatives for the integers in [a, b], 1 <= a <= b: one partial range at each end and the
// lengths in between (all of whose values are in range) as one [1-9] [0-9]{m,n} term.
std::vector<std::string> positive_alts(uint64_t a, uint64_t b) {
  const std::string sa = std::to_string(a);
  const std::string sb = std::to_string(b);
  const size_t da = sa.size();
  const size_t db = sb.size();
  if (da == db) return same_length_alts(sa, sb);
  const bool low_full = a == pow10(da - 1);
  const bool high_full = sb == std::string(db, '9');
  std::vector<std::string> alts;
  if (!low_full) append_all(same_length_alts(sa, std::string(da, '9')), &alts);
  const size_t full_lo = low_full ? da : da + 1;
  const size_t full_hi = high_full ? db : db - 1;
  if (full_lo <= full_hi) {
    Result<std::string> tail = gbnf_repeat("[0-9]", full_lo - 1, full_hi - 1);
    alts.push_back(gbnf_sequence({"[1-9]", tail.value()}));
  }
  if (!high_full) append_all(same_length_alts("1" + std::string(db - 1, '0'), sb), &alts);
  return alts;
}

// Alternatives for magnitudes m = I(.F)? (I >= 0) with m between `low` and `high`.
std::vector<std::string> magnitude_alts(NumberBound low, std::optional<NumberBound> high) {
  std::vector<std::string> alts;
  const int64_t a1 = low.inclusive ? low.value : low.value + 1;
  const int64_t cap = a1 > kMaxUnboundedInteger ? INT64_MAX : kMaxUnboundedInteger;
  const int64_t a2 = high ? high->value - 1 : cap;
  // Integer parts strictly inside the interval (or equal to an inclusive lower bound, where
  // any fraction only moves up): any fraction.
  if (a1 <= a2) alts.push_back(gbnf_sequence({integer_range_gbnf(a1, a2), kFracAny}));
  // An exclusive lower bound L: L.xxx with a nonzero fraction.
  if (!low.inclusive && (!high || low.value < high->value)) {
    alts.push_back(
        gbnf_sequence({gbnf_literal_ascii(std::to_string(low.value)), kFracNonzero}));
  }
  // An inclusive upper bound U: U itself, optionally with zeros after the point.
  if (high && high->inclusive &&
      (low.value < high->value || (low.value == high->value && low.inclusive))) {
    alts.push_back(gbnf_sequence({gbnf_literal_ascii(std::to_string(high->value)), kFracZero}));
  }
  return alts;
}

}  // namespace

std::string integer_range_gbnf(int64_t lo, int64_t hi) {
  ARBOR_CHECK(lo <= hi && lo > INT64_MIN) << "bad integer range " << lo << ".." << hi;
  std::vector<std::string> alts;
  if (lo < 0) {
    const uint64_t mlo = hi < 0 ? static_cast<uint64_t>(-hi) : 1;
    const uint64_t mhi = static_cast<uint64_t>(-lo);
    alts.push_back(gbnf_sequence({"\"-\"", gbnf_group(positive_alts(mlo, mhi))}));
  }
  if (lo <= 0 && hi >= 0) alts.push_back("\"0\"");
  if (hi > 0) append_all(positive_alts(static_cast<uint64_t>(std::max<int64_t>(lo, 1)), hi), &alts);
  return gbnf_group(alts);
}

Result<std::string> number_range_gbnf(std::optional<NumberBound> lower,
                                      std::optional<NumberBound> upper) {
  std::vector<std::string> alts;
  const bool nonnegative_region =
      !upper || upper->value > 0 || (upper->value == 0 && upper->inclusive);
  if (nonnegative_region) {
    const NumberBound low =
        (!lower || lower->value < 0) ? NumberBound{0, true} : *lower;
    append_all(magnitude_alts(low, upper), &alts);
  }
  if (!lower || lower->value < 0) {
    // value = -m with m > 0: the bounds swap sides and change sign.
    const NumberBound low = (upper && upper->value < 0)
                                ? NumberBound{-upper->value, upper->inclusive}
                                : NumberBound{0, false};
    std::optional<NumberBound> high;
    if (lower) high = NumberBound{-lower->value, lower->inclusive};
    std::vector<std::string> negative = magnitude_alts(low, high);
    if (!negative.empty()) alts.push_back(gbnf_sequence({"\"-\"", gbnf_group(negative)}));
  }
  if (alts.empty()) return invalid_argument("no number satisfies the bounds");
  return gbnf_group(alts);
}

}  // namespace arbor::grammar
