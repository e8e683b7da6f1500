// The tokenizer's data model, shared by the GGUF and tokenizer.json loaders and the algorithms
// (internal to arbor_tokenizer; the public API is tokenizer.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace arbor::tokenizer::internal {

// GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

enum class ModelKind {
  kSpm,  // score-driven merging of any adjacent pair that forms a token (llama.cpp "llama")
  kBpe,  // rank-driven merges from a merge list (GGUF "gpt2", tokenizer.json "BPE")
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct MergeResult {
  int32_t rank;
  int32_t id;  // the merged token
};

struct Vocab {
  ModelKind kind = ModelKind::kSpm;
  std::string pre_name;  // GGUF tokenizer.ggml.pre ("" when unknown)

  std::vector<std::string> tokens;  // [vocab_size] token text as stored in the vocabulary
  std::vector<float> scores;        // [vocab_size]
  std::vector<TokenType> types;     // [vocab_size]
  std::vector<uint8_t> lstrip;      // [vocab_size] strip whitespace left of this special token
  std::vector<uint8_t> rstrip;      // [vocab_size] strip whitespace right of it
  // [num_merges] "left right" pairs in rank order (BPE only), kept for GGUF export.
  std::vector<std::pair<std::string, std::string>> merges;

  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1, eom_id = -1;
  bool add_bos = false, add_eos = false;

  // Normalisation and pre-tokenisation.
  bool add_space_prefix = false;    // prepend a space to text that starts the input or follows
                                    // a special token (SentencePiece's dummy prefix)
  bool escape_whitespace = false;   // ' ' -> U+2581 before the model runs
  bool byte_level = false;          // GPT-2 byte-level alphabet (BPE only)
  bool byte_fallback = false;       // unknown characters become <0xXX> tokens (BPE only)
  bool ignore_merges = false;       // a pre-token that is itself a token is emitted whole
  std::vector<std::string> pre_regexes;  // applied in sequence (PCRE2 syntax); empty: no split

  // Derived by finalize().
  TokenMap token_to_id;
  std::unordered_map<uint64_t, MergeResult> merge_table;  // key: left_id << 32 | right_id
  std::vector<int32_t> byte_tokens;  // [256] id of the token for each raw byte, -1 if none
  std::vector<int32_t> special_by_length;  // control/user-defined/unknown ids, longest first
  std::vector<int32_t> eog_ids;            // sorted
  std::vector<std::string> pieces;         // [vocab_size] decoded bytes of each token
  // SPM only: no token has "▁" right after another character, so no merge can cross the start
  // of a "▁" run and the text may be merged run by run (same result, far smaller heaps).
  bool spm_independent_words = false;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < size(); }
  int32_t find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  bool is_special(int32_t id) const {
    return types[id] == TokenType::kControl || types[id] == TokenType::kUnknown;
  }

  // Validates the fields above and builds the derived tables. `source` names the file for
  // error messages.
  Status finalize(std::string_view source);
};

// Decoded bytes of a token: ▁ -> ' ' for SentencePiece-style vocabularies, the byte-level
// alphabet mapped back to bytes, <0xXX> to its byte, special tokens as their text.
std::string compute_piece(const Vocab& vocab, int32_t id);

// Splits "left right" (the first space after position 0 separates them).
bool split_merge(std::string_view merge, std::string& left, std::string& right);

}  // namespace arbor::tokenizer::internal
