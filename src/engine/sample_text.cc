#include "engine/sample_text.h"

#include <algorithm>
#include <utility>

namespace arbor::engine {

SampleText::SampleText(const tokenizer::Tokenizer& tokenizer,
                       std::span<const int32_t> prompt_ids, std::vector<std::string> stop_strings,
                       std::vector<int32_t> keep_special)
    : detok_(tokenizer, tokenizer::DecodeOptions{.skip_special = true,
                                                 .keep_special = std::move(keep_special)}),
      stops_(std::move(stop_strings)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  const size_t n = std::min(prompt_ids.size(), kPrimeTokens);
  for (int32_t id : prompt_ids.last(n)) detok_.add(id);
  // A prompt ending inside a character leaves its bytes pending; output text starts fresh.
  detok_.flush();
}

size_t SampleText::held_suffix() const {
  size_t best = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > best; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

SampleText::Delta SampleText::add(int32_t token_id) {
  pending_ += detok_.add(token_id);
  Delta d;
  size_t first = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      matched = &s;
    }
  }
  if (matched != nullptr) {
    d.text = pending_.substr(0, first);
    d.stopped = true;
    d.stop_string = *matched;
    pending_.clear();
    return d;
  }
  const size_t emit = pending_.size() - held_suffix();
  d.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return d;
}

std::string SampleText::finish() {
  pending_ += detok_.flush();
  std::string text = std::move(pending_);
  pending_.clear();
  return text;
}

Result<SampleText> SampleText::replay(const tokenizer::Tokenizer& tokenizer,
                                     std::span<const int32_t> prompt_ids,
                                     std::vector<std::string> stop_strings,
                                     std::vector<int32_t> keep_special,
                                     std::span<const int32_t> output_ids, int64_t text_bytes) {
  SampleText text(tokenizer, prompt_ids, std::move(stop_strings), std::move(keep_special));
  int64_t emitted = 0;
  for (size_t i = 0; i < output_ids.size(); ++i) {
    Delta d = text.add(output_ids[i]);
    if (d.stopped) {
      return invalid_argument("resumed token ", i, " completes the stop string '", d.stop_string,
                              "': the sample had ended");
    }
    emitted += static_cast<int64_t>(d.text.size());
  }
  if (text_bytes >= 0 && text_bytes != emitted) {
    return invalid_argument("resumed sample: its ", output_ids.size(), " tokens emit ", emitted,
                            " bytes of text, the client received ", text_bytes);
  }
  return text;
}

}  // namespace arbor::engine
