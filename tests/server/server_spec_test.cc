// Speculative decoding through the real server: the `speculation` request field on both APIs
// (and its 400s naming the field), usage and /metrics, greedy output unchanged, the startup
// error for a draft model with another vocabulary; finish reasons from the engine's StopReason.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>

#include "server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Concatenates strings and numbers.
template <typename... Args>
std::string str_cat(const Args&... a) {
  std::string s;
  ((s += [](const auto& v) {
     if constexpr (std::is_arithmetic_v<std::decay_t<decltype(v)>>) return std::to_string(v);
     else return std::string(v);
   }(a)),
   ...);
  return s;
}

// A shared data file's path; fails the current test, naming it, when it is missing.
std::string shared(const std::string& rel) {
  EXPECT_TRUE(::arbor::test::require_shared_file(rel));
  return ::arbor::test::shared_path(rel);
}

// Runs `cmd` with a shell; returns its exit status and fills *output with stdout + stderr.
int run(const std::string& cmd, std::string* output) {
  const ::arbor::test::CommandResult r = ::arbor::test::run_shell(cmd);
  *output += r.output();
  return r.exit_code;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".gguf")).string();
}

// Removes its file when the test program exits.
struct TempFile {
  std::string path;
  ~TempFile() { fs::remove(path); }
};

// stories260K's first 3 layers as a GGUF draft.
const std::string& draft3() {
  static const TempFile file{[] {
    const std::string out = temp_path("arbor_server_draft3");
    std::string log;
    const int rc = run(str_cat(::arbor::test::arbor_bin(), " convert llama2c ",
                               shared("models/stories260K/stories260K-first3layers.bin"), " ",
                               shared("models/stories260K/tok512.bin"), " -o ", out),
                       &log);
    EXPECT_EQ(rc, 0) << log;
    return out;
  }()};
  return file.path;
}

class ServerSpec : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--spec", "draft", "--draft-model", draft3(), "--spec-k", "4"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->terminate(), 0);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()) << "arbor serve did not start"; }

  static HttpResult completion(json body) {
    body["model"] = "stories260K";
    if (!body.contains("prompt")) body["prompt"] = "Once upon a time";
    return server_->post("/v1/completions", body);
  }
  static void expect_400(const json& speculation, const std::string& param) {
    const HttpResult r = completion({{"max_tokens", 4}, {"speculation", speculation}});
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json()["error"]["param"], param) << r.body;
    const HttpResult t = server_->post(
        "/generate", {{"inputs", "Once upon a time"},
                      {"parameters", {{"max_new_tokens", 4}, {"speculation", speculation}}}});
    // TGI answers validation errors with 422 and names the field in the message.
    EXPECT_EQ(t.status, 422) << "TGI: " << t.body;
    EXPECT_NE(t.body.find("'" + param), std::string::npos) << "TGI: " << t.body;
  }

  static ServerProcess* server_;
};
ServerProcess* ServerSpec::server_ = nullptr;

TEST_F(ServerSpec, GreedyOutputIsUnchangedAndUsageReportsAcceptance) {
  const json base{{"max_tokens", 64}, {"temperature", 0}, {"ignore_eos", true}};
  json off = base, fixed = base, automatic = base;
  off["speculation"] = {{"mode", "off"}};
  fixed["speculation"] = {{"mode", "fixed"}, {"k", 4}};
  const HttpResult a = completion(off), b = completion(fixed), c = completion(automatic);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(b.json()["choices"][0]["text"], a.json()["choices"][0]["text"]);
  EXPECT_EQ(c.json()["choices"][0]["text"], a.json()["choices"][0]["text"]);
  EXPECT_FALSE(a.json()["usage"].contains("speculation")) << "mode off verifies nothing";
  const json spec = b.json()["usage"]["speculation"];
  ASSERT_TRUE(spec.is_object()) << b.body;
  EXPECT_GT(spec["draft_tokens"].get<int>(), 0);
  EXPECT_GT(spec["accepted_tokens"].get<int>(), 0);
  EXPECT_LE(spec["accepted_tokens"].get<int>(), spec["draft_tokens"].get<int>());
  EXPECT_GT(server_->metric("arbor_spec_draft_tokens_total"), 0);
  EXPECT_GT(server_->metric("arbor_spec_accepted_tokens_total"), 0);
  EXPECT_GE(server_->metric("arbor_spec_mean_accepted_length"), 1.0);
  // The served curve the policy plans with, within its bounds (missing metrics read -1).
  EXPECT_GE(server_->metric("arbor_spec_served_steepness"), 0.5);
  EXPECT_LE(server_->metric("arbor_spec_served_steepness"), 2.0);
  EXPECT_GE(server_->metric("arbor_spec_overhead"), 0.0);
  EXPECT_LE(server_->metric("arbor_spec_overhead"), 8.0);
  EXPECT_GE(server_->metric("arbor_spec_probes_total"), 0.0);
  // TGI's details carry the same numbers.
  const HttpResult t = server_->post(
      "/generate", {{"inputs", "Once upon a time"},
                    {"parameters", {{"max_new_tokens", 32}, {"details", true},
                                    {"speculation", {{"mode", "fixed"}, {"k", 3}}}}}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_GT(t.json()["details"]["speculation"]["draft_tokens"].get<int>(), 0) << t.body;
}

TEST_F(ServerSpec, MalformedSpeculationIsA400NamingTheField) {
  expect_400("yes", "speculation");
  expect_400(json{{"mode", "sometimes"}}, "speculation.mode");
  expect_400(json{{"mode", 3}}, "speculation.mode");
  expect_400(json{{"k", 0}}, "speculation.k");
  expect_400(json{{"k", 5}}, "speculation.k");  // above the server's --spec-k 4
  expect_400(json{{"k", 2.5}}, "speculation.k");
  expect_400(json{{"mode", "fixed"}}, "speculation.k");
  expect_400(json{{"depth", 2}}, "speculation.depth");
  expect_400(json{{"tree_nodes", 4}}, "speculation.tree_nodes");  // a chains-only server
  EXPECT_TRUE(server_->wait_no_blocks_used());
}

// A server with token trees: greedy output unchanged with trees, chains (tree_nodes 0) and off;
// the tree metrics count; tree_nodes out of range is a 400.
TEST(ServerSpecTree, TreesThroughTheServerAreLosslessAndCounted) {
  ServerProcess server({"--spec", "draft", "--draft-model", draft3(), "--spec-k", "4",
                        "--spec-tree-budget", "8", "--spec-tree-width", "3"});
  ASSERT_TRUE(server.ok()) << "arbor serve did not start";
  const auto complete = [&](const json& speculation) {
    json body{{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 64},
              {"temperature", 0}, {"ignore_eos", true}, {"speculation", speculation}};
    return server.post("/v1/completions", body);
  };
  const HttpResult off = complete({{"mode", "off"}});
  const HttpResult tree = complete({{"mode", "fixed"}, {"k", 4}});
  const HttpResult chain = complete({{"mode", "fixed"}, {"k", 4}, {"tree_nodes", 0}});
  const HttpResult small = complete({{"mode", "fixed"}, {"k", 3}, {"tree_nodes", 5}});
  for (const HttpResult* r : {&off, &tree, &chain, &small}) {
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->json()["choices"][0]["text"], off.json()["choices"][0]["text"]);
  }
  EXPECT_GT(server.metric("arbor_spec_tree_verify_steps_total"), 0);
  EXPECT_GT(server.metric("arbor_spec_tree_nodes_total"),
            server.metric("arbor_spec_tree_verify_steps_total"));
  EXPECT_GE(server.metric("arbor_spec_tree_mean_accepted_length"), 1.0);
  const HttpResult bad = complete({{"tree_nodes", 9}});  // above --spec-tree-budget 8
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["error"]["param"], "speculation.tree_nodes") << bad.body;
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST_F(ServerSpec, FinishReasonsComeFromTheStopDecision) {
  // OpenAI: "length" at max_tokens, "stop" at a stop string.
  HttpResult r = completion({{"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "length") << r.body;
  r = completion({{"max_tokens", 200}, {"temperature", 0}, {"stop", json::array({"."})}});
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop") << r.body;
  // TGI: "length" and "stop_sequence".
  HttpResult t = server_->post(
      "/generate", {{"inputs", "Once upon a time"},
                    {"parameters", {{"max_new_tokens", 5}, {"details", true}}}});
  EXPECT_EQ(t.json()["details"]["finish_reason"], "length") << t.body;
  t = server_->post("/generate", {{"inputs", "Once upon a time"},
                                  {"parameters", {{"max_new_tokens", 200}, {"details", true},
                                                  {"stop", json::array({"."})}}}});
  EXPECT_EQ(t.json()["details"]["finish_reason"], "stop_sequence") << t.body;
  // "eos_token": stories260K ends this story with BOS (a stop id of llama2.c models) before
  // 250 tokens (../shared/goldens/stories260K_greedy.json); OpenAI calls it "stop".
  t = server_->post("/generate", {{"inputs", "The cat"},
                                  {"parameters", {{"max_new_tokens", 250}, {"details", true}}}});
  EXPECT_EQ(t.json()["details"]["finish_reason"], "eos_token") << t.body;
  EXPECT_LT(t.json()["details"]["generated_tokens"].get<int>(), 250) << t.body;
  r = completion({{"prompt", "The cat"}, {"max_tokens", 250}, {"temperature", 0}});
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop") << r.body;
  EXPECT_LT(r.json()["usage"]["completion_tokens"].get<int>(), 250) << r.body;
}

TEST(ServerSpecStartup, DraftModelWithAnotherVocabularyIsAStartupError) {
  const std::string other = temp_path("arbor_other_vocab");
  std::string log;
  ASSERT_EQ(run(str_cat(::arbor::test::arbor_bin(), " synth --shape custom --dim 64 --ffn 128 --layers 1 --heads 8 "
                        "--kv-heads 4 --type f32 --vocab-size 600 --vocab ",
                        shared("models/stories260K/stories260K.gguf"), " -o ", other),
                &log),
            0)
      << log;
  log.clear();
  const int rc = run(str_cat(::arbor::test::arbor_bin(), " serve -m ", shared("models/stories260K/stories260K.gguf"),
                             " --port 0 --spec draft --draft-model ", other),
                     &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("600 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("512 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find(other), std::string::npos) << log;
  fs::remove(other);
}

}  // namespace
}  // namespace arbor::server::testing
