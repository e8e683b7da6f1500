// The real `arbor gguf-info` and `arbor tokenize` name the pre-tokenizer of a vocabulary, and
// say why arbor cannot load one it does not support.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::tokenizer {
namespace {

using gguf::Value;
using test::run_arbor;

// A byte-level BPE vocab-only GGUF: "a", "b", "ab", "<s>", "</s>", named `pre`.
std::string write_vocab(const std::string& pre) {
  gguf::GgufWriter w;
  w.set("general.architecture", Value::str("llama"));
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str(pre));
  w.set("tokenizer.ggml.tokens", Value::string_array({"a", "b", "ab", "<s>", "</s>"}));
  w.set("tokenizer.ggml.token_type", Value::i32_array({1, 1, 1, 3, 3}));
  w.set("tokenizer.ggml.merges", Value::string_array({"a b"}));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(3));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(4));
  const std::string path = test::temp_path("cli_" + pre + ".gguf");
  EXPECT_TRUE(w.write(path).ok()) << path;
  return path;
}

TEST(TokenizerCli, GgufInfoNamesThePreTokenizer) {
  const std::string path = write_vocab("tekken");
  auto r = run_arbor("gguf-info '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_NE(r.out.find("tokenizer: gpt2 (byte-level BPE), pre-tokenizer tekken (ignore_merges), "
                       "5 tokens, BOS 3 added, EOS 4\n"),
            std::string::npos)
      << r.out;
  r = run_arbor("gguf-info --json '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokenizer"]["pre"], "tekken");
  EXPECT_EQ(j["tokenizer"]["model"], "gpt2");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 5);
  EXPECT_EQ(j["tokenizer"]["add_bos"], true);
}

TEST(TokenizerCli, GgufInfoSaysWhyAPreTokenizerCannotLoad) {
  const std::string path = write_vocab("no-such-pre");
  auto r = run_arbor("gguf-info '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output();  // the file itself is fine
  EXPECT_NE(r.out.find("tokenizer: not loadable by arbor: unimplemented: "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tokenizer.ggml.pre = 'no-such-pre'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(supported: "), std::string::npos) << r.out;
  r = run_arbor("gguf-info --json '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["tokenizer"]["error"].get<std::string>().find("'no-such-pre'"), std::string::npos);
  // tokenize refuses it with the same message and a failing exit status.
  r = run_arbor("tokenize -m '" + path + "' ab");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tokenizer.ggml.pre = 'no-such-pre'"), std::string::npos) << r.err;
}

TEST(TokenizerCli, TokenizePrintsIdsAndTheTokenizerOnStderr) {
  const std::string path = write_vocab("qwen2");
  const auto r = run_arbor("tokenize -m '" + path + "' abba");
  ASSERT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(r.out, "2 1 0\n");
  EXPECT_NE(r.err.find("tokenizer: gpt2 (byte-level BPE), pre-tokenizer qwen2, 5 tokens"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace arbor::tokenizer
