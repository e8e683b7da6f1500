// The subword algorithms (internal to arbor_tokenizer). Both append token ids to `out`.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace arbor::tokenizer::internal {

// SentencePiece-style merging as llama.cpp's llm_tokenizer_spm: start from UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring token (ties:
// leftmost), then emit each symbol's token or, failing that, its bytes as <0xXX> tokens.
// `text` is already normalised (dummy prefix added, spaces escaped). O(n log n) in its length.
void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out);

// Rank-driven BPE over one pre-token. Reuses its buffers across calls; not thread-safe, so use
// one BpeEncoder per thread (encode() makes one per call).
class BpeEncoder {
 public:
  explicit BpeEncoder(const Vocab& vocab) : vocab_(vocab) {}

  // `word` is raw text (byte-level vocabularies map it to their alphabet here).
  void encode_word(std::string_view word, std::vector<int32_t>& out);

 private:
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  void initial_symbols(std::string_view word);
  void add_symbol(int32_t id);
  void push_candidate(int32_t left, int32_t right);
  void merge_all();

  const Vocab& vocab_;
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
  std::string scratch_;
};

}  // namespace arbor::tokenizer::internal
