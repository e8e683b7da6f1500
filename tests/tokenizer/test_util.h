// Shared helpers for the tokenizer tests: cached tokenizers (loading the large tokenizer.json
// files once keeps the suite fast under ASan).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/shared_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace arbor::tokenizer::testing {

using ::arbor::test::shared_path;

// The tokenizer at shared/<rel>, loaded once per process. Fails the current test and returns
// nullptr when the file is missing (the message names the path) or does not load.
inline const Tokenizer* cached_tokenizer(const std::string& rel) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(rel);
  if (it != cache.end()) return it->second.get();
  if (!::arbor::test::expect_shared_file(rel)) return nullptr;
  auto tok = Tokenizer::from_file(shared_path(rel));
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return nullptr;
  return (cache[rel] = std::move(tok).value()).get();
}

// Declares `var`, the cached tokenizer at shared/<rel>; returns from the test, which has failed
// already, when the tokenizer is missing or does not load.
#define ARBOR_TOKENIZER_OR_FAIL(var, rel)                                 \
  const ::arbor::tokenizer::Tokenizer* var =                              \
      ::arbor::tokenizer::testing::cached_tokenizer(rel);                 \
  if (var == nullptr) return

inline std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Multilingual, emoji, code and whitespace-heavy texts for round trips and streaming.
inline const std::vector<std::string>& sample_texts() {
  static const std::vector<std::string> kTexts = {
      "Hello world! The quick brown fox jumps over the lazy dog.",
      " leading space, trailing space ",
      "Grüße aus Köln — naïve café, Ångström, ½ + ¾ = 1¼",
      "Привет, мир! Καλημέρα κόσμε. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया",
      "日本語のテキスト、中文文本，한국어 텍스트",
      "emoji: 🦙🚀 😶‍🌫️ 👩🏽‍💻 ✅ 🇫🇷",
      "code:\n\tfor (int i = 0; i < n; ++i) {\n\t\tx += a[i];   // sum\n\t}\n\n",
      "numbers 3.14159 1234567890 0x1F 1e-9",
      "ខ្មែរ ภาษาไทย ᎣᏏᏲ",
  };
  return kTexts;
}

// Feeds ids one at a time; checks every delta and that the stream equals decode().
inline void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, DecodeOptions opts,
                         const std::string& what) {
  IncrementalDetokenizer detok(tok, opts);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string delta = detok.add(id);
    ASSERT_TRUE(internal::is_valid_utf8(delta)) << what << ": delta after id " << id;
    EXPECT_LE(detok.num_pending_bytes(), 3u) << what;
    streamed += delta;
  }
  streamed += detok.flush();
  EXPECT_EQ(detok.num_pending_bytes(), 0u);
  EXPECT_EQ(streamed, tok.decode(ids, opts)) << what << ": ids " << ids_to_string(ids);
}

// For vocabularies that lose nothing (byte-level BPE, SentencePiece with byte fallback):
// decode(encode(s)) == s with and without BOS (encode's dummy prefix is removed by decode), and
// streaming the ids reproduces decode() with and without special tokens.
inline void check_lossless(const Tokenizer& tok, const std::string& what) {
  for (const std::string& text : sample_texts()) {
    for (bool bos : {false, true}) {
      const auto ids = tok.encode(text, {.add_bos = bos});
      EXPECT_EQ(tok.decode(ids), text) << what << " bos=" << bos << " ids " << ids_to_string(ids);
      for (bool skip : {true, false}) check_stream(tok, ids, {.skip_special = skip}, what);
    }
  }
}

}  // namespace arbor::tokenizer::testing
