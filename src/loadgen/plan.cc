#include "loadgen/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace arbor::loadgen {
namespace {

using nlohmann::json;

// Short common words; in Llama-family vocabularies each is one token with its leading space.
constexpr const char* kWords[] = {
    "the",  "of",   "and",   "to",    "in",   "is",   "was",  "it",  "for",  "on",
    "with", "as",   "at",    "by",    "he",   "she",  "they", "we",  "you",  "a",
    "an",   "that", "this",  "from",  "or",   "had",  "not",  "but", "what", "all",
    "were", "when", "there", "can",   "one",  "time", "day",  "way", "man",  "cat",
    "dog",  "sun",  "tree",  "house", "girl", "boy",  "ball", "red", "big",  "little"};

int32_t jitter(std::mt19937_64& rng, int32_t len, double ratio) {
  if (ratio <= 0) return len;
  const auto lo = static_cast<int32_t>(std::floor(len * (1.0 - ratio)));
  const auto hi = static_cast<int32_t>(std::ceil(len * (1.0 + ratio)));
  std::uniform_int_distribution<int32_t> d(std::max(lo, 1), std::max(hi, 1));
  return d(rng);
}

}  // namespace

Result<std::vector<RequestPlan>> synthetic_plan(const SyntheticOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1) {
    return invalid_argument("--num-prompts (", o.num_prompts, "), --input-len (", o.input_len,
                            ") and --output-len (", o.output_len, ") must be >= 1");
  }
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return invalid_argument("--range-ratio ", o.range_ratio, " must be in [0, 1)");
  }
  if (o.token_ids && o.vocab_size < 4) {
    return invalid_argument("--vocab-size ", o.vocab_size, " must be >= 4");
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(3, std::max(o.vocab_size - 1, 3));
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::vector<RequestPlan> plans(static_cast<size_t>(o.num_prompts));
  for (RequestPlan& p : plans) {
    const int32_t in = jitter(rng, o.input_len, o.range_ratio);
    p.max_tokens = jitter(rng, o.output_len, o.range_ratio);
    std::string s;
    if (o.token_ids) {
      s = "[";
      for (int32_t i = 0; i < in; ++i) {
        if (i > 0) s += ',';
        s += std::to_string(tok(rng));
      }
      s += "]";
      p.prompt_len = in;
    } else {
      for (int32_t i = 0; i < in; ++i) {
        if (i > 0) s += ' ';
        s += kWords[word(rng)];
      }
      s = json(s).dump();
    }
    p.prompt_json = std::move(s);
  }
  return plans;
}

Result<std::vector<RequestPlan>> shared_prefix_plan(const SharedPrefixOptions& o) {
  if (o.num_system_prompts < 1 || o.system_prompt_len < 1 || o.num_users < 1 || o.turns < 1 ||
      o.turn_len < 1 || o.output_len < 1) {
    return invalid_argument("the shared-prefix workload needs every count >= 1 (system prompts ",
                            o.num_system_prompts, " of ", o.system_prompt_len, " tokens, ",
                            o.num_users, " users, ", o.turns, " turns of ", o.turn_len,
                            " tokens, output ", o.output_len, ")");
  }
  if (o.vocab_size < 4) return invalid_argument("--vocab-size ", o.vocab_size, " must be >= 4");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> tok(3, o.vocab_size - 1);
  auto tokens = [&](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = tok(rng);
    return t;
  };
  std::vector<std::vector<int32_t>> systems;
  for (int32_t i = 0; i < o.num_system_prompts; ++i) systems.push_back(tokens(o.system_prompt_len));
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(o.num_users));
  for (int32_t u = 0; u < o.num_users; ++u) history[static_cast<size_t>(u)] = systems[static_cast<size_t>(u % o.num_system_prompts)];
  std::vector<RequestPlan> plans;
  for (int32_t t = 0; t < o.turns; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(o.num_users));
    for (int32_t u = 0; u < o.num_users; ++u) order[static_cast<size_t>(u)] = u;
    std::shuffle(order.begin(), order.end(), rng);
    for (int32_t u : order) {
      std::vector<int32_t>& h = history[static_cast<size_t>(u)];
      const std::vector<int32_t> turn = tokens(o.turn_len);
      h.insert(h.end(), turn.begin(), turn.end());
      RequestPlan p;
      p.prompt_json = "[";
      for (size_t i = 0; i < h.size(); ++i) {
        if (i > 0) p.prompt_json += ',';
        p.prompt_json += std::to_string(h[i]);
      }
      p.prompt_json += "]";
      p.prompt_len = static_cast<int64_t>(h.size());
      p.max_tokens = o.output_len;
      plans.push_back(std::move(p));
    }
  }
  return plans;
}

Result<std::vector<RequestPlan>> load_jsonl_plan(const std::string& path, int32_t num_prompts,
                                                 int32_t default_max_tokens) {
  std::ifstream in(path);
  if (!in) return io_error("cannot open prompt file '", path, "'");
  std::vector<RequestPlan> file;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = str_cat(path, ":", lineno);
    if (!j.is_object()) return invalid_argument(where, ": not a JSON object");
    auto pr = j.find("prompt");
    if (pr == j.end()) return invalid_argument(where, ": no \"prompt\"");
    RequestPlan p;
    p.max_tokens = default_max_tokens;
    if (pr->is_string()) {
      p.prompt_json = pr->dump();
    } else if (pr->is_array() && !pr->empty() &&
               std::all_of(pr->begin(), pr->end(),
                           [](const json& v) { return v.is_number_integer(); })) {
      p.prompt_json = pr->dump();
      p.prompt_len = static_cast<int64_t>(pr->size());
    } else {
      return invalid_argument(where,
                              ": \"prompt\" must be a string or a non-empty array of token ids");
    }
    if (auto mt = j.find("max_tokens"); mt != j.end()) {
      if (!mt->is_number_integer() || mt->get<int64_t>() < 1 || mt->get<int64_t>() > (1 << 30)) {
        return invalid_argument(where, ": \"max_tokens\" must be a positive integer");
      }
      p.max_tokens = mt->get<int32_t>();
    }
    file.push_back(std::move(p));
  }
  if (file.empty()) return invalid_argument("prompt file '", path, "' has no prompts");
  if (num_prompts < 1) return invalid_argument("--num-prompts ", num_prompts, " must be >= 1");
  std::vector<RequestPlan> plans;
  plans.reserve(static_cast<size_t>(num_prompts));
  for (int32_t i = 0; i < num_prompts; ++i)
    plans.push_back(file[static_cast<size_t>(i) % file.size()]);
  return plans;
}

std::vector<double> arrival_offsets(int32_t n, double rate, double burstiness, uint64_t seed) {
  ARBOR_CHECK(rate > 0 && burstiness > 0) << "rate " << rate << " burstiness " << burstiness;
  std::vector<double> out(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (std::isinf(rate)) return out;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> exp(rate);
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (size_t i = 1; i < out.size(); ++i) {
    t += burstiness == 1.0 ? exp(rng) : gamma(rng);
    out[i] = t;
  }
  return out;
}

Result<std::string> request_body(const RequestPlan& plan, const BodyOptions& o) {
  // Built by hand around the prompt so a long id list is not parsed back into a json tree.
  std::string b = "{";
  if (!o.model.empty()) b += "\"model\":" + json(o.model).dump() + ",";
  if (o.chat) {
    if (plan.prompt_json.empty() || plan.prompt_json[0] != '"') {
      return invalid_argument(
          "chat requests need text prompts (token-id prompts only work with "
          "/v1/completions; use --prompt-format text)");
    }
    b += "\"messages\":[{\"role\":\"user\",\"content\":" + plan.prompt_json + "}],";
    b += "\"max_completion_tokens\":" + std::to_string(plan.max_tokens) + ",";
  } else {
    b += "\"prompt\":" + plan.prompt_json + ",";
    b += "\"max_tokens\":" + std::to_string(plan.max_tokens) + ",";
  }
  b += "\"temperature\":" + json(o.temperature).dump() + ",";
  b += std::string("\"ignore_eos\":") + (o.ignore_eos ? "true" : "false") + ",";
  b += "\"stream\":true";
  if (o.include_usage) b += ",\"stream_options\":{\"include_usage\":true}";
  b += "}";
  return b;
}

}  // namespace arbor::loadgen
