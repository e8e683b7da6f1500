// Tokenizer for the Jinja subset: template text, {{ }}, {% %}, {# #} and whitespace control.
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "base/strings.h"
#include "chat/jinja_ast.h"

namespace arbor::chat::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Token> run() {
    size_t i = 0;
    bool strip_next = false;
    while (i <= src_.size()) {
      const size_t open = find_tag(i);
      std::string text(src_.substr(i, open - i));
      if (strip_next)
        text.erase(0, std::find_if_not(text.begin(), text.end(), is_space) - text.begin());
      strip_next = false;
      if (open == src_.size()) {
        emit_text(std::move(text), i);
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        text.erase(std::find_if_not(text.rbegin(), text.rend(), is_space).base(), text.end());
      } else if (kind != '{' && mod != '+') {
        lstrip_block(text, i);
      }
      emit_text(std::move(text), i);
      i = kind == '#' ? lex_comment(open, strip_next) : lex_tag(open, kind, mod, strip_next);
    }
    push(TokKind::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  SourcePos pos_at(size_t offset) const {
    auto it = std::lower_bound(newlines_.begin(), newlines_.end(), offset);
    const size_t line = static_cast<size_t>(it - newlines_.begin());
    const size_t line_start = line == 0 ? 0 : newlines_[line - 1] + 1;
    return SourcePos{static_cast<int>(line + 1), static_cast<int>(offset - line_start + 1)};
  }

  [[noreturn]] void error(size_t offset, std::string message) const {
    throw TemplateError(TemplateError::Kind::kSyntax, pos_at(offset), std::move(message));
  }

  Token& push(TokKind kind, std::string text, size_t offset) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.pos = pos_at(offset);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) push(TokKind::kText, std::move(text), offset);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag are dropped.
  void lstrip_block(std::string& text, size_t text_offset) const {
    const size_t nl = text.rfind('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    const bool line_start =
        nl != std::string::npos || text_offset == 0 || src_[text_offset - 1] == '\n';
    if (!line_start) return;
    for (size_t k = from; k < text.size(); ++k) {
      if (text[k] != ' ' && text[k] != '\t') return;
    }
    text.erase(from);
  }

  // trim_blocks: the first newline after a block tag is dropped.
  size_t trim_newline(size_t i) const {
    if (i < src_.size() && src_[i] == '\n') return i + 1;
    if (i + 1 < src_.size() && src_[i] == '\r' && src_[i + 1] == '\n') return i + 2;
    return i;
  }

  size_t lex_comment(size_t open, bool& strip_next) {
    const size_t close = src_.find("#}", open + 2);
    if (close == std::string_view::npos) error(open, "unclosed comment: missing '#}'");
    strip_next = close > open + 2 && src_[close - 1] == '-';
    return strip_next ? close + 2 : trim_newline(close + 2);
  }

  size_t lex_tag(size_t open, char kind, char mod, bool& strip_next) {
    const bool is_var = kind == '{';
    const char close_first = is_var ? '}' : '%';
    push(is_var ? TokKind::kVarBegin : TokKind::kBlockBegin, is_var ? "{{" : "{%", open);
    size_t i = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
    int brace_depth = 0;
    while (true) {
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (i >= src_.size())
        error(open, is_var ? "unclosed '{{': missing '}}'" : "unclosed '{%': missing '%}'");
      const bool at_close =
          brace_depth == 0 && i + 1 < src_.size() && src_[i] == close_first && src_[i + 1] == '}';
      const bool mod_close = brace_depth == 0 && (src_[i] == '-' || src_[i] == '+') &&
                             i + 2 < src_.size() && src_[i + 1] == close_first &&
                             src_[i + 2] == '}';
      if (at_close || mod_close) {
        push(is_var ? TokKind::kVarEnd : TokKind::kBlockEnd, is_var ? "}}" : "%}", i);
        strip_next = mod_close && src_[i] == '-';
        const size_t end = i + (mod_close ? 3 : 2);
        const bool keep = strip_next || is_var || (mod_close && src_[i] == '+');
        return keep ? end : trim_newline(end);
      }
      i = lex_token(i, brace_depth);
    }
  }

  size_t lex_token(size_t i, int& brace_depth) {
    const char c = src_[i];
    if (is_name_start(c)) {
      size_t j = i;
      while (j < src_.size() && is_name_char(src_[j])) ++j;
      push(TokKind::kName, std::string(src_.substr(i, j - i)), i);
      return j;
    }
    if (is_digit(c)) return lex_number(i);
    if (c == '\'' || c == '"') return lex_string(i);
    static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                       ",",  ".",  ":",  "|",  "=",  "<",  ">"};
    for (const char* op : kOps) {
      const std::string_view sv(op);
      if (src_.substr(i, sv.size()) == sv) {
        if (sv == "{") ++brace_depth;
        if (sv == "}") --brace_depth;
        push(TokKind::kOp, std::string(sv), i);
        return i + sv.size();
      }
    }
    error(i, std::string("unexpected character '") + c + "'");
  }

  size_t lex_number(size_t i) {
    size_t j = i;
    while (j < src_.size() && is_digit(src_[j])) ++j;
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' && is_digit(src_[j + 1])) {
      is_float = true;
      ++j;
      while (j < src_.size() && is_digit(src_[j])) ++j;
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        is_float = true;
        j = k;
        while (j < src_.size() && is_digit(src_[j])) ++j;
      }
    }
    const std::string text(src_.substr(i, j - i));
    Token& t = push(is_float ? TokKind::kFloat : TokKind::kInt, text, i);
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error(i, "integer literal " + text + " is out of range");
    }
    return j;
  }

  size_t lex_string(size_t i) {
    const char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    while (true) {
      if (j >= src_.size()) error(i, "unterminated string literal");
      const char c = src_[j];
      if (c == quote) break;
      if (c != '\\' || j + 1 >= src_.size()) {
        out += c;
        ++j;
        continue;
      }
      j = lex_escape(j, out);
    }
    push(TokKind::kString, std::move(out), i);
    return j + 1;
  }

  // Python string escapes; an unknown escape keeps its backslash, as Python does.
  size_t lex_escape(size_t j, std::string& out) {
    const char e = src_[j + 1];
    switch (e) {
      case 'n': out += '\n'; return j + 2;
      case 't': out += '\t'; return j + 2;
      case 'r': out += '\r'; return j + 2;
      case 'b': out += '\b'; return j + 2;
      case 'f': out += '\f'; return j + 2;
      case '0': out += '\0'; return j + 2;
      case '\\':
      case '\'':
      case '"': out += e; return j + 2;
      case '\n': return j + 2;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (j + 2 + digits > src_.size()) error(j, "truncated \\" + std::string(1, e) + " escape");
        const std::string hex(src_.substr(j + 2, digits));
        char* end = nullptr;
        const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
        if (end != hex.c_str() + hex.size() || cp > 0x10FFFF)
          error(j, "invalid escape \\" + std::string(1, e) + hex);
        append_utf8(out, static_cast<uint32_t>(cp));
        return j + 2 + digits;
      }
      default:
        out += '\\';
        out += e;
        return j + 2;
    }
  }

  std::string_view src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  // Jinja2 reads \r\n and \r as \n everywhere in the source (text and string literals alike).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') {
      normalized += source[i];
    } else {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    }
  }
  std::string_view src = normalized;
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  return Lexer(src).run();
}

}  // namespace arbor::chat::jinja
