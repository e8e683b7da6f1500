#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstdio>

#include "base/log.h"
#include "tokenizer/utf8.h"

namespace arbor::tokenizer::internal {

namespace {

// Texts llama.cpp treats as end-of-generation markers when the vocabulary has them.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>",    "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<|end_of_text|>", "<EOT>",   "_<EOT>",        "<|return|>",
    "<|call|>",
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xXX>" token, or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = hex_digit(text[3]), lo = hex_digit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

Status build_token_map(Vocab& v, std::string_view source) {
  v.token_to_id.clear();
  v.token_to_id.reserve(v.tokens.size() * 2);
  for (int32_t i = 0; i < v.size(); ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = str_cat("[EMPTY_", i, "]");
    auto [it, inserted] = v.token_to_id.emplace(v.tokens[i], i);
    if (!inserted) {
      return data_loss(source, ": duplicate token '", v.tokens[i], "' has ids ", it->second,
                       " and ", i);
    }
  }
  return ok_status();
}

void build_merge_table(Vocab& v) {
  v.merge_table.clear();
  v.merge_table.reserve(v.merges.size() * 2);
  std::string joined;
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const auto& [left, right] = v.merges[rank];
    joined.assign(left).append(right);
    const int32_t l = v.find(left), r = v.find(right), m = v.find(joined);
    // A merge whose parts or result are not tokens can never fire in an id-based merge loop.
    if (l < 0 || r < 0 || m < 0) continue;
    const uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r);
    v.merge_table.emplace(key, MergeResult{static_cast<int32_t>(rank), m});
  }
}

void build_byte_tokens(Vocab& v) {
  v.byte_tokens.assign(256, -1);
  const auto& tables = byte_level_tables();
  for (int b = 0; b < 256; ++b) {
    if (v.byte_level) {
      v.byte_tokens[b] = v.find(tables.byte_to_utf8[b]);
      continue;
    }
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.byte_tokens[b] = v.find(buf);
    if (v.byte_tokens[b] < 0 && v.kind == ModelKind::kSpm) {
      v.byte_tokens[b] = v.find(std::string(1, static_cast<char>(b)));  // llama.cpp's fallback
    }
  }
}

void build_special_and_eog(Vocab& v) {
  v.special_by_length.clear();
  for (int32_t i = 0; i < v.size(); ++i) {
    const TokenType t = v.types[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      v.special_by_length.push_back(i);
    }
  }
  std::stable_sort(v.special_by_length.begin(), v.special_by_length.end(),
                   [&](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });
  std::vector<int32_t> eog;
  for (std::string_view text : kEogTexts) {
    const int32_t id = v.find(text);
    if (id < 0) continue;
    eog.push_back(id);
    if (v.eot_id < 0 && text != "<|eom_id|>") v.eot_id = id;
    if (v.eom_id < 0 && text == "<|eom_id|>") v.eom_id = id;
  }
  // o200k_harmony (gpt-oss): <|end|> ends a message, not the turn; <|return|> and <|call|> end
  // generation. llama.cpp drops <|end|> from the end-of-generation tokens when all three exist.
  const int32_t end = v.find("<|end|>");
  const bool harmony = end >= 0 && v.find("<|return|>") >= 0 && v.find("<|call|>") >= 0;
  if (harmony) {
    eog.erase(std::remove(eog.begin(), eog.end(), end), eog.end());
    if (v.eot_id == end) v.eot_id = v.find("<|return|>");
  }
  for (int32_t id : {v.eos_id, v.eot_id, v.eom_id}) {
    if (id >= 0 && !(harmony && id == end)) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  v.eog_ids = std::move(eog);
}

}  // namespace

bool split_merge(std::string_view merge, std::string& left, std::string& right) {
  const size_t pos = merge.find(' ', 1);
  if (pos == std::string_view::npos) return false;
  left.assign(merge.substr(0, pos));
  right.assign(merge.substr(pos + 1));
  return true;
}

std::string compute_piece(const Vocab& v, int32_t id) {
  const std::string& text = v.tokens[id];
  switch (v.types[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte: {
      const int b = parse_byte_token(text);
      if (b >= 0) return std::string(1, static_cast<char>(b));
      break;
    }
    case TokenType::kUndefined:
    case TokenType::kNormal:
    case TokenType::kUnused:
      break;
  }
  if (v.byte_level) return byte_level_decode(text);
  if (!v.escape_whitespace) return text;
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      out.push_back(' ');
      pos += kSpaceMarker.size();
    } else {
      out.push_back(text[pos++]);
    }
  }
  return out;
}

Status Vocab::finalize(std::string_view source) {
  const size_t n = tokens.size();
  if (n == 0) return data_loss(source, ": the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return out_of_range(source, ": vocabulary too large");
  if (scores.empty()) scores.assign(n, 0.0f);
  if (types.empty()) types.assign(n, TokenType::kNormal);
  lstrip.resize(n, 0);
  rstrip.resize(n, 0);
  if (scores.size() != n || types.size() != n) {
    return data_loss(source, ": ", n, " tokens but ", scores.size(), " scores and ",
                     types.size(), " token types");
  }
  ARBOR_RETURN_IF_ERROR(build_token_map(*this, source));
  for (int32_t* id : {&bos_id, &eos_id, &unk_id, &pad_id, &eot_id, &eom_id}) {
    if (*id >= size()) {
      ARBOR_LOG(kWarn) << source << ": special token id " << *id << " is outside the vocabulary ("
                       << size() << " tokens); ignoring it";
      *id = -1;
    }
  }
  if (add_bos && bos_id < 0) return data_loss(source, ": add_bos is set but there is no BOS token");
  if (add_eos && eos_id < 0) return data_loss(source, ": add_eos is set but there is no EOS token");
  if (kind == ModelKind::kBpe) build_merge_table(*this);
  build_byte_tokens(*this);
  build_special_and_eog(*this);
  if (kind == ModelKind::kSpm) {
    spm_independent_words = std::none_of(tokens.begin(), tokens.end(), [](const std::string& t) {
      for (size_t pos = t.find(kSpaceMarker, 1); pos != std::string::npos;
           pos = t.find(kSpaceMarker, pos + 1)) {
        if (pos < kSpaceMarker.size() ||
            t.compare(pos - kSpaceMarker.size(), kSpaceMarker.size(), kSpaceMarker) != 0) {
          return true;
        }
      }
      return false;
    });
  }
  pieces.resize(n);
  for (int32_t i = 0; i < size(); ++i) pieces[i] = compute_piece(*this, i);
  return ok_status();
}

}  // namespace arbor::tokenizer::internal
