// /v1/embeddings and /v1/rerank on a live `arbor serve --task embed|rerank` over Qwen3-Embedding-
// and Qwen3-Reranker-style random-weight files (server_test_util.h): the OpenAI and Cohere /
// llama-server shapes, L2 normalisation, Matryoshka `dimensions`, base64 equal to the floats bit
// for bit, many inputs in one request equal to one at a time bit for bit, token-id inputs equal to
// their text, rerank ordering / top_n / return_documents, the Qwen3-Reranker yes/no convention and
// a file's own rerank template; routes of another task answer 404 naming both tasks; no KV block
// is left in use. Malformed bodies: server_malformed_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "server_test_util.h"
#include "support/shared_data.h"
#include "support/subprocess.h"

namespace arbor::server::testing {
namespace {

using nlohmann::json;

std::vector<float> floats(const json& array) {
  std::vector<float> v;
  for (const json& x : array) v.push_back(x.get<float>());
  return v;
}

std::vector<float> from_base64(const std::string& s) {
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const size_t v = kAlphabet.find(c);
    EXPECT_NE(v, std::string::npos) << "not base64: " << c;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

double norm(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += double{x} * x;
  return std::sqrt(s);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ServerEmbeddings, OpenAiShapeNormalisedDimensionsAndBase64) {
  ServerProcess server({"--task", "embed"}, 0, random_qwen3_embed_model());
  ASSERT_TRUE(server.ok());
  HttpResult r = server.post("/v1/embeddings", {{"input", {"A cat sat.", "Dogs bark loudly"}},
                                                {"model", "random_qwen3_embed"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "random_qwen3_embed");
  ASSERT_EQ(j["data"].size(), 2u);
  std::vector<std::vector<float>> full;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    full.push_back(floats(j["data"][i]["embedding"]));
    ASSERT_EQ(full.back().size(), 64u);
    EXPECT_NEAR(norm(full.back()), 1.0, 1e-6);
  }
  int64_t tokens = 0;
  for (const char* text : {"A cat sat.", "Dogs bark loudly"}) {
    tokens += server.post("/tokenize", {{"prompt", text}}).json()["count"].get<int64_t>();
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], tokens);
  // Matryoshka: the first 16 values of the whole vector, renormalised.
  r = server.post("/v1/embeddings", {{"input", "A cat sat."}, {"dimensions", 16}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<float> cut = floats(r.json()["data"][0]["embedding"]);
  ASSERT_EQ(cut.size(), 16u);
  const std::vector<float> head(full[0].begin(), full[0].begin() + 16);
  for (size_t d = 0; d < 16; ++d) EXPECT_NEAR(cut[d], head[d] / norm(head), 1e-6) << d;
  // base64: the little-endian bytes of exactly the floats.
  r = server.post("/v1/embeddings", {{"input", "A cat sat."}, {"dimensions", 16},
                                     {"encoding_format", "base64"}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.json()["data"][0]["embedding"].is_string());
  EXPECT_TRUE(same_bits(from_base64(r.json()["data"][0]["embedding"]), cut));
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// Eight inputs in one request give exactly the vectors of eight requests of one input; token-id
// inputs give their text's vectors.
TEST(ServerEmbeddings, ManyInputsEqualOneAtATime) {
  ServerProcess server({"--task", "embed", "--max-num-batched-tokens", "16"}, 0,
                       random_qwen3_embed_model());
  ASSERT_TRUE(server.ok());
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) {
    texts.push_back("Input number " + std::to_string(i) + ": " +
                    std::string(static_cast<size_t>(3 * i), 'x') + " the end.");
  }
  const HttpResult all = server.post(
      "/v1/embeddings", {{"input", texts}, {"encoding_format", "base64"}});
  ASSERT_EQ(all.status, 200) << all.body;
  for (size_t i = 0; i < texts.size(); ++i) {
    const HttpResult one = server.post(
        "/v1/embeddings", {{"input", texts[i]}, {"encoding_format", "base64"}});
    ASSERT_EQ(one.status, 200);
    EXPECT_EQ(one.json()["data"][0]["embedding"], all.json()["data"][i]["embedding"]) << i;
  }
  const json ids = server.post("/tokenize", {{"prompt", texts[3]}}).json()["tokens"];
  const HttpResult by_ids =
      server.post("/v1/embeddings", {{"input", json::array({ids})}, {"encoding_format", "base64"}});
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(by_ids.json()["data"][0]["embedding"], all.json()["data"][3]["embedding"]);
  const HttpResult flat = server.post("/v1/embeddings", {{"input", ids}, {"encoding_format", "base64"}});
  EXPECT_EQ(flat.json()["data"][0]["embedding"], all.json()["data"][3]["embedding"]);
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

void expect_404_naming(const HttpResult& r, const std::string& words) {
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(r.json()["error"]["code"], "task_not_served") << r.body;
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find(words), std::string::npos)
      << r.body;
}

TEST(ServerEmbeddings, RoutesOfAnotherTaskAre404NamingBoth) {
  ServerProcess embed({"--task", "embed"}, 0, random_qwen3_embed_model());
  ASSERT_TRUE(embed.ok());
  const json chat{{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  expect_404_naming(embed.post("/v1/chat/completions", chat), "this server runs --task embed");
  expect_404_naming(embed.post("/v1/completions", {{"prompt", "hi"}}), "generates text");
  expect_404_naming(embed.post("/v1/rerank", {{"query", "a"}, {"documents", {"b"}}}),
                    "needs --task rerank");
  const json card = embed.get("/v1/models").json()["data"][0];
  EXPECT_EQ(card["task"], "embed");
  EXPECT_EQ(card["pooling"], "last");
  EXPECT_EQ(card["embedding_dim"], 64);
  EXPECT_EQ(embed.get("/info").json()["model_pipeline_tag"], "feature-extraction");
  ServerProcess generate;
  ASSERT_TRUE(generate.ok());
  expect_404_naming(generate.post("/v1/embeddings", {{"input", "hi"}}),
                    "needs --task embed (pooling from the file's");
  expect_404_naming(generate.post("/v1/rerank", {{"query", "a"}, {"documents", {"b"}}}),
                    "this server runs --task generate");
  EXPECT_EQ(generate.get("/v1/models").json()["data"][0]["task"], "generate");
  EXPECT_EQ(embed.terminate(), 0);
  EXPECT_EQ(generate.terminate(), 0);
}

// A server that cannot do what --task asks does not start, and says why.
TEST(ServerEmbeddings, ImpossibleTasksRefuseToStart) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"serve", "-m", random_qwen3_embed_model(), "--task", "rerank"},
       "qwen3.pooling_type is last (an embedding model): serve it with --task embed"},
      {{"serve", "-m", random_qwen3_rank_model(), "--task", "embed"},
       "qwen3.pooling_type is rank (a reranker)"},
      {{"serve", "-m", test::shared_path(test::kStories260K), "--task", "embed"},
       "the model file declares no pooling (llama.pooling_type); pass --pooling mean, cls or last"},
      {{"serve", "-m", test::shared_path(test::kStories260K), "--task", "rerank"},
       "the model has no rank head"},
      {{"serve", "-m", test::shared_path(test::kStories260K), "--pooling", "mean"},
       "--pooling needs --task embed or rerank"}};
  for (const auto& [args, want] : cases) {
    std::string cmd;
    for (const std::string& a : args) cmd += a + " ";
    // `timeout`: a server that started anyway must not hang the test.
    const test::CommandResult r = test::run_shell("timeout 30 " + test::arbor_bin() + " " + cmd +
                                                  "--port 0 --num-kv-blocks 64");
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.output().find(want), std::string::npos) << cmd << "\n" << r.output();
  }
}

std::vector<float> scores_by_index(const json& results, size_t n) {
  std::vector<float> s(n, -1.0f);
  for (const json& r : results) s[r["index"].get<size_t>()] = r["relevance_score"].get<float>();
  return s;
}

const std::vector<std::string> kDocs = {"The giant panda is a bear native to China.",
                                        "Paris is the capital of France.",
                                        "Pandas eat bamboo.", "hello"};

// The rank head file (cls.output.weight, llama.cpp's fallback prompt): results by decreasing
// score, top_n, return_documents, usage; each document scored alone gets the same score.
TEST(ServerRerank, RankHeadShapeOrderAndBatchedEqualsAlone) {
  ServerProcess server({"--task", "rerank", "--max-num-batched-tokens", "16"}, 0,
                       random_qwen3_rank_model());
  ASSERT_TRUE(server.ok());
  HttpResult r = server.post("/v1/rerank", {{"model", "random_qwen3_rank"},
                                            {"query", "What do pandas eat?"},
                                            {"documents", kDocs}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["model"], "random_qwen3_rank");
  ASSERT_EQ(j["results"].size(), kDocs.size());
  for (size_t i = 1; i < j["results"].size(); ++i) {
    EXPECT_GE(j["results"][i - 1]["relevance_score"].get<double>(),
              j["results"][i]["relevance_score"].get<double>());
  }
  const std::vector<float> scores = scores_by_index(j["results"], kDocs.size());
  int64_t tokens = 0;
  for (size_t i = 0; i < kDocs.size(); ++i) {
    EXPECT_GT(scores[i], 0.0f);
    EXPECT_LT(scores[i], 1.0f);
    EXPECT_FALSE(j["results"][i].contains("document"));
    const HttpResult one =
        server.post("/v1/rerank", {{"query", "What do pandas eat?"}, {"documents", {kDocs[i]}}});
    ASSERT_EQ(one.status, 200) << one.body;
    EXPECT_EQ(one.json()["results"][0]["relevance_score"].get<float>(), scores[i]) << i;
    tokens += one.json()["usage"]["prompt_tokens"].get<int64_t>();
    // llama.cpp's fallback prompt: the query's tokens then the document's (the Qwen 3 vocabulary
    // adds no BOS or EOS).
    const int64_t q = server.post("/tokenize", {{"prompt", "What do pandas eat?"}})
                          .json()["count"].get<int64_t>();
    const int64_t d = server.post("/tokenize", {{"prompt", kDocs[i]}}).json()["count"].get<int64_t>();
    EXPECT_EQ(one.json()["usage"]["prompt_tokens"], q + d) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokens);
  r = server.post("/v1/rerank", {{"query", "What do pandas eat?"},
                                 {"documents", kDocs},
                                 {"top_n", 2},
                                 {"return_documents", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  j = r.json();
  ASSERT_EQ(j["results"].size(), 2u);
  for (const json& res : j["results"]) {
    const size_t i = res["index"].get<size_t>();
    EXPECT_EQ(res["document"]["text"], kDocs[i]);
  }
  EXPECT_EQ(j["results"][0]["relevance_score"].get<float>(),
            *std::max_element(scores.begin(), scores.end()));
  // Jina's document objects and the /rerank alias.
  r = server.post("/rerank", {{"query", "What do pandas eat?"},
                              {"documents", {{{"text", kDocs[2]}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["results"][0]["relevance_score"].get<float>(), scores[2]);
  EXPECT_EQ(server.get("/v1/models").json()["data"][0]["task"], "rerank");
  EXPECT_TRUE(server.wait_no_blocks_used());
  EXPECT_EQ(server.terminate(), 0);
}

// A Qwen3-Reranker converted without a rank head (plain qwen3, no pooling_type): the LM head's
// "yes" and "no" rows with the Qwen3-Reranker prompt, which holds the query and the document.
TEST(ServerRerank, Qwen3YesNoConventionUsesItsPrompt) {
  ServerProcess server({"--task", "rerank"}, 0, random_qwen3_plain_model());
  ASSERT_TRUE(server.ok());
  const HttpResult r = server.post("/v1/rerank", {{"query", "q"}, {"documents", {"d"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const float score = r.json()["results"][0]["relevance_score"].get<float>();
  EXPECT_GT(score, 0.0f);
  EXPECT_LT(score, 1.0f);
  // The Qwen3-Reranker prompt around "q" and "d": its tokens with the control tokens parsed.
  const int64_t tokens = r.json()["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_GT(tokens, 50) << r.body;
  EXPECT_LT(tokens, 80) << r.body;
  EXPECT_EQ(server.terminate(), 0);
}

// A file's tokenizer.chat_template.rerank is the prompt: "{query}" and "{document}" filled in
// once (a query holding "{document}" stays as written).
TEST(ServerRerank, FileTemplateIsThePrompt) {
  test::TempDir dir("rerank_template");
  const std::string path = dir / "templated.gguf";
  {
    auto f = gguf::GgufFile::open(random_qwen3_rank_model());
    ASSERT_TRUE(f.ok());
    gguf::GgufWriter w = gguf::GgufWriter::from_file(*f);
    w.set("tokenizer.chat_template.rerank",
          gguf::Value::str("Query: {query} Document: {document}"));
    ASSERT_TRUE(w.write(path).ok());
  }
  ServerProcess server({"--task", "rerank"}, 0, path);
  ASSERT_TRUE(server.ok());
  const std::string query = "pandas {document}";
  const HttpResult r = server.post("/v1/rerank", {{"query", query}, {"documents", {"bamboo"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json want = server.post("/tokenize", {{"prompt", "Query: pandas {document} Document: bamboo"},
                                              {"add_special_tokens", false}}).json();
  EXPECT_EQ(r.json()["usage"]["prompt_tokens"], want["count"]);
  EXPECT_EQ(server.terminate(), 0);
}

}  // namespace
}  // namespace arbor::server::testing
