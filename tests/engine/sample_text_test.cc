// SampleText: stop strings matched across token boundaries, never leaked; valid UTF-8 deltas.
#include <gtest/gtest.h>

#include "engine/sample_text.h"
#include "engine_test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace arbor::engine {
namespace {

std::unique_ptr<tokenizer::Tokenizer> load_tokenizer() {
  auto t = tokenizer::Tokenizer::from_file(testing::stories260k_path());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(*t);
}

struct Fed {
  std::string text;
  std::vector<std::string> deltas;
  bool stopped = false;
  size_t tokens_fed = 0;
};

Fed feed(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
         std::vector<std::string> stops) {
  SampleText st(tok, {}, std::move(stops));
  Fed f;
  for (int32_t id : ids) {
    ++f.tokens_fed;
    SampleText::Delta d = st.add(id);
    f.deltas.push_back(d.text);
    f.text += d.text;
    if (d.stopped) {
      f.stopped = true;
      return f;
    }
  }
  f.deltas.push_back(st.finish());
  f.text += f.deltas.back();
  return f;
}

// Control tokens write nothing, except those the request keeps (a thinking model's [THINK]).
TEST(SampleText, KeptControlTokensWriteTheirText) {
  auto tok = load_tokenizer();
  const int32_t bos = tok->bos_id(), eos = tok->eos_id();
  ASSERT_TRUE(tok->is_special(bos) && tok->is_special(eos));
  std::vector<int32_t> ids = tok->encode("Hi", {.add_bos = false});
  ids.insert(ids.begin() + 1, bos);
  ids.push_back(eos);
  const auto text = [&](std::vector<int32_t> keep) {
    SampleText st(*tok, {}, {}, std::move(keep));
    std::string out;
    for (int32_t id : ids) out += st.add(id).text;
    return out + st.finish();
  };
  const std::string plain = text({});
  EXPECT_EQ(plain, tok->decode(ids));
  EXPECT_EQ(plain.find(tok->token_to_piece(bos)), std::string::npos);
  std::vector<int32_t> keep = {bos};
  const std::string kept = text(keep);
  EXPECT_NE(kept.find(tok->token_to_piece(bos)), std::string::npos) << kept;
  EXPECT_EQ(kept.find(tok->token_to_piece(eos)), std::string::npos) << kept;
  EXPECT_EQ(kept.size(), plain.size() + tok->token_to_piece(bos).size());
}

TEST(SampleText, StopStringAcrossTokensIsCutAndNeverLeaked) {
  auto tok = load_tokenizer();
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<int32_t> ids = tok->encode(text, {.add_bos = false});
  const std::string decoded = tok->decode(ids);
  ASSERT_GT(ids.size(), 5u);
  for (const std::string stop : {"little girl", "e w", "Lily", "ce upon", ".", "zzz"}) {
    SCOPED_TRACE(stop);
    const Fed f = feed(*tok, ids, {stop, "never appears"});
    const size_t at = decoded.find(stop);
    EXPECT_EQ(f.text, decoded.substr(0, at));
    EXPECT_EQ(f.stopped, at != std::string::npos);
    for (const std::string& d : f.deltas) EXPECT_EQ(d.find(stop), std::string::npos);
  }
}

TEST(SampleText, HoldsBackOnlyAPossibleStopPrefix) {
  auto tok = load_tokenizer();
  const std::vector<int32_t> ids = tok->encode("the cat sat", {.add_bos = false});
  // "sat down" never completes: "sat" is held until the end, then released by finish().
  const Fed f = feed(*tok, ids, {"sat down"});
  EXPECT_FALSE(f.stopped);
  EXPECT_EQ(f.text, tok->decode(ids));
  EXPECT_EQ(f.deltas.back().find("sat"), f.deltas.back().size() - 3) << f.deltas.back();
}

TEST(SampleText, MultibyteCharactersAreNeverSplit) {
  auto tok = load_tokenizer();
  const std::vector<int32_t> ids = tok->encode("café ☃ naïve", {.add_bos = false});
  const Fed f = feed(*tok, ids, {"ve!"});
  EXPECT_EQ(f.text, tok->decode(ids));
  for (const std::string& d : f.deltas) {
    // No delta ends inside a UTF-8 sequence: continuation bytes only follow a lead byte.
    if (!d.empty()) {
      EXPECT_NE(static_cast<unsigned char>(d[0]) & 0xC0, 0x80) << d;
    }
  }
}

// A sample's setup primes its detokenizer with the prompt's last kPrimeTokens tokens only, so a
// request with best_of 8 and a 32,000-token prompt costs the engine no more than one with 64
// (bench/engine/engine_bench.cc prints the figures). The only state priming leaves is whether a
// word has been written (a SentencePiece vocabulary drops the first word's leading space), which
// makes what it read observable: after kPrimeTokens textless tokens the prompt's words are out of
// reach, after one fewer they are not.
TEST(SampleText, OnlyThePromptsLastFewTokensPrimeTheDetokenizer) {
  auto tok = load_tokenizer();
  const std::vector<int32_t> lily = tok->encode("Lily", {.add_bos = false});
  ASSERT_EQ(lily.size(), 1u);
  ASSERT_EQ(tok->token_to_piece(lily[0]).front(), ' ') << "a space-prefixed vocabulary";
  const std::vector<int32_t> words = tok->encode("Once upon a time there was a girl",
                                                 {.add_bos = false});
  const auto first_output = [&](size_t textless) {
    std::vector<int32_t> prompt;
    while (prompt.size() < 32000) prompt.insert(prompt.end(), words.begin(), words.end());
    prompt.insert(prompt.end(), textless, tok->bos_id());
    SampleText st(*tok, prompt, {});
    return st.add(lily[0]).text + st.finish();
  };
  EXPECT_EQ(first_output(SampleText::kPrimeTokens), "Lily");
  EXPECT_EQ(first_output(SampleText::kPrimeTokens - 1), " Lily");
  EXPECT_EQ(first_output(0), " Lily");
}

}  // namespace
}  // namespace arbor::engine
