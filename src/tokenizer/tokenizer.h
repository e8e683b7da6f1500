// Text <-> token ids for the models arbor serves.
//
// Two vocabulary families, loaded from a GGUF file's `tokenizer.ggml.*` metadata or from a
// Hugging Face tokenizer.json (+ tokenizer_config.json beside it):
//   * SentencePiece-style ("llama" in GGUF): spaces become U+2581 "▁", a dummy-prefix space
//     starts the text, pieces merge by score as llama.cpp's SPM tokenizer does, and characters
//     without a token fall back to <0xXX> byte tokens.
//   * BPE ("gpt2" in GGUF, model type "BPE" in tokenizer.json): a pre-tokeniser splits the text
//     with the model's regexes (PCRE2), then merges run by rank inside each piece. Byte-level
//     vocabularies (GPT-2, Llama 3, Qwen) encode bytes in GPT-2's printable alphabet; BPE
//     vocabularies with a SentencePiece-style normaliser (Llama 2 and TinyStories tokenizer.json)
//     work on "▁"-escaped text with byte fallback.
// Special and added tokens are split out of the text before any of this (see EncodeOptions).
//
// Not supported: WordPiece (BERT), Unigram (T5), the NFC normaliser (Qwen's tokenizer.json asks
// for it; text is used as given), clean_up_tokenization_spaces when decoding.
//
// Thread-safety: a Tokenizer is immutable after loading; every const method may run on many
// threads at once. An IncrementalDetokenizer belongs to one thread (one per request).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace arbor::tokenizer {

namespace internal {
struct Vocab;
class RegexSplitter;
}  // namespace internal

struct EncodeOptions {
  // Prepend BOS / append EOS. nullopt (the default): do what the vocabulary asks for
  // (tokenizer.ggml.add_bos_token / add_eos_token, or tokenizer_config.json's add_bos_token).
  std::optional<bool> add_bos = std::nullopt;
  std::optional<bool> add_eos = std::nullopt;
  // Recognise control tokens ("<|eot_id|>", "<s>") written in the text, as llama.cpp's
  // parse_special. When false they are ordinary text. User-defined (non-special added) tokens
  // are always recognised, as Hugging Face and llama.cpp do.
  bool parse_special = false;
  // With parse_special: byte ranges [first, second) of the text, sorted and disjoint, inside
  // which control tokens are ordinary text (chat message content, so that a user cannot type
  // "<|im_end|>" and speak as another role). Text around them is tokenised exactly as without
  // the ranges: a range only stops matches that overlap it.
  std::vector<std::pair<size_t, size_t>> literal_ranges = {};
};

struct DecodeOptions {
  // Drop control and unknown tokens (BOS, EOS, <unk>, chat markers). Default true.
  bool skip_special = true;
  // Sorted ids of control tokens written even with skip_special: a thinking model's markers
  // ([THINK], [/THINK]) that the server's reasoning parser must see.
  std::vector<int32_t> keep_special = {};
};

class Tokenizer {
 public:
  // From an open GGUF model or vocab-only file. Errors name the file and the key.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::GgufFile& file);
  // From a Hugging Face tokenizer.json; reads tokenizer_config.json in the same directory when
  // present (bos/eos/unk tokens, add_bos_token/add_eos_token, chat_template).
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const std::string& path);
  // A .gguf file, a tokenizer.json, or a directory holding tokenizer.json (decided by the
  // file's first bytes, not its name).
  static Result<std::unique_ptr<Tokenizer>> from_file(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. Invalid UTF-8 in text that goes through a regex pre-tokeniser is
  // replaced by U+FFFD first (as llama.cpp does); SentencePiece vocabularies keep the bytes.
  // O(n log n) in the text length. `text` must be shorter than 4 GiB (CHECKed).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // True when `text` contains the text of a control token (what parse_special would turn into
  // one).
  bool contains_control_text(std::string_view text) const;

  // Text of `ids`, always valid UTF-8: byte sequences that do not form UTF-8 become U+FFFD
  // (one per maximal invalid subpart). SentencePiece-style vocabularies drop the dummy-prefix
  // space of the first piece that produces text. Ids outside [0, vocab_size) are skipped.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // Raw bytes of one token (possibly part of a UTF-8 character); special tokens give their
  // text. No dummy-prefix stripping. "" for ids outside [0, vocab_size).
  const std::string& token_to_piece(int32_t id) const;
  // The token's text as stored in the vocabulary ("▁the", "Ġthe", "<0x0A>").
  const std::string& token_text(int32_t id) const;
  // -1 when the text is not a single token.
  int32_t token_id(std::string_view text) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 if none
  int32_t eos_id() const;  // -1 if none
  int32_t unk_id() const;  // -1 if none
  int32_t pad_id() const;  // -1 if none
  bool add_bos() const;    // the vocabulary's default for EncodeOptions::add_bos
  bool add_eos() const;
  // Every id that ends generation: EOS plus end-of-turn markers found in the vocabulary
  // (<|eot_id|>, <|im_end|>, <|end|>, <|endoftext|>, <end_of_turn>, ...). Sorted.
  std::vector<int32_t> eog_ids() const;
  bool is_eog(int32_t id) const;
  // Control or unknown tokens (what DecodeOptions::skip_special drops).
  bool is_special(int32_t id) const;
  // "llama" (SentencePiece-style) or "gpt2" (byte-level BPE) as in tokenizer.ggml.model;
  // "llama" also for BPE with a SentencePiece-style normaliser.
  std::string model_name() const;
  // tokenizer.ggml.pre ("llama-bpe", "qwen2", "gpt-2", ...; "default" for SentencePiece).
  const std::string& pre_name() const;
  // One line for people: model, pre-tokenizer, size, BOS/EOS, e.g.
  // "gpt2 (byte-level BPE), pre-tokenizer tekken (ignore_merges), 131072 tokens, BOS 1 added,
  // EOS 2".
  std::string summary() const;
  // Jinja chat template from the file ("" when absent).
  const std::string& chat_template() const;

  // The tokenizer as GGUF metadata (tokenizer.ggml.model, .pre, .tokens, .scores, .token_type,
  // .merges, special token ids, add_bos/add_eos/add_space_prefix, tokenizer.chat_template) in
  // the layout llama.cpp reads, so from_gguf() of a file carrying them encodes identically.
  std::vector<gguf::KeyValue> to_gguf_metadata() const;

  // Appends the decoded bytes of `id` (before UTF-8 repair) to `out`, applying skip_special
  // and the dummy-prefix rule; `*at_start` says no text has been produced yet and is updated.
  // The building block shared by decode() and IncrementalDetokenizer.
  void append_token_bytes(int32_t id, const DecodeOptions& options, bool* at_start,
                          std::string& out) const;

 private:
  Tokenizer(std::unique_ptr<internal::Vocab> vocab, std::unique_ptr<internal::RegexSplitter> pre,
            std::string chat_template);
  static Result<std::unique_ptr<Tokenizer>> build(std::unique_ptr<internal::Vocab> vocab,
                                                  std::string_view source,
                                                  std::string chat_template);
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const;

  std::unique_ptr<internal::Vocab> vocab_;
  std::unique_ptr<internal::RegexSplitter> pre_;
  std::string chat_template_;
};

// Streams decoded text token by token. Every returned delta is valid UTF-8: bytes of a
// character split across tokens are held back until it completes, and the concatenation of
// all deltas plus flush() equals Tokenizer::decode() of the same ids with the same options.
// The Tokenizer must outlive it. Not thread-safe (one per request).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // Text completed by this token ("" while a character is still incomplete).
  std::string add(int32_t id);
  // Ends the stream: held bytes that never completed a character come out as U+FFFD.
  std::string flush();
  // Starts a new stream.
  void reset();
  // Bytes held back waiting for the rest of a character (0 to 3).
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  bool at_start_ = true;
  std::string pending_;
};

}  // namespace arbor::tokenizer
