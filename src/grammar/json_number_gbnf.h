// Exact GBNF expressions for decimal integers and JSON numbers between bounds: the digit-range
// construction behind JSON Schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace arbor::grammar {

// The bound used for an unbounded side: 16 digits, the widest integer a double holds exactly in
// every case (2^53 has 16 digits). The plain `integer` and `number` rules use the same width.
inline constexpr int64_t kMaxUnboundedInteger = 9999999999999999;

// GBNF matching exactly the canonical decimal spellings of the integers in [lo, hi]: no leading
// zeros, no '+', zero only as "0" (never "-0"). Example: [1, 12] gives ( [1-9] | "1" [0-2] ).
// The result is a literal, a class sequence or a parenthesised alternation, safe to juxtapose.
// Preconditions: lo <= hi, lo > INT64_MIN. Size O(number of digits).
std::string integer_range_gbnf(int64_t lo, int64_t hi);

struct NumberBound {
  int64_t value = 0;       // an integer-valued bound; |value| < 2^63 - 1
  bool inclusive = true;   // minimum/maximum: true; exclusiveMinimum/exclusiveMaximum: false
};

// GBNF for JSON numbers without exponent, `-`? int ( "." frac )?, whose value lies between the
// bounds (nullopt: unbounded, in which case integer parts stop at kMaxUnboundedInteger, or at
// INT64_MAX when the other bound is already beyond it). Fractions have up to 15 digits (up to
// 29 when leading zeros are needed to stay off an excluded integer bound); "-0" and "-0.0" are
// never produced. Example: maximum 100 accepts "100" and "100.0" but not "100.5".
// kInvalidArgument when no number satisfies both bounds.
Result<std::string> number_range_gbnf(std::optional<NumberBound> lower,
                                      std::optional<NumberBound> upper);

}  // namespace arbor::grammar
