// The web page in a real browser (issue 38): headless Chromium driven through the DevTools
// protocol by tests/server/web/browser_test.mjs (what it checks is listed there) against a live
// server of a script model (script_model.h) whose greedy output is known:
//
//   a prompt ending in "?"  ->  "<think>\n\nLet me think.</think> Sure!"   (or, where a JSON
//                               Schema refuses " Sure", '{"answer": "yes"}')
//   any other prompt        ->  " la la la ..." until max_tokens (a long generation to stop)
//
// The chat template renders only the messages' contents, so the prompt's last token is the
// user's. A second server (stories260K, --api-key) checks the page asks for the key and uses
// it. Screenshots (web_ui.png while a request runs, web_ui_tools.png at the end) go to the
// test's build folder. Chromium and node come from scripts/install_deps.sh --tests; their absence
// fails the test naming the command.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "script_model.h"
#include "server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

struct Files {
  std::string model;
  std::string chat_template;
};

const Files& files() {
  static test::TempDir dir("server_web_browser");
  static const Files f = [] {
    Files out{dir.path() + "/script_web.gguf", dir.path() + "/contents.jinja"};
    EXPECT_TRUE(test::expect_shared_file("tokenizers/hf/qwen3/tokenizer.json"));
    ScriptModelSpec spec;
    spec.vocab_path = test::shared_path("tokenizers/hf/qwen3");
    spec.next = {{"?", {"<think>"}},    {"<think>", {"\n\n"}}, {"\n\n", {"Let"}},
                 {"Let", {" me"}},      {" me", {" think"}},   {" think", {"."}},
                 {".", {"</think>"}},   {"</think>", {" Sure", "{\""}},
                 {" Sure", {"!"}},      {"!", {"<|im_end|>"}}, {"{\"", {"answer"}},
                 {"answer", {"\":"}},   {"\":", {" \""}},      {" \"", {"yes"}},
                 {"yes", {"\"}"}},      {"\"}", {"<|im_end|>"}}};
    spec.otherwise = " la";
    const Status s = write_script_model(spec, out.model);
    EXPECT_TRUE(s.ok()) << s.to_string();
    std::ofstream(out.chat_template) << "{%- for message in messages %}{{ message.content }}"
                                        "{%- endfor %}";
    return out;
  }();
  return f;
}

TEST(ServerWebBrowser, ChatStopToolsAndEngineView) {
  ASSERT_EQ(test::run_shell("node --version").exit_code, 0)
      << "node not found: run scripts/install_deps.sh --tests (or `make deps`)";
  ASSERT_EQ(test::run_shell("command -v chromium").exit_code, 0)
      << "chromium not found: run scripts/install_deps.sh --tests (or `make deps`)";
  const std::string out = ARBOR_WEB_TEST_OUTPUT_DIR;
  const std::string shot = out + "/web_ui.png";
  std::filesystem::remove(shot);
  ServerProcess server({"--chat-template", files().chat_template, "--reasoning-format", "think",
                        "--served-model-name", "script"},
                       0, files().model);
  ASSERT_TRUE(server.ok());
  ServerProcess keyed({"--api-key", "sk-page", "--chat-template", "llama2"});  // stories260K
  ASSERT_TRUE(keyed.ok());
  const test::CommandResult r = test::run_shell(
      "cd '" + std::string(ARBOR_SOURCE_DIR) + "/tests/server/web' && ARBOR_ROOT_URL='" +
      server.url("") + "' ARBOR_MODEL=script ARBOR_KEYED_URL='" + keyed.url("") +
      "' ARBOR_KEYED_MODEL=stories260K ARBOR_API_KEY=sk-page ARBOR_SCREENSHOT_DIR='" + out +
      "' timeout 240 node browser_test.mjs 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output();
  std::printf("%s", r.output().c_str());  // the steps and their times, for the test log
  // The screenshot is a PNG of the page (a blank one would be a few hundred bytes).
  std::ifstream png(shot, std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  EXPECT_EQ(magic, std::string("\x89PNG\r\n\x1a\n", 8)) << shot;
  EXPECT_GT(std::filesystem::exists(shot) ? std::filesystem::file_size(shot) : 0, 20000u);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
  EXPECT_EQ(keyed.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
