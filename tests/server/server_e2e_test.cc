// End to end against a live `arbor serve` on 127.0.0.1: OpenAI completions (streaming and not,
// n = 2, stop strings, logprobs, echo, usage), chat, TGI routes, tokenize, models, metrics.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "server_test_util.h"
#include "support/shared_data.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

class ServerE2e : public ::testing::Test {
 protected:
  // One server for the suite, started by its first test: a failure in SetUpTestSuite (a missing
  // model) would make GoogleTest report every test of the suite as skipped, which CTest counts
  // as passed.
  static void TearDownTestSuite() {
    if (server_ != nullptr && server_->ok()) {
      EXPECT_EQ(server_->terminate(), 0) << "the server must exit 0 on SIGTERM";
    }
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    if (server_ == nullptr) server_ = new ServerProcess();
    ASSERT_TRUE(server_->ok()) << "arbor serve did not start";
  }

  static json completion(json body) {
    body["model"] = "stories260K";
    const HttpResult r = server_->post("/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json();
  }
  static std::string greedy_text(int max_tokens) {
    json j = completion({{"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
                         {"temperature", 0}, {"ignore_eos", true}});
    return j["choices"][0]["text"].get<std::string>();
  }

  static ServerProcess* server_;
};
ServerProcess* ServerE2e::server_ = nullptr;

TEST_F(ServerE2e, CompletionNonStreaming) {
  json j = completion({{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0},
                       {"ignore_eos", true}});
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories260K");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_FALSE(j["choices"][0]["text"].get<std::string>().empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 3);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + 8);
  // Greedy is deterministic.
  EXPECT_EQ(greedy_text(8), j["choices"][0]["text"]);
}

TEST_F(ServerE2e, CompletionStreamingMatchesNonStreaming) {
  const std::string expected = greedy_text(12);
  const HttpResult r = server_->post(
      "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0},
                          {"ignore_eos", true}, {"stream", true},
                          {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const auto payloads = sse_payloads(r.body);
  ASSERT_GE(payloads.size(), 3u) << r.body;
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    json c = json::parse(payloads[i]);
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finish, "length");
  ASSERT_TRUE(usage.is_object()) << "include_usage must send a usage chunk";
  EXPECT_EQ(usage["completion_tokens"], 12);
}

TEST_F(ServerE2e, CompletionNTwoWithSeed) {
  json body{{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"n", 2}, {"seed", 7},
            {"temperature", 1.0}, {"ignore_eos", true}};
  json a = completion(body);
  json b = completion(body);
  ASSERT_EQ(a["choices"].size(), 2u);
  EXPECT_EQ(a["choices"][0]["index"], 0);
  EXPECT_EQ(a["choices"][1]["index"], 1);
  EXPECT_EQ(a["usage"]["completion_tokens"], 20);
  EXPECT_EQ(a["choices"], b["choices"]) << "the same seed must give the same samples";
}

TEST_F(ServerE2e, BatchOfPromptsGivesPromptMajorChoices) {
  const HttpResult t = server_->post("/tokenize", {{"prompt", "Once upon a time"}});
  const json ids = t.json()["tokens"];
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "non-streaming");
    json body{{"prompt", {"Once upon a time", "The dog"}}, {"max_tokens", 8}, {"n", 2},
              {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
    if (stream) body["stream_options"] = {{"include_usage", true}};
    const HttpResult r = server_->post("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<std::string> text(4);
    json usage;
    if (stream) {
      for (const std::string& p : sse_payloads(r.body)) {
        if (p == "[DONE]") continue;
        const json c = json::parse(p);
        if (c["choices"].empty()) usage = c["usage"];
        for (const json& ch : c["choices"]) text.at(ch["index"].get<size_t>()) += ch["text"];
      }
    } else {
      const json j = r.json();
      ASSERT_EQ(j["choices"].size(), 4u);
      for (const json& ch : j["choices"]) text.at(ch["index"].get<size_t>()) = ch["text"];
      usage = j["usage"];
    }
    // Choices 0-1 belong to the first prompt (greedy: equal), 2-3 to the second.
    EXPECT_EQ(text[0], greedy_text(8));
    EXPECT_EQ(text[1], text[0]);
    EXPECT_EQ(text[2], text[3]);
    EXPECT_NE(text[2], text[0]);
    EXPECT_EQ(usage["completion_tokens"], 32);
    EXPECT_GT(usage["prompt_tokens"].get<int>(), static_cast<int>(ids.size()));
  }
}

TEST_F(ServerE2e, StopStringCutsText) {
  const std::string full = greedy_text(30);
  // A stop string from the middle of the greedy text: the output ends right before it.
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(full.size() / 2, 4);
  const size_t at = full.find(stop);
  json j = completion({{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0},
                       {"ignore_eos", true}, {"stop", json::array({stop, "zzzzqq"})}});
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, at)) << "stop='" << stop << "'";
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerE2e, LogprobsAndEcho) {
  json j = completion({{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0},
                       {"ignore_eos", true}, {"logprobs", 3}});
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << j.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(chosen, best, 1e-4) << "greedy picks the most likely token";
  }
  json e = completion({{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"echo", true}});
  EXPECT_EQ(e["choices"][0]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
}

TEST_F(ServerE2e, PromptAsTokenIds) {
  const HttpResult t = server_->post("/tokenize", {{"prompt", "Once upon a time"}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json ids = t.json()["tokens"];
  json j = completion({{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0},
                       {"ignore_eos", true}});
  EXPECT_EQ(j["choices"][0]["text"], greedy_text(8));
  const HttpResult d = server_->post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.json()["prompt"], "Once upon a time");
}

TEST_F(ServerE2e, TgiGenerateWithDetails) {
  const HttpResult r = server_->post(
      "/generate", {{"inputs", "Once upon a time"},
                    {"parameters", {{"max_new_tokens", 6}, {"details", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  const json& d = j["details"];
  EXPECT_LE(d["generated_tokens"].get<int>(), 6);
  EXPECT_EQ(d["tokens"].size(), d["generated_tokens"].get<size_t>());
  std::string joined;
  for (const json& t : d["tokens"]) joined += t["text"].get<std::string>();
  EXPECT_EQ(joined, j["generated_text"]);
}

TEST_F(ServerE2e, TgiGenerateStream) {
  const HttpResult r = server_->post(
      "/generate_stream", {{"inputs", "Once upon a time"},
                           {"parameters", {{"max_new_tokens", 6}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const auto payloads = sse_payloads(r.body);
  ASSERT_FALSE(payloads.empty());
  std::string joined;
  for (const auto& p : payloads) joined += json::parse(p)["token"]["text"].get<std::string>();
  json last = json::parse(payloads.back());
  EXPECT_EQ(last["generated_text"], joined);
  EXPECT_TRUE(last["details"].is_object());
  const HttpResult info = server_->get("/info");
  ASSERT_EQ(info.status, 200);
  EXPECT_EQ(info.json()["model_id"], "stories260K");
}

// stories260K ends "The cat" (greedy) by sampling BOS, which starts its next story: the engine's
// stop rules end the sample there on both APIs, and ignore_eos runs on to the limit.
TEST_F(ServerE2e, BosEndsTheSampleUnlessIgnoreEos) {
  json j = completion({{"prompt", "The cat"}, {"max_tokens", 400}, {"temperature", 0}});
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << j.dump();
  const int stopped_at = j["usage"]["completion_tokens"].get<int>();
  EXPECT_LT(stopped_at, 400);
  j = completion({{"prompt", "The cat"}, {"max_tokens", 400}, {"temperature", 0},
                  {"ignore_eos", true}});
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 400);

  json params{{"max_new_tokens", 400}, {"details", true}};
  HttpResult r = server_->post("/generate", {{"inputs", "The cat"}, {"parameters", params}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json details = r.json()["details"];
  EXPECT_EQ(details["finish_reason"], "eos_token") << r.body;
  const json& tokens = details["tokens"];
  ASSERT_EQ(tokens.size(), static_cast<size_t>(stopped_at)) << "the same greedy path";
  EXPECT_EQ(tokens.back()["id"], 1) << "the sample ends with BOS";
  params["ignore_eos"] = true;
  r = server_->post("/generate", {{"inputs", "The cat"}, {"parameters", params}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["details"]["finish_reason"], "length") << r.body;
  EXPECT_EQ(r.json()["details"]["generated_tokens"], 400);
}

// stories260K has no chat template: chat uses the fallback (chatml), whose markers this
// vocabulary spells as text.
TEST_F(ServerE2e, ChatWithoutTemplateUsesTheFallback) {
  const HttpResult r = server_->post(
      "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                               {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(r.json()["choices"][0]["message"]["content"].get<std::string>().empty()) << r.body;
  // The prompt is chatml's rendering, as the tokenizer reads it.
  const HttpResult tok = server_->post(
      "/tokenize", {{"prompt", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
                    {"add_special_tokens", false}});
  ASSERT_EQ(tok.status, 200) << tok.body;
  EXPECT_EQ(r.json()["usage"]["prompt_tokens"], tok.json()["count"]) << tok.body;
}

TEST_F(ServerE2e, ModelsHealthAndMetrics) {
  const HttpResult m = server_->get("/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.json()["data"][0]["id"], "stories260K");
  EXPECT_EQ(server_->get("/health").status, 200);
  completion({{"prompt", "Hello"}, {"max_tokens", 4}, {"ignore_eos", true}});
  const HttpResult metrics = server_->get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name :
       {"arbor_time_to_first_token_seconds_bucket", "arbor_inter_token_latency_seconds_count",
        "arbor_e2e_request_latency_seconds_sum", "arbor_request_queue_time_seconds_count",
        "arbor_num_requests_running", "arbor_num_requests_waiting", "arbor_kv_cache_usage_perc",
        "arbor_num_preemptions_total", "arbor_num_priority_preemptions_total",
        "arbor_prefix_cache_hit_rate"}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
  EXPECT_GE(server_->metric("arbor_generation_tokens_total"), 4);
  EXPECT_GT(server_->metric("arbor_kv_blocks_usable"), 0);
  // stories260K has no sliding layers: one full-attention KV cache group, nothing released.
  EXPECT_GE(server_->metric("arbor_kv_group_blocks_used{group=\"0\",window=\"0\"}"), 0);
  EXPECT_EQ(server_->metric("arbor_kv_group_blocks_used{group=\"1\"}"), -1);
  EXPECT_EQ(server_->metric("arbor_kv_group_blocks_released_total{group=\"0\"}"), 0);
  EXPECT_GE(server_->metric("arbor_http_requests_total{code=\"200\"}"), 2);
  // Every sample carries the served name as model_name (vLLM's label), labelled ones included.
  const std::vector<MetricSample> samples = metric_samples(metrics.body);
  ASSERT_GT(samples.size(), 100u);
  size_t with_own_labels = 0;
  for (const MetricSample& s : samples) {
    auto it = s.labels.find("model_name");
    EXPECT_TRUE(it != s.labels.end() && it->second == "stories260K") << s.name;
    with_own_labels += s.labels.size() > 1 ? 1 : 0;
  }
  EXPECT_GT(with_own_labels, 20u) << "histogram buckets and status codes keep their labels";
  EXPECT_TRUE(server_->wait_no_blocks_used());
}

// The same long prompt twice: the second request is served from the first one's cached full
// blocks, and the token counters say so.
TEST_F(ServerE2e, PrefixCacheHitsAreCounted) {
  std::vector<int> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(300 + i);  // 40 tokens: two full blocks of 16
  const double hits_before = server_->metric("arbor_prefix_cache_hits_total");
  const double queries_before = server_->metric("arbor_prefix_cache_queries_total");
  for (int round = 0; round < 2; ++round) {
    const json j = completion({{"prompt", prompt}, {"max_tokens", 2}, {"ignore_eos", true}});
    ASSERT_EQ(j["usage"]["prompt_tokens"], 40) << j.dump();
    ASSERT_TRUE(server_->wait_no_blocks_used());
  }
  EXPECT_GE(server_->metric("arbor_prefix_cache_queries_total") - queries_before, 80);
  EXPECT_EQ(server_->metric("arbor_prefix_cache_hits_total") - hits_before, 32);
}

TEST(ServerChat, BuiltinTemplateStreamingMatchesNonStreaming) {
  ServerProcess server({"--chat-template", "llama2"});
  ASSERT_TRUE(server.ok());
  const json messages = {{{"role", "system"}, {"content", "Be kind."}},
                         {{"role", "user"}, {"content", "Tell me a story."}}};
  json body{{"messages", messages}, {"max_tokens", 8}, {"temperature", 0},
            {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  const HttpResult r = server.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 8u);
  for (const json& t : content) EXPECT_EQ(t["top_logprobs"].size(), 2u);
  // The rendered llama2 prompt ("<s>[INST] <<SYS>> ...") is far longer than the user text.
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 20);

  body["stream"] = true;
  body.erase("logprobs");
  body.erase("top_logprobs");
  const HttpResult s = server.post("/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string text;
  const auto payloads = sse_payloads(s.body);
  ASSERT_FALSE(payloads.empty());
  EXPECT_EQ(payloads.back(), "[DONE]");
  EXPECT_EQ(json::parse(payloads[0])["choices"][0]["delta"]["role"], "assistant");
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    const json c = json::parse(payloads[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    text += c["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);

  // The template's raise_exception becomes a 400 naming the messages.
  const HttpResult bad = server.post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["error"]["param"], "messages");
  EXPECT_EQ(server.terminate(), 0);
}

TEST(ServerChat, UnknownTemplateNameFailsAtStartup) {
  ServerProcess server({"--chat-template", "no-such-template"});
  EXPECT_FALSE(server.ok());
  EXPECT_FALSE(server.running());
}

}  // namespace
}  // namespace arbor::server::testing
