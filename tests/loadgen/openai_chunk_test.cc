// classify_chunk: which chunks carry output, usage, errors; malformed input is reported.
#include "loadgen/openai_chunk.h"

#include <gtest/gtest.h>

#include <string>

namespace arbor::loadgen {
namespace {

TEST(ClassifyChunk, CompletionsToken) {
  const ChunkInfo c = classify_chunk(
      R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m",)"
      R"("choices":[{"index":0,"text":" Once","logprobs":null,"finish_reason":null}]})",
      false);
  EXPECT_TRUE(c.has_token);
  EXPECT_FALSE(c.malformed || c.error || c.done);
  EXPECT_EQ(c.prompt_tokens, -1);
  EXPECT_EQ(c.completion_tokens, -1);
  // An empty text still counts (vLLM: any chunk with choices; arbor sends "" for a token whose
  // bytes do not complete a character yet).
  EXPECT_TRUE(classify_chunk(R"({"choices":[{"text":""}]})", false).has_token);
}

TEST(ClassifyChunk, UsageChunk) {
  const ChunkInfo c =
      classify_chunk(R"({"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":64,)"
                     R"("total_tokens":76,"prompt_tokens_details":{"cached_tokens":0}}})",
                     false);
  EXPECT_FALSE(c.has_token);
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 64);
  // vLLM's continuous usage: a token and usage in one chunk.
  const ChunkInfo both = classify_chunk(
      R"({"choices":[{"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}})", false);
  EXPECT_TRUE(both.has_token);
  EXPECT_EQ(both.completion_tokens, 1);
  const ChunkInfo null_usage = classify_chunk(R"({"choices":[{"text":"a"}],"usage":null})", false);
  EXPECT_TRUE(null_usage.has_token);
  EXPECT_EQ(null_usage.completion_tokens, -1);
}

TEST(ClassifyChunk, DoneAndErrors) {
  EXPECT_TRUE(classify_chunk("[DONE]", false).done);
  EXPECT_TRUE(classify_chunk(" [DONE] ", true).done);
  const ChunkInfo e = classify_chunk(
      R"({"error":{"message":"boom","type":"internal_error","param":null,"code":null}})", false);
  EXPECT_TRUE(e.error);
  EXPECT_FALSE(e.has_token);
  EXPECT_FALSE(classify_chunk(R"({"error":null,"choices":[]})", false).error);
}

TEST(ClassifyChunk, ChatRoleAndEmptyChunksAreNotTokens) {
  const char* role = R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
                     R"("finish_reason":null}]})";
  EXPECT_FALSE(classify_chunk(role, true).has_token);
  EXPECT_FALSE(
      classify_chunk(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", true)
          .has_token);
  EXPECT_FALSE(classify_chunk(R"({"choices":[{"delta":{"content":null}}]})", true).has_token);
  EXPECT_TRUE(
      classify_chunk(R"({"choices":[{"index":0,"delta":{"content":" Hi"}}]})", true).has_token);
  EXPECT_TRUE(
      classify_chunk(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})", true).has_token);
  EXPECT_TRUE(
      classify_chunk(R"({"choices":[{"delta":{"tool_calls":[{"id":"1"}]}}]})", true).has_token);
  // The same role chunk read as a completions chunk has choices, so it counts there.
  EXPECT_TRUE(classify_chunk(R"({"choices":[{"delta":{"role":"assistant"}}]})", false).has_token);
}

TEST(ClassifyChunk, KeysInsideStringsAreNotKeys) {
  // Generated text that looks like JSON must not confuse the scan.
  const ChunkInfo c = classify_chunk(
      R"({"id":"\"choices\":[{\"text\":1}]","text":"\"usage\":{\"completion_tokens\":9}",)"
      R"("choices":[]})",
      false);
  EXPECT_FALSE(c.has_token);
  EXPECT_EQ(c.completion_tokens, -1);
  EXPECT_FALSE(c.malformed);
  // Nested "choices" below the top level are ignored.
  EXPECT_FALSE(classify_chunk(R"({"x":{"choices":[1]},"choices":[]})", false).has_token);
  EXPECT_TRUE(classify_chunk(R"({"choices":[{"text":"a\\\"b\u00e9"}]})", false).has_token);
}

TEST(ClassifyChunk, MalformedInput) {
  for (const char* bad : {"", "{", "{\"choices\":[{\"text\":\"a\"}]", "{\"choices\":[}", "not json",
                          "{\"a\":1}{", "{\"a\":tru}", "[1,2]", "{\"a\":\"unterminated}",
                          "{\"usage\":{\"completion_tokens\":1.5}}"}) {
    EXPECT_TRUE(classify_chunk(bad, false).malformed) << bad;
  }
  std::string deep = "{\"a\":";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}";
  EXPECT_TRUE(classify_chunk(deep, false).malformed);
  EXPECT_FALSE(classify_chunk(R"({"a":[[[1e-5,-2,3.5E+2,true,false,null]]],"choices":[]})", false)
                   .malformed);
}

}  // namespace
}  // namespace arbor::loadgen
