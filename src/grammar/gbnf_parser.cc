// parse_gbnf(): a recursive-descent parser of llama.cpp's GBNF (grammar.h has the syntax).
#include <algorithm>
#include <map>
#include <optional>

#include "base/strings.h"
#include "grammar/gbnf_text.h"
#include "grammar/grammar.h"

namespace arbor::grammar {

void append_utf8(uint32_t cp, std::string& out) { arbor::append_utf8(out, cp); }

std::vector<CodepointRange> normalise_class(const std::vector<CodepointRange>& ranges,
                                            bool negated) {
  CodepointSet set;
  for (const CodepointRange& r : ranges) {
    if (r.lo <= r.hi && r.lo <= kMaxCodepoint) set.add(r.lo, std::min(r.hi, kMaxCodepoint));
  }
  if (negated) set = set.complement();
  // Surrogates are not code points of UTF-8 text.
  return set.minus(CodepointSet::range(0xD800, 0xDFFF)).ranges();
}

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

Expr make_list(Expr::Kind kind, std::vector<Expr> children) {
  Expr e;
  e.kind = kind;
  e.children = std::move(children);
  return e;
}

class Parser {
 public:
  Parser(std::string_view text) : text_(text) {}

  Result<Grammar> parse(std::string_view root) {
    skip_space(true);
    while (pos_ < text_.size()) {
      ARBOR_RETURN_IF_ERROR(parse_rule());
      skip_space(true);
    }
    for (const auto& [name, use] : first_use_) {
      if (!defined_.contains(name)) {
        return invalid_argument("grammar: rule '", name, "' is used in rule '", use,
                                "' but never defined");
      }
    }
    const auto it = ids_.find(std::string(root));
    if (it == ids_.end() || !defined_.contains(std::string(root))) {
      return invalid_argument("grammar: no start rule '", root, "' (define `", root, " ::= ...`)");
    }
    grammar_.root = it->second;
    return std::move(grammar_);
  }

 private:
  Status error(std::string_view what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return invalid_argument("grammar: line ", line, ", column ", col, ": ", what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  // Skips blanks and comments; newlines too when `newlines` (inside parentheses, after '|',
  // between rules).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (!at_end() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t rule_id(const std::string& name) {
    const auto [it, inserted] = ids_.emplace(name, static_cast<int32_t>(grammar_.rules.size()));
    if (inserted) grammar_.rules.push_back(Rule{.name = name, .body = {}});
    return it->second;
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  Status parse_rule() {
    const std::string name = parse_name();
    if (name.empty()) return error("expected a rule name");
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") {
      return error(str_cat("expected '::=' after rule name '", name, "'"));
    }
    pos_ += 3;
    skip_space(true);
    if (defined_.contains(name)) return error(str_cat("rule '", name, "' is defined twice"));
    defined_.insert({name, true});
    const int32_t id = rule_id(name);
    current_ = name;
    ARBOR_ASSIGN_OR_RETURN(Expr body, parse_alternatives(false));
    grammar_.rules[static_cast<size_t>(id)].body = std::move(body);
    if (!at_end() && peek() != '\n') {
      return error(str_cat("unexpected '", std::string(1, peek()), "' in rule '", name, "'"));
    }
    return ok_status();
  }

  Result<Expr> parse_alternatives(bool nested) {
    std::vector<Expr> alts;
    ARBOR_ASSIGN_OR_RETURN(Expr first, parse_sequence(nested));
    alts.push_back(std::move(first));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      ARBOR_ASSIGN_OR_RETURN(Expr next, parse_sequence(nested));
      alts.push_back(std::move(next));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return make_list(Expr::Kind::kAlt, std::move(alts));
  }

  Result<Expr> parse_sequence(bool nested) {
    std::vector<Expr> items;
    while (!at_end()) {
      const char c = peek();
      if (c == '|' || c == ')' || c == '\n') break;
      ARBOR_ASSIGN_OR_RETURN(Expr atom, parse_atom(nested));
      ARBOR_ASSIGN_OR_RETURN(Expr item, parse_postfix(std::move(atom)));
      items.push_back(std::move(item));
      skip_space(nested);
    }
    if (items.empty()) return Expr{};
    if (items.size() == 1) return std::move(items[0]);
    return make_list(Expr::Kind::kSeq, std::move(items));
  }

  Result<Expr> parse_atom(bool nested) {
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      Expr any;
      any.kind = Expr::Kind::kClass;
      any.negated = true;
      return any;
    }
    if (c == '(') {
      ++pos_;
      skip_space(true);
      ARBOR_ASSIGN_OR_RETURN(Expr inner, parse_alternatives(true));
      if (peek() != ')') return error("expected ')'");
      ++pos_;
      return inner;
    }
    if (is_name_char(c)) {
      const std::string name = parse_name();
      first_use_.emplace(name, current_);
      Expr ref;
      ref.kind = Expr::Kind::kRule;
      ref.rule = rule_id(name);
      return ref;
    }
    (void)nested;
    return error(str_cat("unexpected '", std::string(1, c), "'"));
  }

  // One code point of a literal or class, decoding UTF-8 and escapes.
  Result<uint32_t> parse_char() {
    if (at_end()) return error("unexpected end of grammar");
    const auto byte = static_cast<unsigned char>(text_[pos_]);
    if (byte == '\\') {
      ++pos_;
      if (at_end()) return error("unexpected end after '\\'");
      const char e = text_[pos_++];
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint32_t>(e);
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        default:
          --pos_;
          return error(str_cat("unknown escape '\\", std::string(1, e), "'"));
      }
    }
    int len = byte < 0x80         ? 1
              : (byte >> 5) == 6  ? 2
              : (byte >> 4) == 14 ? 3
              : (byte >> 3) == 30 ? 4
                                  : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > text_.size()) {
      return error("invalid UTF-8 in grammar text");
    }
    uint32_t cp = len == 1 ? byte : byte & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + static_cast<size_t>(i)]);
      if ((b & 0xC0) != 0x80) return error("invalid UTF-8 in grammar text");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += static_cast<size_t>(len);
    return cp;
  }

  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) return error(str_cat("expected ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodepoint) return error("code point above U+10FFFF");
    return v;
  }

  Result<Expr> parse_literal() {
    ++pos_;  // "
    std::string bytes;
    while (peek() != '"') {
      if (at_end() || peek() == '\n') return error("unterminated literal");
      ARBOR_ASSIGN_OR_RETURN(uint32_t cp, parse_char());
      append_utf8(cp, bytes);
    }
    ++pos_;
    if (bytes.empty()) return Expr{};
    Expr lit;
    lit.kind = Expr::Kind::kLiteral;
    lit.literal = std::move(bytes);
    return lit;
  }

  Result<Expr> parse_class() {
    ++pos_;  // [
    Expr e;
    e.kind = Expr::Kind::kClass;
    if (peek() == '^') {
      e.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end() || peek() == '\n') return error("unterminated character class");
      ARBOR_ASSIGN_OR_RETURN(uint32_t lo, parse_char());
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        ARBOR_ASSIGN_OR_RETURN(hi, parse_char());
        if (hi < lo) return error("character class range out of order");
      }
      e.ranges.push_back({lo, hi});
    }
    ++pos_;
    return e;
  }

  Result<int32_t> parse_int() {
    const size_t start = pos_;
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) return error(str_cat("repetition count above ", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) return error("expected a number in {m,n}");
    return static_cast<int32_t>(v);
  }

  Result<Expr> parse_postfix(Expr atom) {
    const char c = peek();
    int32_t min = 0, max = -1;
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      ++pos_;
      min = 1;
    } else if (c == '?') {
      ++pos_;
      max = 1;
    } else if (c == '{') {
      ++pos_;
      skip_space(false);
      ARBOR_ASSIGN_OR_RETURN(min, parse_int());
      skip_space(false);
      max = min;
      if (peek() == ',') {
        ++pos_;
        skip_space(false);
        max = -1;
        if (peek() != '}') {
          ARBOR_ASSIGN_OR_RETURN(max, parse_int());
          if (max < min) return error("{m,n} with n < m");
        }
        skip_space(false);
      }
      if (peek() != '}') return error("expected '}'");
      ++pos_;
    } else {
      return atom;
    }
    Expr rep = make_list(Expr::Kind::kRepeat, {});
    rep.children.push_back(std::move(atom));
    rep.min = min;
    rep.max = max;
    return rep;
  }

  std::string_view text_;
  size_t pos_ = 0;
  Grammar grammar_;
  std::map<std::string, int32_t> ids_;
  std::map<std::string, bool> defined_;
  std::map<std::string, std::string> first_use_;  // rule -> the rule that first used it
  std::string current_;
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text, std::string_view root) {
  return Parser(text).parse(root);
}

}  // namespace arbor::grammar
