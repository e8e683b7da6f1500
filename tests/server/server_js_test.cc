// Runs tests/server/js (node:test + the official openai npm client) against a live server.
// Skipped, with the reason, when node or tests/server/js/node_modules is missing (run
// scripts/install_js_deps.sh).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "server_test_util.h"

namespace arbor::server::testing {
namespace {

TEST(ServerJs, OfficialOpenAiClient) {
  const std::string js = std::string(ARBOR_SOURCE_DIR) + "/tests/server/js";
  if (!std::filesystem::exists(js + "/node_modules/openai/package.json")) {
    GTEST_SKIP() << js << "/node_modules is absent: run scripts/install_js_deps.sh";
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node not found";
  ServerProcess server({"--chat-template", "llama2"});
  ASSERT_TRUE(server.ok());
  const std::string cmd = "cd '" + js + "' && ARBOR_CHAT=1 ARBOR_BASE_URL='" + server.url("/v1") +
                          "' node --test --test-reporter=spec openai_client.test.mjs 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
