// Prompt logprobs end to end against a live `arbor serve` (stories260K): lm-evaluation-harness's
// loglikelihood request (max_tokens 0, echo, logprobs 1, temperature 0; prompt as token ids and
// as text) with is_greedy computed as lm-eval does, vLLM's prompt_logprobs on completions and
// chat, streaming, TGI's decoder_input_details, and the 400s.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_test_util.h"
#include "support/shared_data.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

class PromptLogprobsE2e : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (server_ != nullptr && server_->ok()) EXPECT_EQ(server_->terminate(), 0);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(test::require_shared_file(test::kStories260K));
    if (server_ == nullptr) server_ = new ServerProcess({"--chat-template", "llama2"});
    ASSERT_TRUE(server_->ok()) << "arbor serve did not start";
  }
  static json post(const std::string& path, const json& body, int status = 200) {
    const HttpResult r = server_->post(path, body);
    EXPECT_EQ(r.status, status) << r.body;
    return r.json();
  }
  static std::vector<int32_t> tokenize(const std::string& text) {
    return post("/tokenize", {{"prompt", text}})["tokens"].get<std::vector<int32_t>>();
  }
  // The vLLM entry of position p: the dict's (id, value) with rank 1, and the prompt token's.
  static int32_t top_id(const json& dict) {
    for (const auto& [id, v] : dict.items()) {
      if (v["rank"] == 1) return std::stoi(id);
    }
    ADD_FAILURE() << "no rank-1 token in " << dict.dump();
    return -1;
  }
  // The greedy continuation of `ids` (k tokens), read from vLLM prompt_logprobs: a dummy token
  // appended to the prompt is scored from the row that predicts the next token.
  static std::vector<int32_t> greedy_ids(std::vector<int32_t> ids, int k) {
    std::vector<int32_t> out;
    for (int i = 0; i < k; ++i) {
      std::vector<int32_t> probe = ids;
      probe.push_back(ids[0]);
      json j = post("/v1/completions",
                    {{"prompt", probe}, {"max_tokens", 0}, {"prompt_logprobs", 1}});
      out.push_back(top_id(j["choices"][0]["prompt_logprobs"].back()));
      ids.push_back(out.back());
    }
    return out;
  }
  // lm-eval's parse_logprobs: the continuation's summed logprob, and whether each of its tokens
  // has the top logprob among top_logprobs.
  static std::pair<double, bool> lm_eval(const json& lp, size_t ctxlen) {
    double sum = 0;
    bool greedy = true;
    for (size_t i = ctxlen; i < lp["token_logprobs"].size(); ++i) {
      const double tok = lp["token_logprobs"][i];
      sum += tok;
      double best = -1e30;
      for (const auto& [t, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
      greedy = greedy && tok == best;
    }
    return {sum, greedy};
  }

  static ServerProcess* server_;
};
ServerProcess* PromptLogprobsE2e::server_ = nullptr;

json loglikelihood_body(const json& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1},
          {"temperature", 0}};
}

TEST_F(PromptLogprobsE2e, LmEvalLoglikelihoodAgreesWithGreedyGeneration) {
  const std::vector<int32_t> ctx = tokenize("Once upon a time, there was a little");
  ASSERT_GT(ctx.size(), 4u);
  const std::vector<int32_t> cont = greedy_ids(ctx, 4);
  // Generation from the context: the same tokens (by text) with the same logprobs.
  json gen = post("/v1/completions", {{"prompt", ctx}, {"max_tokens", 4}, {"temperature", 0},
                                      {"ignore_eos", true}, {"logprobs", 1}});
  const json& glp = gen["choices"][0]["logprobs"];
  std::vector<int32_t> full = ctx;
  full.insert(full.end(), cont.begin(), cont.end());
  json j = post("/v1/completions", loglikelihood_body(full));
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], full.size());
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), full.size()) << lp.dump();
  ASSERT_EQ(lp["tokens"].size(), full.size());
  ASSERT_EQ(lp["text_offset"].size(), full.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < full.size(); ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << i;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_TRUE(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>())) << i;
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_GE(lp["text_offset"][i].get<size_t>(), lp["text_offset"][i - 1].get<size_t>());
  }
  for (size_t i = 0; i < cont.size(); ++i) {
    EXPECT_EQ(lp["tokens"][ctx.size() + i], glp["tokens"][i]) << i;
    EXPECT_EQ(lp["token_logprobs"][ctx.size() + i], glp["token_logprobs"][i]) << i;
  }
  const auto [sum, greedy] = lm_eval(lp, ctx.size());
  EXPECT_TRUE(greedy);
  double gsum = 0;
  for (const json& v : glp["token_logprobs"]) gsum += v.get<double>();
  EXPECT_NEAR(sum, gsum, 1e-9);
  // The echo text is the prompt's.
  EXPECT_EQ(choice["text"], post("/detokenize", {{"tokens", full}})["prompt"]);

  // A continuation that is not greedy: the last token swapped for a less likely one.
  std::vector<int32_t> other = full;
  other.back() = cont.back() == ctx[1] ? ctx[2] : ctx[1];
  json body = loglikelihood_body(other);
  body["prompt_logprobs"] = 0;
  json k = post("/v1/completions", body);
  const json& plp = k["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(plp.size(), other.size());
  const int rank = plp.back()[std::to_string(other.back())]["rank"];
  EXPECT_GT(rank, 1);
  EXPECT_FALSE(lm_eval(k["choices"][0]["logprobs"], ctx.size()).second);
  // The loglikelihood of the first tokens is unchanged by the swap.
  for (size_t i = 1; i + 1 < other.size(); ++i) {
    EXPECT_EQ(k["choices"][0]["logprobs"]["token_logprobs"][i], lp["token_logprobs"][i]) << i;
  }
}

TEST_F(PromptLogprobsE2e, TextPromptAndMaxTokensOneAsLmEvalSendsIt) {
  const std::string text = "The little dog ran to the park";
  const std::vector<int32_t> ids = tokenize(text);
  json j = post("/v1/completions", loglikelihood_body(text));
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().rfind(text, 0), 0u);
  // text_offset points into the echoed text: from the third token on (the first is BOS, the
  // second loses its leading space) each token's text is found there.
  for (size_t i = 2; i < ids.size(); ++i) {
    const std::string piece = lp["tokens"][i];
    EXPECT_EQ(text.compare(lp["text_offset"][i].get<size_t>(), piece.size(), piece), 0)
        << i << " '" << piece << "' at " << lp["text_offset"][i];
  }
  // max_tokens 1 (older lm-eval): the prompt's entries, then the generated token's.
  json body = loglikelihood_body(text);
  body["max_tokens"] = 1;
  body["ignore_eos"] = true;
  json one = post("/v1/completions", body);
  const json& lp1 = one["choices"][0]["logprobs"];
  ASSERT_EQ(lp1["token_logprobs"].size(), ids.size() + 1);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(lp1["token_logprobs"][i], lp["token_logprobs"][i]);
  EXPECT_EQ(lp1["text_offset"].back(), j["choices"][0]["text"].get<std::string>().size());
}

TEST_F(PromptLogprobsE2e, VllmPromptLogprobsOnCompletionsPerChoice) {
  const std::vector<std::string> texts = {"Once upon a time", "The cat sat on the mat"};
  json j = post("/v1/completions", {{"prompt", texts}, {"max_tokens", 2}, {"prompt_logprobs", 3},
                                    {"temperature", 0}});
  ASSERT_EQ(j["choices"].size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    const std::vector<int32_t> ids = tokenize(texts[c]);
    const json& choice = j["choices"][c];
    EXPECT_TRUE(choice["logprobs"].is_null());
    const json& plp = choice["prompt_logprobs"];
    ASSERT_EQ(plp.size(), ids.size()) << choice.dump();
    EXPECT_TRUE(plp[0].is_null());
    for (size_t p = 1; p < ids.size(); ++p) {
      const json& d = plp[p];
      ASSERT_TRUE(d.contains(std::to_string(ids[p]))) << p << " " << d.dump();
      EXPECT_GE(d.size(), 3u);
      EXPECT_LE(d.size(), 4u);
      std::vector<int> ranks;
      for (const auto& [id, v] : d.items()) {
        EXPECT_LE(v["logprob"].get<double>(), 0.0);
        EXPECT_TRUE(v["decoded_token"].is_string());
        ranks.push_back(v["rank"]);
      }
      std::sort(ranks.begin(), ranks.end());
      EXPECT_EQ(ranks[0], 1);
      EXPECT_EQ(ranks[1], 2);
      EXPECT_EQ(ranks[2], 3);
      if (d.size() == 4) EXPECT_GT(ranks[3], 3);
    }
  }
}

TEST_F(PromptLogprobsE2e, VllmPromptLogprobsOnChatAtTheTopLevel) {
  json j = post("/v1/chat/completions",
                {{"messages", json::array({{{"role", "user"}, {"content", "Hi there"}}})},
                 {"max_tokens", 2}, {"prompt_logprobs", 1}});
  const json& plp = j["prompt_logprobs"];
  ASSERT_TRUE(plp.is_array()) << j.dump();
  EXPECT_EQ(plp.size(), j["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_TRUE(plp[0].is_null());
  for (size_t p = 1; p < plp.size(); ++p) EXPECT_GE(plp[p].size(), 1u);
  // Chat with max_tokens 0 scores the prompt only.
  json z = post("/v1/chat/completions",
                {{"messages", json::array({{{"role", "user"}, {"content", "Hi there"}}})},
                 {"max_tokens", 0}, {"prompt_logprobs", 0}});
  EXPECT_EQ(z["choices"][0]["message"]["content"], "");
  EXPECT_EQ(z["choices"][0]["finish_reason"], "length");
  ASSERT_EQ(z["prompt_logprobs"].size(), plp.size());
  for (size_t p = 1; p < plp.size(); ++p) {
    for (const auto& [id, v] : z["prompt_logprobs"][p].items()) {
      EXPECT_EQ(v["logprob"], plp[p][id]["logprob"]) << p;
    }
  }
}

TEST_F(PromptLogprobsE2e, StreamingEchoChunkCarriesThePromptsLogprobs) {
  const std::string text = "Once upon a time";
  json body = {{"prompt", text}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 1},
               {"temperature", 0}, {"ignore_eos", true}, {"prompt_logprobs", 1}};
  const json whole = post("/v1/completions", body);
  body["stream"] = true;
  const HttpResult r = server_->post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json tokens = json::array(), token_logprobs = json::array();
  std::string streamed;
  int chunks = 0;
  for (const std::string& p : sse_payloads(r.body)) {
    if (p == "[DONE]") continue;
    const json c = json::parse(p)["choices"][0];
    streamed += c["text"].get<std::string>();
    if (chunks++ == 0) {
      EXPECT_EQ(c["text"].get<std::string>().rfind(text, 0), 0u);
      EXPECT_EQ(c["prompt_logprobs"], whole["choices"][0]["prompt_logprobs"]);
      EXPECT_TRUE(c["logprobs"]["token_logprobs"][0].is_null());
    } else {
      EXPECT_FALSE(c.contains("prompt_logprobs")) << "only the first chunk carries them";
    }
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& t : c["logprobs"]["token_logprobs"]) token_logprobs.push_back(t);
  }
  EXPECT_GT(chunks, 1);
  EXPECT_EQ(streamed, whole["choices"][0]["text"]);
  EXPECT_EQ(tokens, whole["choices"][0]["logprobs"]["tokens"]);
  EXPECT_EQ(token_logprobs, whole["choices"][0]["logprobs"]["token_logprobs"]);
}

TEST_F(PromptLogprobsE2e, TgiDecoderInputDetails) {
  const std::string text = "Once upon a time";
  const std::vector<int32_t> ids = tokenize(text);
  json j = post("/generate", {{"inputs", text},
                              {"parameters", {{"max_new_tokens", 2}, {"details", true},
                                              {"decoder_input_details", true}}}});
  const json& prefill = j["details"]["prefill"];
  ASSERT_EQ(prefill.size(), ids.size()) << j.dump();
  const json echo = post("/v1/completions", loglikelihood_body(text));
  for (size_t p = 0; p < ids.size(); ++p) {
    EXPECT_EQ(prefill[p]["id"], ids[p]);
    EXPECT_EQ(prefill[p]["text"], echo["choices"][0]["logprobs"]["tokens"][p]);
    EXPECT_EQ(prefill[p]["logprob"], echo["choices"][0]["logprobs"]["token_logprobs"][p]) << p;
  }
  const HttpResult s = server_->post(
      "/generate_stream", {{"inputs", text}, {"parameters", {{"decoder_input_details", true}}}});
  EXPECT_EQ(s.status, 422) << s.body;
  EXPECT_NE(s.body.find("decoder_input_details"), std::string::npos);
}

TEST_F(PromptLogprobsE2e, LimitsAreBadRequestsNamingTheField) {
  for (const auto& [path, base] :
       {std::pair<std::string, json>{"/v1/completions", {{"prompt", "Once"}}},
        {"/v1/chat/completions",
         {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}}}}) {
    for (const json& bad : {json(21), json(-1), json(2.5)}) {
      json body = base;
      body["prompt_logprobs"] = bad;
      const json e = post(path, body, 400);
      EXPECT_EQ(e["error"]["param"], "prompt_logprobs") << path << " " << bad;
    }
  }
  json body = loglikelihood_body("Once");
  body["logprobs"] = 21;
  EXPECT_EQ(post("/v1/completions", body, 400)["error"]["param"], "logprobs");
  body["logprobs"] = 20;
  EXPECT_EQ(post("/v1/completions", body)["choices"][0]["logprobs"]["token_logprobs"][0], nullptr);
  EXPECT_TRUE(server_->wait_no_blocks_used());
}

}  // namespace
}  // namespace arbor::server::testing
