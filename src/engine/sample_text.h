// The text side of one sample: incremental detokenisation plus stop strings.
//
// Every delta is valid UTF-8 (IncrementalDetokenizer holds back a split character). Text that
// might be the start of a stop string is held back until it is known not to be one; on a match,
// the text before the stop string is emitted and the stop string and anything after it never
// are. Deltas concatenated with finish() equal the sample's text cut before the first stop
// string (or the whole decode when none matched).
//
// Thread-safety: one per sample, engine thread only. The tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {

class SampleText {
 public:
  // The last few prompt tokens prime the detokenizer (so a word-initial space of the first
  // output token comes out as in a decode of prompt + output) and produce no text; only the last
  // kPrimeTokens of `prompt_ids` are read, so the cost does not grow with the prompt.
  // keep_special: sorted ids of control tokens whose text is written (DecodeOptions).
  SampleText(const tokenizer::Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
             std::vector<std::string> stop_strings, std::vector<int32_t> keep_special = {});
  // Enough context for any tokenizer's decode of the next token: a leading-space rule looks at
  // one token back, and a character split into byte tokens spans at most 4.
  static constexpr size_t kPrimeTokens = 4;

  struct Delta {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; the sample must end here
    std::string stop_string;  // when stopped: the stop string that matched (first in the text)
  };
  // Adds one generated token. After `stopped`, add() must not be called again.
  Delta add(int32_t token_id);
  // The sample ended (not by a stop string): the held-back text and any incomplete character.
  std::string finish();

  // The state after `output_ids` were added one by one (the emitted text is a function of the
  // tokens alone, not of how steps grouped them), for a sample resumed elsewhere
  // (GenerateRequest::resume). Errors: a stop string matches within output_ids (the sample had
  // ended), or text_bytes >= 0 differs from the bytes the replay emitted (the caller's record of
  // what its client received is not this tokenizer's text).
  static Result<SampleText> replay(const tokenizer::Tokenizer& tokenizer,
                                   std::span<const int32_t> prompt_ids,
                                   std::vector<std::string> stop_strings,
                                   std::vector<int32_t> keep_special,
                                   std::span<const int32_t> output_ids, int64_t text_bytes);

 private:
  // Length of the longest suffix of pending_ that is a proper prefix of a stop string.
  size_t held_suffix() const;

  tokenizer::IncrementalDetokenizer detok_;
  std::vector<std::string> stops_;
  std::string pending_;  // decoded, not yet emitted
};

}  // namespace arbor::engine
