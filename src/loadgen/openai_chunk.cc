#include "loadgen/openai_chunk.h"

namespace arbor::loadgen {
namespace {

constexpr int kMaxDepth = 64;

// A cursor over JSON text that validates while it skips. Every method returns false on a
// syntax error and leaves the cursor somewhere undefined; the caller gives up.
class Skim {
 public:
  explicit Skim(std::string_view s) : s_(s) {}

  void ws() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  bool peek(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++i_;
    return true;
  }
  bool at_end() {
    ws();
    return i_ == s_.size();
  }

  // A string; `raw` receives its text between the quotes with escapes left as they are.
  bool string(std::string_view* raw) {
    if (!eat('"')) return false;
    const size_t start = i_;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '"') {
        if (raw != nullptr) *raw = s_.substr(start, i_ - start);
        ++i_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;
      i_ += c == '\\' ? 2 : 1;
    }
    return false;
  }

  bool integer(int64_t* out) {
    ws();
    bool neg = false;
    if (i_ < s_.size() && s_[i_] == '-') {
      neg = true;
      ++i_;
    }
    const size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_] - '0');
      ++i_;
    }
    if (i_ == start) return false;
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) return false;
    *out = neg ? -v : v;
    return true;
  }

  bool value(int depth = 0) {
    if (depth > kMaxDepth) return false;
    ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '"') return string(nullptr);
    if (c == '{') {
      ++i_;
      if (eat('}')) return true;
      do {
        if (!string(nullptr) || !eat(':') || !value(depth + 1)) return false;
      } while (eat(','));
      return eat('}');
    }
    if (c == '[') {
      ++i_;
      if (eat(']')) return true;
      do {
        if (!value(depth + 1)) return false;
      } while (eat(','));
      return eat(']');
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    return literal("true") || literal("false") || literal("null");
  }

  bool literal(std::string_view word) {
    ws();
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  // Visits the members of an object: `member(key)` must consume the value and return false on
  // a syntax error.
  template <typename F>
  bool object(F&& member) {
    if (!eat('{')) return false;
    if (eat('}')) return true;
    do {
      std::string_view key;
      if (!string(&key) || !eat(':') || !member(key)) return false;
    } while (eat(','));
    return eat('}');
  }

 private:
  bool number() {
    const size_t start = i_;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && ((s_[i_] >= '0' && s_[i_] <= '9') || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    return i_ > start + (s_[start] == '-' ? 1 : 0);
  }

  std::string_view s_;
  size_t i_ = 0;
};

// Reads a string-or-other value; `nonempty` is set when it is a string with text.
bool value_is_nonempty_string(Skim& k, bool* nonempty) {
  if (k.peek('"')) {
    std::string_view raw;
    if (!k.string(&raw)) return false;
    *nonempty = *nonempty || !raw.empty();
    return true;
  }
  return k.value();
}

bool chat_delta(Skim& k, bool* token) {
  if (!k.peek('{')) return k.value();
  return k.object([&](std::string_view key) {
    if (key == "content" || key == "reasoning_content") return value_is_nonempty_string(k, token);
    if (key == "tool_calls") {
      if (!k.peek('[')) return k.value();
      *token = true;
    }
    return k.value();
  });
}

bool choices(Skim& k, bool chat, bool* token) {
  if (!k.peek('[')) return k.value();
  k.eat('[');
  if (k.eat(']')) return true;
  if (!chat) *token = true;
  bool first = true;
  do {
    if (chat && first && k.peek('{')) {
      const bool ok = k.object(
          [&](std::string_view key) { return key == "delta" ? chat_delta(k, token) : k.value(); });
      if (!ok) return false;
    } else if (!k.value(1)) {
      return false;
    }
    first = false;
  } while (k.eat(','));
  return k.eat(']');
}

bool usage(Skim& k, ChunkInfo* info) {
  if (!k.peek('{')) return k.value();
  return k.object([&](std::string_view key) {
    if (key == "prompt_tokens" && !k.peek('n')) return k.integer(&info->prompt_tokens);
    if (key == "completion_tokens" && !k.peek('n')) return k.integer(&info->completion_tokens);
    return k.value(1);
  });
}

}  // namespace

ChunkInfo classify_chunk(std::string_view data, bool chat) {
  ChunkInfo info;
  Skim trimmed(data);
  if (trimmed.literal("[DONE]") && trimmed.at_end()) {
    info.done = true;
    return info;
  }
  Skim k(data);
  const bool ok = k.object([&](std::string_view key) {
    if (key == "choices") return choices(k, chat, &info.has_token);
    if (key == "usage") return usage(k, &info);
    if (key == "error") {
      info.error = !k.peek('n');
      return k.value();
    }
    return k.value();
  });
  if (!ok || !k.at_end()) {
    ChunkInfo bad;
    bad.malformed = true;
    return bad;
  }
  return info;
}

}  // namespace arbor::loadgen
