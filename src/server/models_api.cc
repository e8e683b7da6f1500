#include "server/models_api.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace arbor::server {

using nlohmann::json;

namespace {

json card(const ModelInfo& model, std::string_view id) {
  // "root" is the served name, never the file path (docs/server.md, "Deploying").
  json c{{"id", id},
         {"object", "model"},
         {"created", model.created},
         {"owned_by", "arbor"},
         {"root", model.name},
         {"max_model_len", model.context_length},
         {"task", serve_task_name(model.task)}};
  if (model.pooling) c["pooling"] = step::pooling_type_name(*model.pooling);
  if (model.task == ServeTask::kEmbed) c["embedding_dim"] = model.embedding_dim;
  return c;
}

}  // namespace

bool is_served_name(const ModelInfo& model, std::string_view requested) {
  return requested == model.name ||
         std::find(model.aliases.begin(), model.aliases.end(), requested) != model.aliases.end();
}

ApiError unknown_model(const ModelInfo& model, std::string_view requested) {
  std::string served = str_cat("'", model.name, "'");
  for (const std::string& alias : model.aliases) served += str_cat(", '", alias, "'");
  ApiError e = model_not_found(requested);
  e.message += str_cat("; this server serves ", served,
                       " (start it with --accept-any-model-name to accept any model name)");
  return e;
}

std::string models_json(const ModelInfo& model) {
  json data = json::array({card(model, model.name)});
  for (const std::string& alias : model.aliases) data.push_back(card(model, alias));
  return dump_json(json{{"object", "list"}, {"data", std::move(data)}});
}

std::string model_json(const ModelInfo& model, std::string_view id) {
  return dump_json(card(model, id));
}

}  // namespace arbor::server
