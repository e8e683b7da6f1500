#include "grammar/regex_to_gbnf.h"

#include <optional>
#include <vector>

#include "grammar/gbnf_text.h"

namespace arbor::grammar {

namespace {

constexpr int kMaxGroupDepth = 200;
constexpr uint64_t kMaxRegexRepeat = 1000000;

struct Node;
using Sequence = std::vector<Node>;
using Alternation = std::vector<Sequence>;

// A parsed regex term: a set of code points (a literal is a one-element set), a group, or a
// repetition of exactly one child.
struct Node {
  enum class Kind { kSet, kGroup, kRepeat };
  Kind kind = Kind::kSet;
  CodepointSet set;
  Alternation alternatives;
  std::vector<Node> child;
  uint64_t min = 0;
  std::optional<uint64_t> max;
};

CodepointSet digit_set() { return CodepointSet::range('0', '9'); }

CodepointSet word_set() {
  CodepointSet s = CodepointSet::range('0', '9');
  s.add('A', 'Z');
  s.add('a', 'z');
  s.add('_', '_');
  return s;
}

CodepointSet space_set() {
  CodepointSet s = CodepointSet::range('\t', '\r');  // \t \n \v \f \r
  s.add(' ', ' ');
  return s;
}

bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_ascii_alnum(char32_t c) {
  return is_ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
int hex_value(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

std::string ascii_of(char32_t c) {
  std::string s;
  append_utf8(c, s);
  return s;
}

class RegexParser {
 public:
  static Result<Alternation> parse(std::string_view pattern) {
    RegexParser p;
    std::optional<std::u32string> cps = decode_utf8(pattern);
    if (!cps) return invalid_argument("invalid regex: the pattern is not valid UTF-8");
    p.p_ = std::move(*cps);
    size_t byte = 0;
    for (char32_t c : p.p_) {
      p.offsets_.push_back(byte);
      std::string enc;
      append_utf8(c, enc);
      byte += enc.size();
    }
    p.offsets_.push_back(byte);
    ARBOR_ASSIGN_OR_RETURN(Alternation alts, p.parse_alternation(0));
    if (p.pos_ < p.p_.size()) return p.invalid(p.pos_, "unbalanced ')'");
    return alts;
  }

 private:
  bool at(char32_t c, size_t ahead = 0) const {
    return pos_ + ahead < p_.size() && p_[pos_ + ahead] == c;
  }
  Status invalid(size_t index, std::string_view what) const {
    return invalid_argument("invalid regex: ", what, " at offset ", offsets_[index]);
  }
  Status unsupported(size_t index, std::string_view what) const {
    return invalid_argument("unsupported regex construct: ", what, " at offset ",
                            offsets_[index]);
  }

  Result<Alternation> parse_alternation(int depth);
  Result<Sequence> parse_sequence(int depth);
  Status parse_quantifier(Node* atom);
  std::optional<size_t> brace_quantifier_end(size_t i, uint64_t* min,
                                             std::optional<uint64_t>* max) const;
  Result<Node> parse_atom(int depth);
  Result<Node> parse_group(int depth);
  Result<CodepointSet> parse_class();
  Result<CodepointSet> parse_class_atom();
  Result<CodepointSet> parse_escape(bool in_class);
  Result<char32_t> parse_hex(size_t start, size_t digits);

  std::u32string p_;
  std::vector<size_t> offsets_;  // [p_.size() + 1] byte offset of each code point
  size_t pos_ = 0;
};

Result<Alternation> RegexParser::parse_alternation(int depth) {
  Alternation alts;
  ARBOR_ASSIGN_OR_RETURN(Sequence first, parse_sequence(depth));
  alts.push_back(std::move(first));
  while (at('|')) {
    ++pos_;
    ARBOR_ASSIGN_OR_RETURN(Sequence next, parse_sequence(depth));
    alts.push_back(std::move(next));
  }
  return alts;
}

Result<Sequence> RegexParser::parse_sequence(int depth) {
  Sequence seq;
  while (pos_ < p_.size() && !at('|') && !at(')')) {
    const char32_t c = p_[pos_];
    if (c == '^') {
      if (depth > 0 || !seq.empty()) {
        return unsupported(pos_, "'^' anywhere but the start of the pattern");
      }
      ++pos_;
      continue;
    }
    if (c == '$') {
      if (depth > 0 || (pos_ + 1 < p_.size() && p_[pos_ + 1] != '|')) {
        return unsupported(pos_, "'$' anywhere but the end of the pattern");
      }
      ++pos_;
      continue;
    }
    uint64_t min = 0;
    std::optional<uint64_t> max;
    if (c == '*' || c == '+' || c == '?' || brace_quantifier_end(pos_, &min, &max)) {
      return invalid(pos_, "quantifier with nothing to repeat");
    }
    ARBOR_ASSIGN_OR_RETURN(Node atom, parse_atom(depth));
    ARBOR_RETURN_IF_ERROR(parse_quantifier(&atom));
    seq.push_back(std::move(atom));
  }
  return seq;
}

// When a {m}, {m,} or {m,n} quantifier starts at `i`, sets the counts and returns the index just
// past the '}'. Anything else (including "{,n}", rejected by the caller) is not a quantifier.
std::optional<size_t> RegexParser::brace_quantifier_end(size_t i, uint64_t* min,
                                                        std::optional<uint64_t>* max) const {
  if (i >= p_.size() || p_[i] != '{') return std::nullopt;
  auto read_number = [&](size_t* j, uint64_t* out) {
    size_t start = *j;
    *out = 0;
    while (*j < p_.size() && is_ascii_digit(p_[*j]) && *j - start < 10) {
      *out = *out * 10 + (p_[*j] - '0');
      ++*j;
    }
    return *j > start;
  };
  size_t j = i + 1;
  uint64_t lo = 0;
  if (!read_number(&j, &lo)) return std::nullopt;
  uint64_t hi = lo;
  bool bounded = true;
  if (j < p_.size() && p_[j] == ',') {
    ++j;
    bounded = read_number(&j, &hi);
  }
  if (j >= p_.size() || p_[j] != '}') return std::nullopt;
  *min = lo;
  *max = bounded ? std::optional<uint64_t>(hi) : std::nullopt;
  return j + 1;
}

Status RegexParser::parse_quantifier(Node* atom) {
  if (pos_ >= p_.size()) return ok_status();
  const size_t start = pos_;
  uint64_t min = 0;
  std::optional<uint64_t> max;
  const char32_t c = p_[pos_];
  if (c == '*' || c == '+' || c == '?') {
    min = c == '+' ? 1 : 0;
    max = c == '?' ? std::optional<uint64_t>(1) : std::nullopt;
    ++pos_;
  } else if (std::optional<size_t> end = brace_quantifier_end(pos_, &min, &max)) {
    pos_ = *end;
  } else {
    if (c == '{' && at(',', 1)) {
      return unsupported(pos_, "'{,n}' quantifier (Python reads {0,n}, ECMAScript literal text)");
    }
    return ok_status();
  }
  if (max && min > *max) return invalid(start, "quantifier minimum greater than maximum");
  if (min > kMaxRegexRepeat || (max && *max > kMaxRegexRepeat)) {
    return unsupported(start, "repetition count above 1000000");
  }
  if (at('?')) {
    ++pos_;  // lazy: the same language
  } else if (at('+')) {
    return unsupported(pos_, "possessive quantifier");
  }
  if (pos_ < p_.size()) {
    uint64_t m2 = 0;
    std::optional<uint64_t> x2;
    const char32_t n = p_[pos_];
    if (n == '*' || n == '+' || n == '?' || brace_quantifier_end(pos_, &m2, &x2)) {
      return invalid(pos_, "multiple repeat");
    }
  }
  Node rep;
  rep.kind = Node::Kind::kRepeat;
  rep.min = min;
  rep.max = max;
  rep.child.push_back(std::move(*atom));
  *atom = std::move(rep);
  return ok_status();
}

Result<Node> RegexParser::parse_atom(int depth) {
  Node node;
  const char32_t c = p_[pos_];
  if (c == '(') return parse_group(depth);
  if (c == '[') {
    ARBOR_ASSIGN_OR_RETURN(node.set, parse_class());
  } else if (c == '.') {
    node.set = CodepointSet::single('\n').complement();
    ++pos_;
  } else if (c == '\\') {
    ARBOR_ASSIGN_OR_RETURN(node.set, parse_escape(false));
  } else {
    node.set = CodepointSet::single(c);
    ++pos_;
  }
  return node;
}

Result<Node> RegexParser::parse_group(int depth) {
  const size_t open = pos_;
  if (depth >= kMaxGroupDepth) return unsupported(open, "groups nested more than 200 deep");
  ++pos_;
  if (at('?')) {
    if (at(':', 1)) {
      pos_ += 2;
    } else if (at('=', 1) || at('!', 1)) {
      return unsupported(open, "lookahead");
    } else if (at('<', 1) && (at('=', 2) || at('!', 2))) {
      return unsupported(open, "lookbehind");
    } else if (at('P', 1) && at('=', 2)) {
      return unsupported(open, "backreference");
    } else if (at('<', 1) || (at('P', 1) && at('<', 2))) {
      pos_ += at('P', 1) ? 3 : 2;  // named group: a plain group
      const size_t name_start = pos_;
      while (pos_ < p_.size() && (is_ascii_alnum(p_[pos_]) || p_[pos_] == '_')) ++pos_;
      if (pos_ == name_start || !at('>') || is_ascii_digit(p_[name_start])) {
        return invalid(open, "bad group name");
      }
      ++pos_;
    } else if (at('>', 1)) {
      return unsupported(open, "atomic group");
    } else {
      return unsupported(open, "inline flags or '(?' extension");
    }
  }
  Node node;
  node.kind = Node::Kind::kGroup;
  ARBOR_ASSIGN_OR_RETURN(node.alternatives, parse_alternation(depth + 1));
  if (!at(')')) return invalid(open, "missing ')' for the group opened");
  ++pos_;
  return node;
}

Result<CodepointSet> RegexParser::parse_class() {
  const size_t open = pos_;
  ++pos_;
  const bool negate = at('^');
  if (negate) ++pos_;
  CodepointSet set;
  bool first = true;
  for (;;) {
    if (pos_ >= p_.size()) return invalid(open, "missing ']' for the character class opened");
    if (at(']') && !first) {
      ++pos_;
      break;
    }
    first = false;
    ARBOR_ASSIGN_OR_RETURN(CodepointSet lo, parse_class_atom());
    if (lo.is_single() && at('-') && pos_ + 1 < p_.size() && !at(']', 1)) {
      const size_t dash = pos_++;
      ARBOR_ASSIGN_OR_RETURN(CodepointSet hi, parse_class_atom());
      if (!hi.is_single()) return invalid(dash, "bad character range");
      const char32_t a = lo.ranges()[0].lo;
      const char32_t b = hi.ranges()[0].lo;
      if (a > b) return invalid(dash, "character range out of order");
      set.add(a, b);
    } else {
      set.add(lo);
    }
  }
  if (negate) set = set.complement();
  if (set.empty()) return invalid(open, "character class that matches nothing");
  return set;
}

Result<CodepointSet> RegexParser::parse_class_atom() {
  if (at('[') && (at(':', 1) || at('=', 1) || at('.', 1))) {
    return unsupported(pos_, "POSIX character class");
  }
  if (at('\\')) return parse_escape(true);
  return CodepointSet::single(p_[pos_++]);
}

Result<char32_t> RegexParser::parse_hex(size_t start, size_t digits) {
  char32_t v = 0;
  for (size_t k = 0; k < digits; ++k) {
    const int h = pos_ < p_.size() ? hex_value(p_[pos_]) : -1;
    if (h < 0) return invalid(start, "escape needs " + std::to_string(digits) + " hex digits");
    v = v * 16 + h;
    ++pos_;
  }
  return v;
}

Result<CodepointSet> RegexParser::parse_escape(bool in_class) {
  const size_t start = pos_++;
  if (pos_ >= p_.size()) return invalid(start, "pattern ends with a backslash");
  const char32_t c = p_[pos_++];
  char32_t cp = c;
  switch (c) {
    case 'd': return digit_set();
    case 'D': return digit_set().complement();
    case 'w': return word_set();
    case 'W': return word_set().complement();
    case 's': return space_set();
    case 'S': return space_set().complement();
    case 'n': return CodepointSet::single('\n');
    case 't': return CodepointSet::single('\t');
    case 'r': return CodepointSet::single('\r');
    case 'f': return CodepointSet::single('\f');
    case 'v': return CodepointSet::single('\v');
    case '0':
      if (pos_ < p_.size() && is_ascii_digit(p_[pos_])) return unsupported(start, "octal escape");
      return CodepointSet::single(0);
    case 'b':
      if (in_class) return CodepointSet::single('\b');
      return unsupported(start, "word boundary '\\b'");
    case 'B': case 'A': case 'Z': case 'z': case 'G':
      return unsupported(start, "assertion '\\" + ascii_of(c) + "'");
    case 'k': return unsupported(start, "backreference");
    case 'p': case 'P': return unsupported(start, "Unicode property escape");
    case 'x': {
      ARBOR_ASSIGN_OR_RETURN(cp, parse_hex(start, 2));
      break;
    }
    case 'U': {
      ARBOR_ASSIGN_OR_RETURN(cp, parse_hex(start, 8));
      break;
    }
    case 'u': {
      if (!at('{')) {
        ARBOR_ASSIGN_OR_RETURN(cp, parse_hex(start, 4));
        break;
      }
      ++pos_;
      cp = 0;
      size_t n = 0;
      for (; pos_ < p_.size() && hex_value(p_[pos_]) >= 0 && n < 6; ++n, ++pos_) {
        cp = cp * 16 + hex_value(p_[pos_]);
      }
      if (n == 0 || !at('}')) return invalid(start, "bad \\u{...} escape");
      ++pos_;
      break;
    }
    default:
      if (is_ascii_digit(c)) return unsupported(start, "backreference");
      if (is_ascii_alnum(c)) return invalid(start, "unknown escape '\\" + ascii_of(c) + "'");
      return CodepointSet::single(c);
  }
  if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return invalid(start, "escape outside the Unicode scalar values");
  }
  return CodepointSet::single(cp);
}

// ---------------------------------------------------------------------------------------------

// Emitted GBNF; `atom` when `text` can take a quantifier as is. Empty text matches only "".
struct Emitted {
  std::string text;
  bool atom = false;
};

// How the code point `cp` is written inside a JSON string: raw, or its escape.
std::u32string json_text(char32_t cp) {
  switch (cp) {
    case '"': return U"\\\"";
    case '\\': return U"\\\\";
    case '\b': return U"\\b";
    case '\f': return U"\\f";
    case '\n': return U"\\n";
    case '\r': return U"\\r";
    case '\t': return U"\\t";
    default: break;
  }
  if (cp >= 0x20) return std::u32string(1, cp);
  static constexpr char kHex[] = "0123456789abcdef";
  return std::u32string(U"\\u00") + static_cast<char32_t>(kHex[cp >> 4]) +
         static_cast<char32_t>(kHex[cp & 15]);
}

bool has_short_json_escape(char32_t cp) {
  return cp == '\b' || cp == '\f' || cp == '\n' || cp == '\r' || cp == '\t';
}

class RegexEmitter {
 public:
  explicit RegexEmitter(const RegexGbnfOptions& options) : options_(options) {}

  Emitted alternation(const Alternation& alts) const {
    std::vector<Emitted> nonempty;
    bool has_empty = false;
    for (const Sequence& seq : alts) {
      Emitted e = sequence(seq);
      if (e.text.empty()) {
        has_empty = true;
      } else {
        nonempty.push_back(std::move(e));
      }
    }
    if (nonempty.empty()) return {};
    if (nonempty.size() == 1 && !has_empty) return nonempty[0];
    std::string group;
    if (nonempty.size() == 1) {
      group = nonempty[0].atom ? nonempty[0].text : "( " + nonempty[0].text + " )";
    } else {
      std::vector<std::string> texts;
      for (const Emitted& e : nonempty) texts.push_back(e.text);
      group = gbnf_group(texts);
    }
    if (has_empty) return {group + "?", false};
    return {group, true};
  }

 private:
  Emitted sequence(const Sequence& seq) const {
    std::vector<Emitted> parts;
    std::u32string literal;
    auto flush = [&] {
      if (!literal.empty()) parts.push_back({gbnf_literal(literal), true});
      literal.clear();
    };
    for (const Node& node : seq) {
      if (node.kind == Node::Kind::kSet && node.set.is_single()) {
        literal += literal_text(node.set.ranges()[0].lo);
        continue;
      }
      flush();
      Emitted e = emit(node);
      if (!e.text.empty()) parts.push_back(std::move(e));
    }
    flush();
    if (parts.empty()) return {};
    if (parts.size() == 1) return parts[0];
    std::vector<std::string> texts;
    for (const Emitted& e : parts) texts.push_back(e.text);
    return {gbnf_sequence(texts), false};
  }

  Emitted emit(const Node& node) const {
    switch (node.kind) {
      case Node::Kind::kSet: return set(node.set);
      case Node::Kind::kGroup: return alternation(node.alternatives);
      case Node::Kind::kRepeat: return repeat(node);
    }
    return {};
  }

  Emitted repeat(const Node& node) const {
    Emitted child = emit(node.child[0]);
    if (child.text.empty()) return {};
    std::string atom = child.atom ? child.text : "( " + child.text + " )";
    const uint64_t copies = node.max ? *node.max : node.min;
    if (options_.define_rule && copies >= 2 && costly(node.child[0], child)) {
      atom = options_.define_rule(gbnf_strip_outer_group(child.text));
    }
    Result<std::string> r = gbnf_repeat(atom, node.min, node.max);
    ARBOR_CHECK(r.ok()) << r.status().to_string();  // counts were checked by the parser
    return {std::move(r).value(), false};
  }

  // Whether one copy of `node` takes an automaton several states per code point: groups, and
  // sets with multi-byte members or JSON escapes. Literals and ASCII classes are cheap.
  bool costly(const Node& node, const Emitted& emitted) const {
    if (node.kind != Node::Kind::kSet) return !(emitted.atom && emitted.text[0] == '"');
    if (node.set.is_single()) return false;
    const char32_t last = node.set.ranges().back().hi;
    if (options_.target == RegexTarget::kText) return last >= 0x80;
    return last >= 0x80 || node.set.contains('"') || node.set.contains('\\') ||
           node.set.ranges()[0].lo < 0x20;
  }

  std::u32string literal_text(char32_t cp) const {
    return options_.target == RegexTarget::kText ? std::u32string(1, cp) : json_text(cp);
  }

  Emitted set(const CodepointSet& s) const {
    if (options_.target == RegexTarget::kText) return {gbnf_char_class(s), true};
    CodepointSet special = CodepointSet::range(0, 0x1F);
    special.add('"', '"');
    special.add('\\', '\\');
    std::vector<std::string> alts;
    const CodepointSet plain = s.minus(special);
    if (!plain.empty()) alts.push_back(gbnf_char_class(plain));
    for (char32_t cp : {U'"', U'\\', U'\b', U'\t', U'\n', U'\f', U'\r'}) {
      if (s.contains(cp)) alts.push_back(gbnf_literal(json_text(cp)));
    }
    const std::string controls = control_escapes(s);
    if (alts.empty()) return {controls, false};  // a sequence: "\\u00" ( ... )
    if (!controls.empty()) alts.push_back(controls);
    return {gbnf_group(alts), true};
  }

  // The \u00xx escapes for the controls in `s` that have no short escape, or "".
  static std::string control_escapes(const CodepointSet& s) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::vector<std::string> by_high;
    for (char32_t high = 0; high < 2; ++high) {
      CodepointSet low_digits;
      for (char32_t low = 0; low < 16; ++low) {
        const char32_t cp = high * 16 + low;
        if (s.contains(cp) && !has_short_json_escape(cp)) {
          low_digits.add(kHex[low], kHex[low]);
        }
      }
      if (low_digits.empty()) continue;
      by_high.push_back(gbnf_sequence({gbnf_literal_ascii(high == 0 ? "0" : "1"),
                                       gbnf_char_class(low_digits)}));
    }
    if (by_high.empty()) return "";
    return gbnf_sequence({gbnf_literal_ascii("\\u00"), gbnf_group(by_high)});
  }

  const RegexGbnfOptions& options_;
};

}  // namespace

Result<std::string> regex_to_gbnf_expression(std::string_view pattern,
                                             const RegexGbnfOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(Alternation alts, RegexParser::parse(pattern));
  Emitted e = RegexEmitter(options).alternation(alts);
  if (e.text.empty()) return std::string("\"\"");
  return e.text;
}

Result<std::string> regex_to_gbnf(std::string_view pattern) {
  std::vector<std::pair<std::string, std::string>> rules;  // name, body
  RegexGbnfOptions options;
  options.define_rule = [&rules](const std::string& body) {
    for (const auto& [name, existing] : rules) {
      if (existing == body) return name;
    }
    rules.emplace_back("repeat-" + std::to_string(rules.size() + 1), body);
    return rules.back().first;
  };
  ARBOR_ASSIGN_OR_RETURN(std::string expr, regex_to_gbnf_expression(pattern, options));
  std::string out = "root ::= " + gbnf_strip_outer_group(expr) + "\n";
  for (const auto& [name, body] : rules) out += name + " ::= " + body + "\n";
  return out;
}

}  // namespace arbor::grammar
