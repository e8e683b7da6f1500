#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iterator>

#include "tokenizer/models.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace arbor::tokenizer {

using internal::ModelKind;
using internal::Vocab;

namespace {

// A stretch of input: raw text [begin, end) or one special token.
struct Fragment {
  uint32_t begin;
  uint32_t end;
  int32_t token;  // -1 for text
};

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Splits one text fragment on every occurrence of special token `id` (llama.cpp's
// tokenizer_st_partition), honouring the token's lstrip/rstrip flags.
using Ranges = std::vector<std::pair<size_t, size_t>>;

// Whether [begin, end) overlaps one of the sorted, disjoint `ranges`.
bool overlaps(const Ranges& ranges, size_t begin, size_t end) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(),
                             std::pair<size_t, size_t>(begin, SIZE_MAX));
  if (it != ranges.begin() && std::prev(it)->second > begin) return true;
  return it != ranges.end() && it->first < end;
}

void split_on_token(const Vocab& v, std::string_view text, int32_t id, const Fragment& f,
                    const Ranges& literal, std::vector<Fragment>& out) {
  const std::string& tok = v.tokens[id];
  const bool control = v.types[id] != internal::TokenType::kUserDefined;
  uint32_t begin = f.begin;
  size_t from = begin;
  while (begin < f.end) {
    size_t match = text.substr(0, f.end).find(tok, from);
    while (match != std::string_view::npos && control &&
           overlaps(literal, match, match + tok.size())) {
      match = text.substr(0, f.end).find(tok, match + 1);  // text there: look further
    }
    if (match == std::string_view::npos) break;
    uint32_t left_end = static_cast<uint32_t>(match);
    if (v.lstrip[id]) {
      while (left_end > begin && is_space(text[left_end - 1])) --left_end;
    }
    if (left_end > begin) out.push_back({begin, left_end, -1});
    out.push_back({0, 0, id});
    begin = static_cast<uint32_t>(match + tok.size());
    if (v.rstrip[id]) {
      while (begin < f.end && is_space(text[begin])) ++begin;
    }
    from = begin;
  }
  if (begin < f.end) out.push_back({begin, f.end, -1});
}

std::vector<Fragment> partition_special(const Vocab& v, std::string_view text,
                                        bool parse_special, const Ranges& literal) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({0, static_cast<uint32_t>(text.size()), -1});
  std::vector<Fragment> next;
  for (int32_t id : v.special_by_length) {
    if (!parse_special && v.types[id] != internal::TokenType::kUserDefined) continue;
    const std::string& tok = v.tokens[id];
    const bool present = std::any_of(frags.begin(), frags.end(), [&](const Fragment& f) {
      return f.token < 0 && text.substr(f.begin, f.end - f.begin).find(tok) != std::string::npos;
    });
    if (!present) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
      } else {
        split_on_token(v, text, id, f, literal, next);
      }
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Vocab> vocab, std::unique_ptr<internal::RegexSplitter> pre,
                     std::string chat_template)
    : vocab_(std::move(vocab)), pre_(std::move(pre)), chat_template_(std::move(chat_template)) {}

Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::build(std::unique_ptr<Vocab> vocab,
                                                    std::string_view source,
                                                    std::string chat_template) {
  ARBOR_RETURN_IF_ERROR(vocab->finalize(source));
  auto splitter = internal::RegexSplitter::create(vocab->pre_regexes);
  if (!splitter.ok()) return splitter.status().with_context(source);
  auto pre = std::make_unique<internal::RegexSplitter>(std::move(splitter).value());
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(std::move(vocab), std::move(pre), std::move(chat_template)));
}

void Tokenizer::encode_text(std::string_view raw, bool after_special,
                            std::vector<int32_t>& out) const {
  const Vocab& v = *vocab_;
  std::string text;
  if (v.add_space_prefix && after_special) text.push_back(' ');
  text.append(raw);
  if (v.escape_whitespace) {
    std::string escaped;
    escaped.reserve(text.size() + text.size() / 2);
    for (char c : text) {
      if (c == ' ') {
        escaped.append(internal::kSpaceMarker);
      } else {
        escaped.push_back(c);
      }
    }
    text.swap(escaped);
  }
  if (v.kind == ModelKind::kSpm) {
    internal::spm_encode(v, text, out);
    return;
  }
  internal::BpeEncoder bpe(v);
  if (pre_->empty()) {
    bpe.encode_word(text, out);
    return;
  }
  if (!internal::is_valid_utf8(text)) {
    std::string repaired;
    internal::append_utf8_like_llama_cpp(text, repaired);
    text.swap(repaired);
  }
  for (const internal::Span& s : pre_->split(text)) {
    bpe.encode_word(std::string_view(text).substr(s.first, s.second - s.first), out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       const EncodeOptions& options) const {
  const Vocab& v = *vocab_;
  ARBOR_CHECK_LT(text.size(), size_t{UINT32_MAX}) << "encode() takes text below 4 GiB";
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_bos.value_or(v.add_bos) && v.bos_id >= 0) out.push_back(v.bos_id);
  bool after_special = true;  // the start of the text counts as following a special token
  for (const Fragment& f :
       partition_special(v, text, options.parse_special, options.literal_ranges)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_text(text.substr(f.begin, f.end - f.begin), after_special, out);
      after_special = false;
    }
  }
  if (options.add_eos.value_or(v.add_eos) && v.eos_id >= 0) out.push_back(v.eos_id);
  return out;
}

bool Tokenizer::contains_control_text(std::string_view text) const {
  const Vocab& v = *vocab_;
  return std::any_of(v.special_by_length.begin(), v.special_by_length.end(), [&](int32_t id) {
    return v.types[id] != internal::TokenType::kUserDefined && !v.tokens[id].empty() &&
           text.find(v.tokens[id]) != std::string_view::npos;
  });
}

void Tokenizer::append_token_bytes(int32_t id, const DecodeOptions& options, bool* at_start,
                                   std::string& out) const {
  const Vocab& v = *vocab_;
  if (!v.valid_id(id)) return;
  if (options.skip_special && v.is_special(id) &&
      !std::binary_search(options.keep_special.begin(), options.keep_special.end(), id)) {
    return;
  }
  std::string_view piece = v.pieces[id];
  if (piece.empty()) return;
  if (*at_start && v.add_space_prefix && piece.front() == ' ') piece.remove_prefix(1);
  *at_start = false;
  out.append(piece);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string bytes;
  bool at_start = true;
  for (int32_t id : ids) append_token_bytes(id, options, &at_start, bytes);
  if (internal::is_valid_utf8(bytes)) return bytes;
  std::string text;
  internal::append_utf8_lossy(bytes, text);
  return text;
}

const std::string& Tokenizer::token_to_piece(int32_t id) const {
  static const std::string kEmpty;
  return vocab_->valid_id(id) ? vocab_->pieces[id] : kEmpty;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  static const std::string kEmpty;
  return vocab_->valid_id(id) ? vocab_->tokens[id] : kEmpty;
}

int32_t Tokenizer::token_id(std::string_view text) const { return vocab_->find(text); }
int32_t Tokenizer::vocab_size() const { return vocab_->size(); }
int32_t Tokenizer::bos_id() const { return vocab_->bos_id; }
int32_t Tokenizer::eos_id() const { return vocab_->eos_id; }
int32_t Tokenizer::unk_id() const { return vocab_->unk_id; }
int32_t Tokenizer::pad_id() const { return vocab_->pad_id; }
bool Tokenizer::add_bos() const { return vocab_->add_bos; }
bool Tokenizer::add_eos() const { return vocab_->add_eos; }
std::vector<int32_t> Tokenizer::eog_ids() const { return vocab_->eog_ids; }

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(vocab_->eog_ids.begin(), vocab_->eog_ids.end(), id);
}

bool Tokenizer::is_special(int32_t id) const {
  return vocab_->valid_id(id) && vocab_->is_special(id);
}

std::string Tokenizer::model_name() const {
  return vocab_->kind == ModelKind::kBpe && vocab_->byte_level ? "gpt2" : "llama";
}

const std::string& Tokenizer::pre_name() const { return vocab_->pre_name; }
const std::string& Tokenizer::chat_template() const { return chat_template_; }

std::string Tokenizer::summary() const {
  const Vocab& v = *vocab_;
  std::string s = model_name();
  if (v.kind == ModelKind::kSpm) {
    s += " (SentencePiece)";
  } else {
    s += v.byte_level ? " (byte-level BPE)" : " (BPE, SentencePiece-style)";
  }
  if (!v.pre_regexes.empty()) {
    s += ", pre-tokenizer " + (v.pre_name.empty() ? std::string("custom") : v.pre_name);
    if (v.ignore_merges) s += " (ignore_merges)";
  }
  if (v.add_space_prefix) s += ", space prefix";
  s += ", " + std::to_string(v.size()) + " tokens";
  if (v.bos_id >= 0) s += ", BOS " + std::to_string(v.bos_id) + (v.add_bos ? " added" : "");
  if (v.eos_id >= 0) s += ", EOS " + std::to_string(v.eos_id) + (v.add_eos ? " added" : "");
  return s;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

std::string IncrementalDetokenizer::add(int32_t id) {
  tokenizer_->append_token_bytes(id, options_, &at_start_, pending_);
  std::string text;
  const size_t consumed = internal::append_utf8_lossy_prefix(pending_, text);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  internal::append_utf8_lossy(pending_, text);
  pending_.clear();
  return text;
}

void IncrementalDetokenizer::reset() {
  at_start_ = true;
  pending_.clear();
}

}  // namespace arbor::tokenizer
