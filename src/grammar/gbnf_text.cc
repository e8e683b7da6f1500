#include "grammar/gbnf_text.h"

#include <algorithm>
#include <cstdio>

namespace arbor::grammar {

namespace {

constexpr uint64_t kMaxRepeatTotal = kMaxGbnfRepeat * kMaxGbnfRepeat;

std::string hex_escape(char32_t cp) {
  char buf[16];
  if (cp < 0x80) {
    std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(cp));
  } else if (cp <= 0xFFFF) {
    std::snprintf(buf, sizeof(buf), "\\u%04X", static_cast<unsigned>(cp));
  } else {
    std::snprintf(buf, sizeof(buf), "\\U%08X", static_cast<unsigned>(cp));
  }
  return buf;
}

// Escapes shared by literals and classes; `specials` are the ASCII characters that need a
// backslash in this context.
std::string escape_codepoint(char32_t cp, std::string_view specials) {
  switch (cp) {
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (cp < 0x20 || cp >= 0x7F) return hex_escape(cp);
  std::string out;
  if (specials.find(static_cast<char>(cp)) != std::string_view::npos) out += '\\';
  out += static_cast<char>(cp);
  return out;
}

std::string class_item(char32_t cp) { return escape_codepoint(cp, "\\]-^"); }

std::string class_body(const CodepointSet& set) {
  std::string out;
  for (const CodepointRange& r : set.ranges()) {
    out += class_item(r.lo);
    if (r.hi == r.lo) continue;
    if (r.hi > r.lo + 1) out += '-';
    out += class_item(r.hi);
  }
  return out;
}

// `atom` with a quantifier whose counts are both within GBNF's limit.
std::string small_repeat(std::string_view atom, uint64_t min, std::optional<uint64_t> max) {
  std::string a(atom);
  if (!max) {
    if (min == 0) return a + "*";
    if (min == 1) return a + "+";
    return a + "{" + std::to_string(min) + ",}";
  }
  if (*max == 0) return "";
  if (min == *max) return min == 1 ? a : a + "{" + std::to_string(min) + "}";
  if (min == 0 && *max == 1) return a + "?";
  return a + "{" + std::to_string(min) + "," + std::to_string(*max) + "}";
}

// Exactly `count` copies (count <= kMaxRepeatTotal).
std::string exact_repeat(std::string_view atom, uint64_t count) {
  if (count <= kMaxGbnfRepeat) return small_repeat(atom, count, count);
  const uint64_t blocks = count / kMaxGbnfRepeat;
  const uint64_t rest = count % kMaxGbnfRepeat;
  std::string block = small_repeat(atom, kMaxGbnfRepeat, kMaxGbnfRepeat);
  if (blocks > 1) block = small_repeat("( " + block + " )", blocks, blocks);
  return gbnf_sequence({block, small_repeat(atom, rest, rest)});
}

// Between 0 and `count` copies, count > kMaxGbnfRepeat: either fewer than `blocks` full blocks
// and at most 999 more, or exactly `blocks` blocks and at most `rest` more.
std::string up_to_repeat(std::string_view atom, uint64_t count) {
  const uint64_t blocks = count / kMaxGbnfRepeat;
  const uint64_t rest = count % kMaxGbnfRepeat;
  const std::string block = "( " + small_repeat(atom, kMaxGbnfRepeat, kMaxGbnfRepeat) + " )";
  const std::string tail = small_repeat(atom, 0, kMaxGbnfRepeat - 1);
  if (rest == kMaxGbnfRepeat - 1) return gbnf_sequence({small_repeat(block, 0, blocks), tail});
  const std::string fewer = gbnf_sequence({small_repeat(block, 0, blocks - 1), tail});
  const std::string all = gbnf_sequence({small_repeat(block, blocks, blocks),
                                         small_repeat(atom, 0, rest)});
  return gbnf_group({fewer, all});
}

}  // namespace

std::optional<std::u32string> decode_utf8(std::string_view utf8) {
  std::u32string out;
  size_t i = 0;
  while (i < utf8.size()) {
    const auto b0 = static_cast<unsigned char>(utf8[i]);
    int extra = 0;
    char32_t cp = 0;
    if (b0 < 0x80) {
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      extra = 1, cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2, cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      extra = 3, cp = b0 & 0x07;
    } else {
      return std::nullopt;
    }
    if (i + extra >= utf8.size() && extra > 0) return std::nullopt;  // truncated
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(utf8[i + k]);
      if ((b & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[extra] || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return std::nullopt;
    }
    out += cp;
    i += extra + 1;
  }
  return out;
}

std::string gbnf_literal(std::u32string_view text) {
  std::string out = "\"";
  for (char32_t cp : text) out += escape_codepoint(cp, "\\\"");
  out += '"';
  return out;
}

std::string gbnf_literal_ascii(std::string_view text) {
  std::u32string cps;
  for (char c : text) {
    ARBOR_CHECK(static_cast<unsigned char>(c) < 0x80) << "non-ASCII byte in " << text;
    cps += static_cast<char32_t>(c);
  }
  return gbnf_literal(cps);
}

CodepointSet CodepointSet::range(char32_t lo, char32_t hi) {
  CodepointSet s;
  s.add(lo, hi);
  return s;
}

void CodepointSet::add(char32_t lo, char32_t hi) {
  ARBOR_CHECK(lo <= hi && hi <= kMaxCodepoint)
      << "bad range " << static_cast<uint32_t>(lo) << ".." << static_cast<uint32_t>(hi);
  std::vector<CodepointRange> merged;
  bool placed = false;
  for (const CodepointRange& r : ranges_) {
    if (r.hi + 1 < lo) {
      merged.push_back(r);
    } else if (hi + 1 < r.lo) {
      if (!placed) merged.push_back({lo, hi}), placed = true;
      merged.push_back(r);
    } else {
      lo = std::min<char32_t>(lo, r.lo);
      hi = std::max<char32_t>(hi, r.hi);
    }
  }
  if (!placed) merged.push_back({lo, hi});
  ranges_ = std::move(merged);
}

void CodepointSet::add(const CodepointSet& other) {
  for (const CodepointRange& r : other.ranges_) add(r.lo, r.hi);
}

CodepointSet CodepointSet::complement() const {
  CodepointSet out;
  char32_t next = 0;
  for (const CodepointRange& r : ranges_) {
    if (r.lo > next) out.ranges_.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.ranges_.push_back({next, kMaxCodepoint});
  return out;
}

CodepointSet CodepointSet::minus(const CodepointSet& other) const {
  // A \ B = complement(complement(A) u B).
  CodepointSet c = complement();
  c.add(other);
  return c.complement();
}

bool CodepointSet::contains(char32_t cp) const {
  for (const CodepointRange& r : ranges_) {
    if (cp >= r.lo && cp <= r.hi) return true;
  }
  return false;
}

bool CodepointSet::is_full() const {
  return ranges_.size() == 1 && ranges_[0].lo == 0 && ranges_[0].hi == kMaxCodepoint;
}

std::string gbnf_char_class(const CodepointSet& set) {
  ARBOR_CHECK(!set.empty()) << "empty code point set";
  if (set.is_full()) return ".";
  if (set.is_single()) return gbnf_literal(std::u32string(1, char32_t{set.ranges()[0].lo}));
  if (set.contains(kMaxCodepoint)) return "[^" + class_body(set.complement()) + "]";
  return "[" + class_body(set) + "]";
}

Result<std::string> gbnf_repeat(std::string_view atom, uint64_t min, std::optional<uint64_t> max) {
  if (max && min > *max) {
    return invalid_argument("repetition minimum ", min, " is greater than its maximum ", *max);
  }
  const uint64_t largest = max ? *max : min;
  if (largest > kMaxRepeatTotal) {
    return invalid_argument("repetition count ", largest, " exceeds the supported limit ",
                            kMaxRepeatTotal);
  }
  if (largest <= kMaxGbnfRepeat) return small_repeat(atom, min, max);
  if (!max) return gbnf_sequence({exact_repeat(atom, min), small_repeat(atom, 0, std::nullopt)});
  const uint64_t optional = *max - min;
  std::string opt = optional <= kMaxGbnfRepeat ? small_repeat(atom, 0, optional)
                                               : up_to_repeat(atom, optional);
  return gbnf_sequence({exact_repeat(atom, min), opt});
}

std::string gbnf_group(const std::vector<std::string>& alternatives) {
  ARBOR_CHECK(!alternatives.empty()) << "empty alternation";
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "( ";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) out += " | ";
    out += alternatives[i];
  }
  return out + " )";
}

std::string gbnf_sequence(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

std::string gbnf_strip_outer_group(const std::string& expr) {
  if (expr.size() < 4 || expr.compare(0, 2, "( ") != 0 || expr.compare(expr.size() - 2, 2, " )")) {
    return expr;
  }
  int depth = 0;
  for (size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      for (++i; i < expr.size() && expr[i] != close; ++i) {
        if (expr[i] == '\\') ++i;
      }
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
      // The group opened at position 0 closes before the end: "( a ) ( b )".
      if (depth == 0 && i + 1 != expr.size()) return expr;
    }
  }
  return expr.substr(2, expr.size() - 4);
}

bool is_gbnf_rule_name(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
  });
}

}  // namespace arbor::grammar
