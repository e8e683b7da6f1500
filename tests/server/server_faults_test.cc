// Faults contained (issue 17): a model with one NaN weight fails the requests that meet it with
// a 500 and an OpenAI-style body, and the server keeps serving; `--check-weights` names the
// tensor; norms are checked at every load; metadata that cannot be right is refused at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace arbor::server::testing {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// stories260K with weight `index` of F32 tensor `tensor` replaced by `value`, written to `out`.
void write_with_weight(const std::string& tensor, int64_t index, float value,
                       const std::string& out) {
  const std::string src = test::shared_path(test::kStories260K);
  auto file = gguf::GgufFile::open(src);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const gguf::TensorInfo* t = file->find_tensor(tensor);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, gguf::GgmlType::kF32);
  std::string bytes = read_all(src);
  std::memcpy(bytes.data() + file->data_offset() + t->offset + 4 * index, &value, 4);
  std::ofstream(out, std::ios::binary) << bytes;
}

TEST(ServerFaults, NanWeightFailsTheRequestWith500AndTheServerKeepsServing) {
  ASSERT_TRUE(test::expect_shared_file(test::kStories260K));
  test::TempDir dir("nan_model");
  const std::string path = dir / "nan.gguf";
  write_with_weight("blk.2.ffn_down.weight", 17, std::numeric_limits<float>::quiet_NaN(), path);
  ServerProcess server({}, 0, path);
  ASSERT_TRUE(server.ok());
  for (const double temperature : {1.0, 0.0}) {  // sampled (the sampler's CHECK) and greedy
    SCOPED_TRACE(temperature);
    const HttpResult r = server.post(
        "/v1/completions",
        {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", temperature}});
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("non-finite"), std::string::npos)
        << r.body;
    EXPECT_EQ(r.json()["error"]["type"], "server_error") << r.body;
    EXPECT_NE(r.body.find("layer 2's feed-forward block"), std::string::npos)
        << "the message names where the hidden state went bad: " << r.body;
  }
  // A stream ends with an error event and its terminator; n > 1 fails as a whole.
  const HttpResult s =
      server.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"stream", true}});
  EXPECT_TRUE(s.status == 500 || s.body.find("non-finite") != std::string::npos) << s.body;
  EXPECT_EQ(
      server.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"n", 3}}).status,
      500);
  EXPECT_EQ(server.get("/health").status, 200);
  EXPECT_EQ(server.get("/v1/models").status, 200);
  EXPECT_TRUE(server.running());
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerFaults, CheckWeightsNamesTheTensorAndNormsAreCheckedAtLoad) {
  ASSERT_TRUE(test::expect_shared_file(test::kStories260K));
  test::TempDir dir("bad_models");
  const std::string nan = dir / "nan.gguf";
  write_with_weight("blk.2.ffn_down.weight", 17, std::numeric_limits<float>::infinity(), nan);
  const test::CommandResult checked =
      test::run_arbor("serve --check-weights --port 0 -m '" + nan + "' 2>&1");
  EXPECT_NE(checked.exit_code, 0);
  EXPECT_NE(checked.output().find("blk.2.ffn_down.weight"), std::string::npos) << checked.output();
  EXPECT_NE(checked.output().find("non-finite"), std::string::npos) << checked.output();
  // A norm is checked without the flag (and by every command that loads the model).
  const std::string norm = dir / "norm.gguf";
  write_with_weight("blk.1.attn_norm.weight", 3, std::numeric_limits<float>::quiet_NaN(), norm);
  const test::CommandResult loaded =
      test::run_arbor("generate -m '" + norm + "' -p Once -n 2 2>&1");
  EXPECT_NE(loaded.exit_code, 0);
  EXPECT_NE(loaded.output().find("blk.1.attn_norm.weight"), std::string::npos) << loaded.output();
}

TEST(ServerFaults, ImpossibleMetadataIsRefusedAtLoad) {
  ASSERT_TRUE(test::expect_shared_file(test::kStories260K));
  test::TempDir dir("bad_meta");
  auto file = gguf::GgufFile::open(test::shared_path(test::kStories260K));
  ASSERT_TRUE(file.ok());
  const std::vector<std::pair<std::string, gguf::Value>> cases = {
      {"llama.rope.freq_base", gguf::Value::f32(0.0f)},
      {"llama.rope.freq_base", gguf::Value::f32(std::nanf(""))},
      {"llama.rope.freq_base", gguf::Value::f32(-10000.0f)},
      {"tokenizer.ggml.eos_token_id", gguf::Value::u32(70000)},
      {"tokenizer.ggml.bos_token_id", gguf::Value::i32(-5)},
  };
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key);
    gguf::GgufWriter w = gguf::GgufWriter::from_file(*file);
    w.set(key, value);
    const std::string path = dir / "meta.gguf";
    ASSERT_TRUE(w.write(path).ok());
    const test::CommandResult r = test::run_arbor("generate -m '" + path + "' -p Once -n 2 2>&1");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output().find(key), std::string::npos) << r.output();
  }
  // "none" (0xFFFFFFFF, as converters write it) is not an error.
  gguf::GgufWriter w = gguf::GgufWriter::from_file(*file);
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(0xFFFFFFFFu));
  const std::string path = dir / "none.gguf";
  ASSERT_TRUE(w.write(path).ok());
  EXPECT_EQ(test::run_arbor("generate -m '" + path + "' -p Once -n 2 2>&1").exit_code, 0);
}

// A request whose chat template rendering exceeds the renderer's limits can never succeed:
// 400 invalid_request_error, not 429 (which clients retry). The template doubles a string 4
// times per message: 6 messages build 2^25 bytes, over the 16 MiB limit on a string; one builds
// 32 bytes. (The step limit's 10^7 steps took 10-37 s to reach here; Jinja.RunawayRendersAreBounded
// checks every limit on the renderer itself.)
TEST(ServerFaults, TemplateResourceLimitsAre400) {
  test::TempDir dir("heavy_template");
  const std::string tpl = dir / "heavy.jinja";
  std::ofstream(tpl) << "{% set s = namespace(v='xx') %}{% for m in messages %}"
                        "{% for j in range(4) %}{% set s.v = s.v ~ s.v %}{% endfor %}"
                        "{{ m['content'] }}{% endfor %}";
  ServerProcess server({"--chat-template", tpl});
  ASSERT_TRUE(server.ok());
  nlohmann::json messages = nlohmann::json::array();
  for (int i = 0; i < 6; ++i) messages.push_back({{"role", "user"}, {"content", "hi"}});
  const HttpResult r =
      server.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json()["error"]["type"], "invalid_request_error") << r.body;
  EXPECT_NE(r.body.find("template resource limit"), std::string::npos) << r.body;
  // Under the limit the same template works.
  const HttpResult ok =
      server.post("/v1/chat/completions",
                  {{"messages", nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}})},
                   {"max_tokens", 2}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(server.terminate(), 0);
}

// The request's `priority` is honoured under --scheduling-policy priority and refused (400,
// naming the flag) otherwise, never silently ignored.
TEST(ServerFaults, PriorityFieldIsHonouredOrRefused) {
  {
    ServerProcess fcfs;
    ASSERT_TRUE(fcfs.ok());
    const HttpResult r =
        fcfs.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"priority", 3}});
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json()["error"]["param"], "priority") << r.body;
    EXPECT_NE(r.body.find("--scheduling-policy priority"), std::string::npos) << r.body;
    EXPECT_EQ(fcfs.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"priority", 0}})
                  .status,
              200);
  }
  ServerProcess server({"--scheduling-policy", "priority", "--max-num-seqs", "1"});
  ASSERT_TRUE(server.ok());
  // Eight long requests of low importance run one at a time (seconds of work in all); a more
  // important one preempts the running one and ends before the low ones do.
  using Clock = std::chrono::steady_clock;
  std::vector<std::thread> low;
  std::vector<Clock::time_point> low_done(8);
  std::vector<int> low_status(8);
  std::vector<std::string> low_body(8);
  for (int i = 0; i < 8; ++i) {
    low.emplace_back([&, i] {
      const HttpResult r = server.post("/v1/completions", {{"prompt", "Once upon a time"},
                                                           {"max_tokens", 1900},
                                                           {"ignore_eos", true},
                                                           {"priority", 10}});
      low_status[i] = r.status;
      low_body[i] = r.body.substr(0, 300);
      low_done[i] = Clock::now();
    });
  }
  for (int i = 0; i < 400 && server.metric("arbor_num_requests_running") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const HttpResult high =
      server.post("/v1/completions", {{"prompt", "Lily"}, {"max_tokens", 4}, {"priority", -5}});
  const Clock::time_point high_done = Clock::now();
  for (std::thread& t : low) t.join();
  EXPECT_EQ(high.status, 200) << high.body;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(low_status[i], 200) << low_body[i];
  EXPECT_LT(high_done, *std::max_element(low_done.begin(), low_done.end()))
      << "the important request waited for every other";
  EXPECT_GE(server.metric("arbor_num_priority_preemptions_total"), 1);
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
