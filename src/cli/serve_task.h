// `arbor serve --task generate|embed|rerank` and `--pooling`: what the server serves and how
// (docs/server.md, "Embeddings and rerank"). Header-only, for cmd_serve.cc and cmd_shard.cc (a
// shard applies the executor's side of the task: apply_task).
//
//   generate (default)  the completions, chat and TGI routes; /v1/embeddings and /v1/rerank 404
//   embed               POST /v1/embeddings: one vector per input, pooled with --pooling or the
//                       file's <arch>.pooling_type (mean, cls or last), L2-normalised
//   rerank              POST /v1/rerank: rank pooling with the file's rank head
//                       (cls.output.weight), or for a qwen3 file without one the Qwen3-Reranker
//                       convention (the LM head's "yes" and "no" rows); the prompt is the file's
//                       tokenizer.chat_template.rerank, the Qwen3-Reranker prompt for the yes/no
//                       convention, else llama.cpp's fallback (BOS, query, EOS, document, EOS)
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "executor/local_executor.h"
#include "gguf/gguf.h"
#include "model/model_config.h"
#include "server/api_common.h"
#include "server/embeddings_api.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {

struct TaskOptions {
  std::string task = "generate";
  std::string pooling;  // "" = the file's
};

// What the task needs to know of the model file (task_facts()).
struct TaskFacts {
  model::ModelConfig config;
  bool has_rank_head = false;                  // cls.output.weight
  std::optional<std::string> rerank_template;  // tokenizer.chat_template.rerank
};

inline void add_task_flags(CLI::App& app, TaskOptions* o) {
  app.add_option("--task", o->task,
                 "What to serve: generate (text: completions, chat, TGI), embed "
                 "(/v1/embeddings) or rerank (/v1/rerank); other routes answer 404")
      ->check(CLI::IsMember({"generate", "embed", "rerank"}))
      ->capture_default_str();
  app.add_option("--pooling", o->pooling,
                 "How --task embed pools a prompt's hidden states into one vector: mean, cls "
                 "(first token) or last (default: the file's <arch>.pooling_type); --task "
                 "rerank uses rank")
      ->check(CLI::IsMember({"mean", "cls", "last", "rank"}));
}

namespace serve_task_internal {

inline std::string file_pooling_name(int pooling_type) {
  switch (pooling_type) {
    case -1: return "unspecified";
    case 0: return "none";
    default: return std::string(step::pooling_type_name(static_cast<step::PoolingType>(pooling_type)));
  }
}

// --task embed: the pooling from the flag or the file.
inline Result<step::PoolingType> embed_pooling(const TaskOptions& o, const model::ModelConfig& c) {
  if (!o.pooling.empty()) {
    const step::PoolingType p = *step::parse_pooling_type(o.pooling);
    if (p == step::PoolingType::kRank) {
      return invalid_argument("--pooling rank scores (query, document) pairs: use --task rerank");
    }
    return p;
  }
  const std::string key = c.arch_name + ".pooling_type";
  switch (c.pooling_type) {
    case 1: case 2: case 3: return static_cast<step::PoolingType>(c.pooling_type);
    case 0:
      return invalid_argument(key, " is none (one vector per token), which /v1/embeddings does "
                              "not return; pass --pooling mean, cls or last");
    case 4:
      return invalid_argument(key, " is rank (a reranker): serve it with --task rerank, or pass "
                              "--pooling mean, cls or last");
    default:
      return invalid_argument("the model file declares no pooling (", key,
                              "); pass --pooling mean, cls or last (Qwen3-Embedding: last)");
  }
}

// The Qwen3-Reranker convention's tokens ("yes" first), or an error naming what is missing.
inline Result<std::pair<int32_t, int32_t>> yes_no_tokens(const model::ModelConfig& c,
                                                        const tokenizer::Tokenizer& tok) {
  const int32_t yes = tok.token_id("yes"), no = tok.token_id("no");
  if (c.arch_name != "qwen3" || yes < 0 || no < 0) {
    return invalid_argument(
        "--task rerank: the model has no rank head (cls.output.weight) and is not a qwen3 file "
        "whose vocabulary has the tokens \"yes\" and \"no\" (the Qwen3-Reranker convention)");
  }
  return std::pair{yes, no};
}

// --task rerank: the rank head (the file's, or the Qwen3-Reranker yes/no rows) and the prompt.
inline Status setup_rerank(const TaskOptions& o, const TaskFacts& f,
                           const tokenizer::Tokenizer& tok, server::ModelInfo* info) {
  const model::ModelConfig& c = f.config;
  if (!o.pooling.empty() && o.pooling != "rank") {
    return invalid_argument("--task rerank uses rank pooling, not --pooling ", o.pooling);
  }
  if (c.pooling_type >= 1 && c.pooling_type <= 3) {
    return invalid_argument(c.arch_name, ".pooling_type is ", file_pooling_name(c.pooling_type),
                            " (an embedding model): serve it with --task embed");
  }
  if (f.rerank_template) info->rerank_template = *f.rerank_template;
  std::string head = "cls.output.weight";
  if (!f.has_rank_head) {
    ARBOR_ASSIGN_OR_RETURN(const auto yes_no, yes_no_tokens(c, tok));
    head = str_cat("the LM head's rows of 'yes' (", yes_no.first, ") and 'no' (", yes_no.second,
                   ")");
    if (!f.rerank_template) info->rerank_template = server::kQwen3RerankTemplate;
  }
  info->pooling = step::PoolingType::kRank;
  ARBOR_LOG(kInfo) << "task: rerank (POST /v1/rerank): rank pooling of the last token with "
                   << head << ", softmaxed; relevance_score = the first class; prompt: "
                   << (f.rerank_template ? "the file's tokenizer.chat_template.rerank"
                       : !info->rerank_template.empty()
                           ? "the Qwen3-Reranker prompt"
                           : "BOS, query, EOS, document, EOS as the vocabulary adds them");
  return ok_status();
}

}  // namespace serve_task_internal

// What serving a task needs to know of the model, read from the file alone (no weights), so
// that an engine whose model runs in shards sets its routes up as one that runs it in process.
inline Result<TaskFacts> task_facts(const gguf::GgufFile& file) {
  TaskFacts f;
  ARBOR_ASSIGN_OR_RETURN(f.config, model::ModelConfig::from_gguf(file));
  f.has_rank_head = file.find_tensor("cls.output.weight") != nullptr;
  if (file.find("tokenizer.chat_template.rerank") != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(f.rerank_template, file.get_string("tokenizer.chat_template.rerank"));
  }
  return f;
}

// The server's side of --task: fills info's task fields and logs the task. Errors name the flag
// or the file's key.
inline Status setup_task(const TaskOptions& o, const TaskFacts& f, const tokenizer::Tokenizer& tok,
                         server::ModelInfo* info) {
  const model::ModelConfig& c = f.config;
  if (o.task == "generate") {
    if (!o.pooling.empty()) return invalid_argument("--pooling needs --task embed or rerank");
    info->task = server::ServeTask::kGenerate;
    if (c.pooling_type > 0) {
      ARBOR_LOG(kWarn) << "the model file declares " << c.arch_name << ".pooling_type "
                       << serve_task_internal::file_pooling_name(c.pooling_type)
                       << " (an embedding or rerank model?); serving it with --task generate";
    }
    return ok_status();
  }
  if (o.task == "rerank") {
    info->task = server::ServeTask::kRerank;
    return serve_task_internal::setup_rerank(o, f, tok, info);
  }
  info->task = server::ServeTask::kEmbed;
  ARBOR_ASSIGN_OR_RETURN(const step::PoolingType p, serve_task_internal::embed_pooling(o, c));
  info->pooling = p;
  info->embedding_dim = c.dim;
  ARBOR_LOG(kInfo) << "task: embed (POST /v1/embeddings): " << step::pooling_type_name(p)
                   << " pooling" << (o.pooling.empty() ? " (the file's)" : " (--pooling)")
                   << ", " << c.dim << "-dimensional vectors, L2-normalised";
  return ok_status();
}

// The executor's side of --task (in process, and in each shard: `arbor shard --task rerank`):
// a rerank model without its own rank head gets the Qwen3-Reranker rows of its LM head.
inline Status apply_task(const TaskOptions& o, executor::LocalExecutor& exec,
                         const tokenizer::Tokenizer& tok) {
  if (o.task != "rerank" || exec.rank_head()) return ok_status();
  const model::LlamaModel& m = exec.runner().model();
  ARBOR_ASSIGN_OR_RETURN(const auto yes_no, serve_task_internal::yes_no_tokens(m.config(), tok));
  const int32_t ids[] = {yes_no.first, yes_no.second};
  const std::string names[] = {"yes", "no"};
  ARBOR_ASSIGN_OR_RETURN(executor::RankHead head, executor::rank_head_from_tokens(m, ids, names));
  exec.set_rank_head(std::move(head));
  return ok_status();
}

// The task's flags for the shards an engine launches (they apply the executor's side).
inline std::vector<std::string> task_shard_args(const TaskOptions& o) {
  std::vector<std::string> args = {"--task", o.task};
  if (!o.pooling.empty()) args.insert(args.end(), {"--pooling", o.pooling});
  return args;
}

}  // namespace arbor::cli
