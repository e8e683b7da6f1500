// Runs tests/server/js (node:test + the official openai and @anthropic-ai/sdk npm clients,
// LangChain and @huggingface/inference) against a live server.
// node/npm and tests/server/js/node_modules are installed by `make deps` (make test runs it:
// scripts/install_deps.sh --tests, scripts/install_js_deps.sh), so their absence fails the test
// with the command that installs them: a skip would count as a pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "script_model.h"
#include "server_test_util.h"
#include "support/subprocess.h"

namespace arbor::server::testing {
namespace {

TEST(ServerJs, OfficialOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_EQ(test::run_shell("node --version").exit_code, 0)
      << "node not found: run scripts/install_deps.sh --tests (or `make deps`)";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server(
      {"--chat-template", "llama2", "--served-model-name", "stories260K,org/model"});
  ASSERT_TRUE(server.ok());
  const test::CommandResult r =
      test::run_shell("cd '" + js + "' && ARBOR_BASE_URL='" + server.url("/v1") +
                      "' node --test --test-reporter=spec openai_client.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(server.terminate(), 0);
}

// embeddings.create (embeddings.test.mjs) against `arbor serve --task embed` on a
// Qwen3-Embedding-style file: shapes, the client's own base64 decoding, dimensions, token ids,
// errors.
TEST(ServerJs, EmbeddingsWithOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--task", "embed"}, 0, random_qwen3_embed_model());
  ASSERT_TRUE(server.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_MODEL=random_qwen3_embed ARBOR_BASE_URL='" + server.url("/v1") +
      "' node --test --test-reporter=spec embeddings.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// The same suite against a server with --api-key, the client holding the key.
TEST(ServerJs, OfficialOpenAiClientWithApiKey) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--chat-template", "llama2", "--api-key", "sk-arbor-test",
                        "--served-model-name", "stories260K,org/model"});
  ASSERT_TRUE(server.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_API_KEY=sk-arbor-test ARBOR_BASE_URL='" +
      server.url("/v1") + "' node --test --test-reporter=spec openai_client.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(server.terminate(), 0);
}

// Tool calling and structured output with the openai client and LangChain's ChatOpenAI
// (tools.test.mjs), on a random-weight model whose template renders tools, with speculation on
// (and --reasoning-format none: a random model never closes a <think> block it opens).
TEST(ServerJs, ToolCallingWithOpenAiAndLangChain) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/@langchain/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--spec", "ngram", "--reasoning-format", "none"}, 0,
                       random_qwen3_model());
  ASSERT_TRUE(server.ok());
  const test::CommandResult r =
      test::run_shell("cd '" + js + "' && ARBOR_MODEL=random_qwen3 ARBOR_BASE_URL='" +
                      server.url("/v1") + "' node --test --test-reporter=spec tools.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// Hugging Face's @huggingface/inference client (hf_inference.test.mjs): it sends the endpoint URL
// as the model, hence --accept-any-model-name.
TEST(ServerJs, HuggingFaceInferenceClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/@huggingface/inference/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--chat-template", "llama2", "--accept-any-model-name"});
  ASSERT_TRUE(server.ok());
  const test::CommandResult r =
      test::run_shell("cd '" + js + "' && ARBOR_ROOT_URL='" + server.url("") +
                      "' node --test --test-reporter=spec hf_inference.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(server.terminate(), 0);
}

// OpenAI's Responses API with the openai client's responses.create and responses.stream
// (responses.test.mjs) on the thinking script model (script_model.h), with n-gram speculation.
TEST(ServerJs, ResponsesWithOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/openai/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--spec", "ngram", "--served-model-name", "script"}, 0,
                       thinking_script_model());
  ASSERT_TRUE(server.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_MODEL=script ARBOR_BASE_URL='" + server.url("/v1") +
      "' node --test --test-reporter=spec responses.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// Anthropic's Messages API with @anthropic-ai/sdk's messages.create, messages.stream and
// messages.countTokens (anthropic.test.mjs) on the thinking script model, behind --api-key: the
// client authenticates with x-api-key.
TEST(ServerJs, MessagesWithAnthropicClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  ASSERT_TRUE(std::filesystem::exists(js + "/node_modules/@anthropic-ai/sdk/package.json"))
      << js << "/node_modules is absent: run scripts/install_js_deps.sh (or `make deps`)";
  ServerProcess server({"--api-key", "sk-arbor-test", "--served-model-name", "script"}, 0,
                       thinking_script_model());
  ASSERT_TRUE(server.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + js + "' && ARBOR_MODEL=script ARBOR_API_KEY=sk-arbor-test ARBOR_ROOT_URL='" +
      server.url("") + "' node --test --test-reporter=spec anthropic.test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
