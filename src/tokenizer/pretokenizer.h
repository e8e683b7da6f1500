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
  // Compiles `patterns` (PCRE2 syntax, UTF + UCP, `$` matches only at the very end).
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

// The pre-tokeniser patterns llama.cpp uses for a GGUF `tokenizer.ggml.pre` value of a BPE
// ("gpt2") vocabulary. kUnimplemented for names arbor does not know.
Result<std::vector<std::string>> bpe_pre_patterns(std::string_view pre_name);

// The name llama.cpp writes to `tokenizer.ggml.pre` for a tokenizer.json whose pre-tokeniser
// patterns are `patterns` (as bpe_pre_patterns or a Hugging Face Split would give them), or "".
std::string pre_name_for_patterns(const std::vector<std::string>& patterns);

// Pre-tokenisers with behaviour beyond the patterns.
bool pre_ignores_merges(std::string_view pre_name);
bool pre_adds_bos(std::string_view pre_name);

}  // namespace arbor::tokenizer::internal
