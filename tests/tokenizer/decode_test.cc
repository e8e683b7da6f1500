// Lossless round trips, streaming detokenisation, UTF-8 repair and GGUF export.
#include <gtest/gtest.h>

#include <random>

#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/utf8.h"

namespace arbor::tokenizer {
namespace {

using testing::check_lossless;
using testing::check_stream;
using testing::ids_to_string;

const char* const kLossless[] = {
    "tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf",
    "tokenizers/llamacpp-vocab/ggml-vocab-gpt-2.gguf",
    "tokenizers/llamacpp-vocab/ggml-vocab-deepseek-llm.gguf",
    "tokenizers/llamacpp-vocab/ggml-vocab-starcoder.gguf",
    "tokenizers/hf/llama2/tokenizer.json",
};
// Llama 3 and Qwen3 (slow to load under ASan) are checked in vectors_test.cc.

TEST(RoundTrip, LosslessVocabulariesStreamAndRoundTrip) {
  for (const char* rel : kLossless) {
    ARBOR_TOKENIZER_OR_FAIL(tok, rel);
    check_lossless(*tok, rel);
  }
}

// "🦙" is three GPT-2 tokens: " \xF0\x9F", "\xA6", "\x99". Nothing of the emoji may leave
// before its last byte; the space may.
TEST(IncrementalDetokenizer, HoldsBackSplitCharacter) {
  ARBOR_TOKENIZER_OR_FAIL(tok, "tokenizers/llamacpp-vocab/ggml-vocab-gpt-2.gguf");
  const auto ids = tok->encode(" 🦙!", {.add_bos = false});
  ASSERT_EQ(ids.size(), 4u) << ids_to_string(ids);
  EXPECT_EQ(tok->token_to_piece(ids[0]), " \xF0\x9F");
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.add(ids[0]), " ");
  EXPECT_EQ(detok.num_pending_bytes(), 2u);
  EXPECT_EQ(detok.add(ids[1]), "");
  EXPECT_EQ(detok.num_pending_bytes(), 3u);
  EXPECT_EQ(detok.add(ids[2]), "🦙");
  EXPECT_EQ(detok.add(ids[3]), "!");
  EXPECT_EQ(detok.flush(), "");
  // A stream cut inside the character ends with one U+FFFD, as decode() of the same ids.
  detok.reset();
  std::string cut = detok.add(ids[0]);
  cut += detok.add(ids[1]);
  cut += detok.flush();
  EXPECT_EQ(cut, " \xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{ids[0], ids[1]}), cut);
}

// SentencePiece byte tokens: an invalid byte is replaced at once; the dummy-prefix space is
// dropped once, at the start of the text, in both paths.
TEST(IncrementalDetokenizer, SpmBytesAndDummyPrefix) {
  ARBOR_TOKENIZER_OR_FAIL(tok, "tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf");
  const int32_t byte_ff = tok->token_id("<0xFF>"), byte_e4 = tok->token_id("<0xE4>");
  const int32_t hello = tok->token_id("▁Hello");
  ASSERT_GE(byte_ff, 0);
  ASSERT_GE(hello, 0);
  const std::vector<int32_t> ids = {tok->bos_id(), hello, byte_ff, hello, byte_e4};
  EXPECT_EQ(tok->decode(ids), "Hello\xEF\xBF\xBD Hello\xEF\xBF\xBD");
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.add(ids[0]), "");
  EXPECT_EQ(detok.add(ids[1]), "Hello");
  EXPECT_EQ(detok.add(ids[2]), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.add(ids[3]), " Hello");
  EXPECT_EQ(detok.add(ids[4]), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(ids, {.skip_special = false}), "<s> Hello\xEF\xBF\xBD Hello\xEF\xBF\xBD");
}

// Random id sequences (including special and byte tokens) stream exactly like decode().
TEST(IncrementalDetokenizer, RandomSequences) {
  for (const char* rel : {"tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf",
                          "tokenizers/llamacpp-vocab/ggml-vocab-gpt-2.gguf"}) {
    ARBOR_TOKENIZER_OR_FAIL(tok, rel);
    const uint32_t seed = 1234;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1), low(0, 300);
    for (int round = 0; round < 300; ++round) {
      std::vector<int32_t> ids(1 + rng() % 24);
      for (int32_t& id : ids) id = (rng() % 2) ? any(rng) : low(rng);
      check_stream(*tok, ids, {.skip_special = (round % 2) == 0},
                   std::string(rel) + " seed " + std::to_string(seed) + " round " +
                       std::to_string(round));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(Utf8, ValidationAndLossyRepair) {
  using internal::append_utf8_lossy;
  using internal::is_valid_utf8;
  EXPECT_TRUE(is_valid_utf8("aé€🦙"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));          // truncated
  std::string out;
  append_utf8_lossy("a\xF0\x9F\xA6z\xFF\xE2\x82", out);  // one U+FFFD per maximal subpart
  EXPECT_EQ(out, "a\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD");
  std::string partial;
  EXPECT_EQ(internal::append_utf8_lossy_prefix("ab\xF0\x9F", partial), 2u);
  EXPECT_EQ(partial, "ab");
}

}  // namespace
}  // namespace arbor::tokenizer
