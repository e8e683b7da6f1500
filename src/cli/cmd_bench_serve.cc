// arbor bench serve: a load generator for a running server on this machine (vLLM's
// benchmark_serving). Sends streaming OpenAI requests at a Poisson rate (or all at once, with an
// optional concurrency cap), from synthetic prompts or a JSONL file, and reports TTFT, TPOT, ITL
// and end-to-end latency, throughput and goodput, per rate of a sweep. The client is
// src/loadgen (client.h describes its design, metrics.h the definitions); docs/loadgen.md.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/progress.h"
#include "cli/bench_command.h"
#include "cli/command.h"
#include "loadgen/client.h"
#include "loadgen/plan.h"
#include "loadgen/report.h"
#include "loadgen/url.h"

namespace arbor::cli {
namespace cmd_bench_serve {  // named, not anonymous: the commands share unity sources

using nlohmann::json;

struct Options {
  std::string url = "http://127.0.0.1:8080";
  std::string model;  // "" = the first model of GET /v1/models
  std::string endpoint = "/v1/completions";
  std::string prompts_file;
  std::string workload = "random";
  loadgen::SyntheticOptions synthetic;
  loadgen::SharedPrefixOptions shared;  // --workload shared-prefix
  std::string prompt_format = "auto";  // ids for /v1/completions, text for chat
  std::vector<std::string> rates = {"inf"};
  double burstiness = 1.0;
  int32_t max_concurrency = 0;
  double max_seconds = 600;
  double temperature = 0;
  bool no_ignore_eos = false;
  bool no_keep_alive = false;
  int32_t warmup = 1;
  std::vector<std::string> goodput;
  std::string result_json;
  std::string result_md;
  std::string plot;
};

// Everything resolved from the flags before any request is sent.
struct Prepared {
  loadgen::ServerUrl server;
  std::vector<double> rates;
  loadgen::SloSpec slos;
  std::string model;
  loadgen::BodyOptions body;
  json config;
};

// The requests of one run.
struct Batch {
  std::vector<std::string> requests;  // [num_prompts] HTTP text
  std::vector<int64_t> prompt_lens;   // [num_prompts]
};

// --prompt-format auto: token ids for completions, text for chat (which takes no ids).
bool token_id_prompts(const Options& o) {
  return o.prompt_format == "ids" ||
         (o.prompt_format == "auto" && o.endpoint != "/v1/chat/completions");
}

// Synthetic prompts are drawn from `seed`; each rate of a sweep gets its own seed (--seed + run
// index) so that a later rate does not hit the prefix cache the earlier ones filled. A JSONL
// file gives the same prompts every time.
Result<Batch> make_batch(const Options& o, const Prepared& p, uint64_t seed) {
  loadgen::SyntheticOptions so = o.synthetic;
  so.token_ids = token_id_prompts(o);
  so.seed = seed;
  std::vector<loadgen::RequestPlan> plans;
  if (o.workload == "shared-prefix") {
    loadgen::SharedPrefixOptions sp = o.shared;
    sp.output_len = o.synthetic.output_len;
    sp.vocab_size = o.synthetic.vocab_size;
    sp.seed = seed;
    ARBOR_ASSIGN_OR_RETURN(plans, loadgen::shared_prefix_plan(sp));
  } else if (o.prompts_file.empty()) {
    ARBOR_ASSIGN_OR_RETURN(plans, loadgen::synthetic_plan(so));
  } else {
    ARBOR_ASSIGN_OR_RETURN(plans,
                           loadgen::load_jsonl_plan(o.prompts_file, so.num_prompts, so.output_len));
  }
  Batch b;
  for (const loadgen::RequestPlan& plan : plans) {
    ARBOR_ASSIGN_OR_RETURN(std::string body, loadgen::request_body(plan, p.body));
    b.requests.push_back(loadgen::http_post_text(p.server, o.endpoint, body));
    b.prompt_lens.push_back(plan.prompt_len);
  }
  return b;
}

Result<std::vector<double>> parse_rates(const std::vector<std::string>& items) {
  std::vector<double> out;
  for (const std::string& s : items) {
    if (s == "inf") {
      out.push_back(loadgen::kInfiniteRate);
      continue;
    }
    char* end = nullptr;
    const double r = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !(r > 0) || !std::isfinite(r)) {
      return invalid_argument("--request-rate '", s, "' must be a positive number or 'inf'");
    }
    out.push_back(r);
  }
  if (out.empty()) return invalid_argument("--request-rate needs at least one rate");
  return out;
}

// The served model name (GET /v1/models), which also proves the server is there.
Result<std::string> discover_model(const loadgen::ServerUrl& server, const std::string& url,
                                   const std::string& given) {
  auto reply = loadgen::http_request(server, "GET", "/v1/models", "", 10.0);
  if (!reply.ok()) {
    return failed_precondition("cannot reach the server at ", url, ": ", reply.status().message());
  }
  if (!given.empty()) return given;
  const json j = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (reply->status == 200 && j.is_object() && j.contains("data") && j["data"].is_array() &&
      !j["data"].empty() && j["data"][0].is_object() && j["data"][0].contains("id") &&
      j["data"][0]["id"].is_string()) {
    return j["data"][0]["id"].get<std::string>();
  }
  return failed_precondition("GET ", url, "/v1/models answered ", reply->status,
                             " without a model id; pass --model");
}

Status validate(const Options& o) {
  if (o.workload == "shared-prefix" && (o.endpoint != "/v1/completions" || !o.prompts_file.empty())) {
    return invalid_argument("--workload shared-prefix sends token ids to /v1/completions "
                            "(no --prompts-file, no chat endpoint)");
  }
  if (o.endpoint != "/v1/completions" && o.endpoint != "/v1/chat/completions") {
    return invalid_argument("--endpoint '", o.endpoint,
                            "' must be /v1/completions or /v1/chat/completions");
  }
  if (o.prompt_format != "auto" && o.prompt_format != "ids" && o.prompt_format != "text") {
    return invalid_argument("--prompt-format '", o.prompt_format, "' must be auto, ids or text");
  }
  if (!(o.burstiness > 0)) return invalid_argument("--burstiness ", o.burstiness, " must be > 0");
  if (o.max_concurrency < 0) return invalid_argument("--max-concurrency must be >= 0");
  if (!(o.max_seconds >= 0)) return invalid_argument("--max-seconds must be >= 0");
  if (o.warmup < 0) return invalid_argument("--warmup must be >= 0");
  return ok_status();
}

Result<Prepared> prepare(const Options& o) {
  ARBOR_RETURN_IF_ERROR(validate(o));
  Prepared p;
  ARBOR_ASSIGN_OR_RETURN(p.server, loadgen::parse_server_url(o.url));
  ARBOR_ASSIGN_OR_RETURN(p.rates, parse_rates(o.rates));
  ARBOR_ASSIGN_OR_RETURN(p.slos, loadgen::parse_slos(o.goodput));
  const loadgen::SyntheticOptions& so = o.synthetic;
  p.body.chat = o.endpoint == "/v1/chat/completions";
  p.body.ignore_eos = !o.no_ignore_eos;
  p.body.temperature = o.temperature;
  ARBOR_RETURN_IF_ERROR(make_batch(o, p, so.seed).status());  // bad prompts fail before any I/O
  ARBOR_ASSIGN_OR_RETURN(p.model, discover_model(p.server, o.url, o.model));
  p.body.model = p.model;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  p.config = {{"date", date},
              {"url", o.url},
              {"model", p.model},
              {"endpoint", o.endpoint},
              {"dataset", o.prompts_file.empty() ? "random" : o.prompts_file},
              {"num_prompts", so.num_prompts},
              {"seed", so.seed},
              {"request_rates", o.rates},
              {"burstiness", o.burstiness},
              {"max_concurrency", o.max_concurrency},
              {"max_seconds", o.max_seconds},
              {"temperature", o.temperature},
              {"ignore_eos", !o.no_ignore_eos},
              {"keep_alive", !o.no_keep_alive},
              {"warmup", o.warmup},
              {"goodput", o.goodput}};
  if (o.prompts_file.empty()) {
    p.config["input_len"] = so.input_len;
    p.config["output_len"] = so.output_len;
    p.config["range_ratio"] = so.range_ratio;
    p.config["prompt_format"] = token_id_prompts(o) ? "ids" : "text";
    if (token_id_prompts(o)) p.config["vocab_size"] = so.vocab_size;
  }
  return p;
}

void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

loadgen::LoadOptions load_options(const Options& o, const Prepared& p) {
  loadgen::LoadOptions lo;
  lo.server = p.server;
  lo.chat = o.endpoint == "/v1/chat/completions";
  lo.max_concurrency = o.max_concurrency;
  lo.max_seconds = o.max_seconds;
  lo.keep_alive = !o.no_keep_alive;
  return lo;
}

// --warmup requests, all at once and untimed, with prompts no run uses (synthetic): pages the
// server's weights in, and a request the server rejects (a token id past its vocabulary) fails
// here, with its message.
Status warm_up(const Options& o, const Prepared& p) {
  if (o.warmup == 0) return ok_status();
  ARBOR_ASSIGN_OR_RETURN(Batch b, make_batch(o, p, o.synthetic.seed + p.rates.size()));
  const size_t n = std::min(static_cast<size_t>(o.warmup), b.requests.size());
  const std::vector<std::string> reqs(b.requests.begin(), b.requests.begin() + n);
  const std::vector<int64_t> lens(b.prompt_lens.begin(), b.prompt_lens.begin() + n);
  loadgen::LoadOptions lo = load_options(o, p);
  lo.max_seconds = 0;
  ARBOR_ASSIGN_OR_RETURN(loadgen::LoadResult r,
                         loadgen::run_load(lo, reqs, std::vector<double>(n, 0.0), lens));
  for (const loadgen::RequestRecord& rec : r.records) {
    if (rec.outcome != loadgen::Outcome::kOk) {
      return failed_precondition("warm-up request failed: ", rec.error);
    }
  }
  return ok_status();
}

void print_config(const Prepared& p) {
  std::printf("arbor bench serve\n");
  for (auto it = p.config.begin(); it != p.config.end(); ++it) {
    std::printf("  %-16s %s\n", it.key().c_str(),
                it->is_string() ? it->get<std::string>().c_str() : it->dump().c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void print_run(const loadgen::RunReport& r) {
  const loadgen::ServingMetrics& m = r.metrics;
  const std::string schedule =
      r.scheduled_rate > 0 ? str_cat("schedule ", loadgen::rate_string(r.scheduled_rate), ", ")
                           : std::string();
  std::fprintf(stderr,
               "rate %s: %lld ok, %lld failed, %lld aborted, %lld not sent in %.2f s; %.2f req/s, "
               "%.1f output tok/s; sent at %.1f req/s (%sissue lag p99 %.3f ms); TTFT p50 %.2f "
               "ms, ITL p50 %.2f ms\n",
               loadgen::rate_string(r.request_rate).c_str(), static_cast<long long>(m.completed),
               static_cast<long long>(m.failed), static_cast<long long>(m.aborted),
               static_cast<long long>(m.not_sent), m.duration_s, m.request_throughput,
               m.output_throughput, r.achieved_send_rate, schedule.c_str(), r.issue_lag.p99 * 1000,
               m.ttft.median * 1000, m.itl.median * 1000);
  for (const std::string& e : r.first_errors) std::fprintf(stderr, "  error: %s\n", e.c_str());
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return io_error("cannot write '", path, "'");
  f << text;
  return f.good() ? ok_status() : io_error("writing '", path, "' failed");
}

Status write_outputs(const Options& o, const Prepared& p,
                     const std::vector<loadgen::RunReport>& runs) {
  const std::string table = loadgen::markdown_table(runs, p.slos);
  std::printf("%s", table.c_str());
  if (!o.result_json.empty()) {
    json j{{"config", p.config}, {"runs", json::array()}};
    for (const auto& r : runs) j["runs"].push_back(loadgen::run_json(r));
    ARBOR_RETURN_IF_ERROR(write_text(o.result_json, j.dump(2) + "\n"));
  }
  if (!o.result_md.empty()) {
    std::string md = "`" + p.model + "` at " + o.url + o.endpoint + ", " +
                     std::to_string(o.synthetic.num_prompts) + " prompts per rate";
    if (o.prompts_file.empty()) {
      md += str_cat(", ", o.synthetic.input_len, " prompt + ", o.synthetic.output_len,
                    " output tokens");
    }
    if (o.max_concurrency > 0) md += str_cat(", max concurrency ", o.max_concurrency);
    ARBOR_RETURN_IF_ERROR(write_text(o.result_md, md + "\n\n" + table));
  }
  if (!o.plot.empty()) {
    const Status s = loadgen::write_plots(runs, o.plot);
    if (s.code() == StatusCode::kFailedPrecondition) {
      ARBOR_LOG(kWarn) << s.message();
    } else {
      ARBOR_RETURN_IF_ERROR(s);
      ARBOR_LOG(kInfo) << "plots: " << o.plot << ".svg, " << o.plot << ".png";
    }
  }
  return ok_status();
}

Status run(const Options& o) {
  ARBOR_ASSIGN_OR_RETURN(Prepared p, prepare(o));
  raise_fd_limit();
  print_config(p);
  ARBOR_RETURN_IF_ERROR(warm_up(o, p));
  std::vector<loadgen::RunReport> runs;
  int64_t completed = 0;
  for (size_t i = 0; i < p.rates.size(); ++i) {
    const double rate = p.rates[i];
    ARBOR_ASSIGN_OR_RETURN(Batch b, make_batch(o, p, o.synthetic.seed + i));
    const auto arrivals = loadgen::arrival_offsets(static_cast<int32_t>(b.requests.size()), rate,
                                                   o.burstiness, o.synthetic.seed);
    ProgressBar bar("rate " + loadgen::rate_string(rate), b.requests.size(), "requests");
    loadgen::LoadOptions lo = load_options(o, p);
    lo.on_progress = [&bar](int64_t done, int64_t) { bar.set(static_cast<uint64_t>(done)); };
    ARBOR_ASSIGN_OR_RETURN(loadgen::LoadResult load,
                           loadgen::run_load(lo, b.requests, arrivals, b.prompt_lens));
    bar.finish();
    runs.push_back(loadgen::make_run_report(rate, o.max_concurrency, arrivals, load, p.slos));
    print_run(runs.back());
    completed += runs.back().metrics.completed;
  }
  ARBOR_RETURN_IF_ERROR(write_outputs(o, p, runs));
  if (completed == 0) {
    const loadgen::RunReport& r = runs[0];
    return failed_precondition(
        "no request completed",
        r.first_errors.empty()
            ? str_cat(" (", r.metrics.aborted, " aborted at the --max-seconds deadline, ",
                      r.metrics.not_sent, " not sent)")
            : ": " + r.first_errors[0]);
  }
  return ok_status();
}

void setup(CLI::App& bench) {
  auto* sub = bench.add_subcommand(
      "serve", "Load-test a running server on this machine (vLLM's benchmark_serving metrics)");
  auto o = std::make_shared<Options>();
  sub->add_option("--url", o->url, "Server base URL; loopback only (127.0.0.0/8, ::1, localhost)")
      ->capture_default_str();
  sub->add_option("--model", o->model, "Model name to send; default: the first of /v1/models");
  sub->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  sub->add_option("--prompts-file", o->prompts_file,
                  "JSONL file: {\"prompt\": string or [ids], \"max_tokens\": n} per line "
                  "(default: synthetic prompts)");
  sub->add_option("-n,--num-prompts", o->synthetic.num_prompts, "Requests per rate")
      ->capture_default_str();
  sub->add_option("--workload", o->workload,
                  "random: independent synthetic prompts; shared-prefix: users in multi-turn "
                  "chats under a few long system prompts (--num-users x --turns requests, token "
                  "ids; docs/router.md)")
      ->check(CLI::IsMember({"random", "shared-prefix"}))
      ->capture_default_str();
  sub->add_option("--num-system-prompts", o->shared.num_system_prompts,
                  "shared-prefix: distinct system prompts")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--system-prompt-len", o->shared.system_prompt_len,
                  "shared-prefix: tokens of each system prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--num-users", o->shared.num_users, "shared-prefix: users, each one chat")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--turns", o->shared.turns, "shared-prefix: turns per chat")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--turn-len", o->shared.turn_len,
                  "shared-prefix: tokens each turn adds to the chat's prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--input-len", o->synthetic.input_len,
                  "Synthetic prompt length (tokens, or words with --prompt-format text)")
      ->capture_default_str();
  sub->add_option("--output-len", o->synthetic.output_len,
                  "Output tokens per request (max_tokens; also the JSONL default)")
      ->capture_default_str();
  sub->add_option("--range-ratio", o->synthetic.range_ratio,
                  "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str();
  sub->add_option("--prompt-format", o->prompt_format,
                  "Synthetic prompts as token-id arrays (ids) or words (text); auto: ids for "
                  "/v1/completions, text for chat")
      ->capture_default_str();
  sub->add_option(
         "--vocab-size", o->synthetic.vocab_size,
         "Synthetic token ids are drawn from [3, N); must not exceed the model's vocabulary")
      ->capture_default_str();
  sub->add_option(
         "--request-rate", o->rates,
         "Requests/s of a Poisson process, or inf (all at once); a comma list runs a sweep")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--burstiness", o->burstiness,
                  "Gamma shape of the inter-arrival times; 1 = Poisson")
      ->capture_default_str();
  sub->add_option("--max-concurrency", o->max_concurrency,
                  "Requests in flight at most (with rate inf: a fixed concurrency); 0 = no cap")
      ->capture_default_str();
  sub->add_option("--max-seconds", o->max_seconds,
                  "Per rate: stop sending and abort what runs after this long; 0 = no limit")
      ->capture_default_str();
  sub->add_option("--seed", o->synthetic.seed,
                  "Seed of the arrival times, and of the synthetic prompts (+ the rate's index in "
                  "a sweep, so no rate reuses another's prompts)")
      ->capture_default_str();
  sub->add_option("--temperature", o->temperature, "Sampling temperature sent")
      ->capture_default_str();
  sub->add_flag("--no-ignore-eos", o->no_ignore_eos,
                "Do not send ignore_eos (outputs may end before max_tokens)");
  sub->add_flag("--no-keep-alive", o->no_keep_alive, "A new connection for every request");
  sub->add_option("--warmup", o->warmup, "Untimed requests sent first")->capture_default_str();
  sub->add_option("--goodput", o->goodput,
                  "SLOs for goodput in ms, e.g. --goodput ttft:500 tpot:50 e2el:5000");
  sub->add_option("--result-json", o->result_json, "Write the configuration and results as JSON");
  sub->add_option("--result-md", o->result_md, "Write the results as a Markdown table");
  sub->add_option("--plot", o->plot,
                  "Draw TTFT/TPOT/ITL p50 and p99 against the rate: PREFIX.svg and PREFIX.png "
                  "(needs gnuplot)");
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_BENCH_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
