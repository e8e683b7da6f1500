// Regex pre-tokenisation with PCRE2 (internal to arbor_tokenizer).
//
// A RegexSplitter applies a sequence of patterns the way llama.cpp's unicode_regex_split and
// Hugging Face's Split(behavior = "Isolated") do: each pattern runs over every piece produced
// by the previous one, and both the matches and the text between them become pieces. A piece
// is matched on its own, so lookaheads and `$` see the piece's end as the end of the text.
//
// Thread-safety: split() may be called from many threads at once (the compiled patterns are
// immutable; each call uses its own match data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace arbor::tokenizer::internal {

// [begin, end) byte offsets into the text given to split().
using Span = std::pair<uint32_t, uint32_t>;

class RegexSplitter {
 public:
  // Compiles `patterns` (PCRE2 syntax, UTF + UCP, `$` matches only at the very end, \s is
  // Unicode's White_Space: see spell_out_white_space).
  static Result<RegexSplitter> create(const std::vector<std::string>& patterns);

  RegexSplitter() = default;
  bool empty() const { return patterns_.empty(); }

  // Splits `text`, which must be valid UTF-8 and shorter than 4 GiB, into non-empty pieces that
  // cover it in order.
  std::vector<Span> split(std::string_view text) const;

 private:
  struct Compiled;
  std::vector<std::shared_ptr<const Compiled>> patterns_;
};

// `pattern` with \s (and \S outside character classes) replaced by Unicode's White_Space set,
// which RegexSplitter::create() does to every pattern: PCRE2's \s also matches U+180E, which
// llama.cpp's and Hugging Face's do not.
std::string spell_out_white_space(std::string_view pattern);

// What llama.cpp does for the `tokenizer.ggml.pre` values of a BPE ("gpt2") vocabulary that
// share one pre-tokenizer type (llama-vocab.cpp: the name -> type table in
// llama_vocab::impl::load, the type -> regexes table in llm_tokenizer_bpe).
struct PreTokenizerSpec {
  std::vector<std::string_view> names;  // the tokenizer.ggml.pre values selecting it
  std::vector<std::string> patterns;    // applied in sequence, as RegexSplitter does
  bool ignore_merges = false;   // a piece that is itself a token is emitted whole
  bool add_bos = false;         // default of tokenizer.ggml.add_bos_token
  bool no_default_bos = false;  // no BOS token unless tokenizer.ggml.bos_token_id names one
};

// The spec for `pre_name` ("" selects "default", as llama.cpp does for a missing key), or
// kUnimplemented naming `pre_name` and listing every supported name.
Result<PreTokenizerSpec> bpe_pre_tokenizer(std::string_view pre_name);

// Every name bpe_pre_tokenizer() accepts, sorted ("" left out).
std::vector<std::string_view> supported_pre_names();

// The name llama.cpp writes to `tokenizer.ggml.pre` for a tokenizer.json whose pre-tokeniser
// patterns are `patterns` (as bpe_pre_tokenizer or a Hugging Face Split would give them), or "".
std::string pre_name_for_patterns(const std::vector<std::string>& patterns);

}  // namespace arbor::tokenizer::internal
