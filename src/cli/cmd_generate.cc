// arbor generate: one prompt, one sequence, tokens streamed to stdout as they are sampled.
//
// The prompt runs as one forward (prefill), then one forward per generated token. The model's
// own tokenizer (GGUF metadata) encodes the prompt and an IncrementalDetokenizer streams the
// text, primed with the prompt so that word-initial spaces come out right. Stops after -n tokens,
// at an end-of-generation token, or at BOS (unless --ignore-eos): a sampled BOS starts a new
// document, and llama2.c-trained models (stories*) separate stories with BOS and never emit
// their vocabulary's EOS. Timings go to stderr; --json prints one object with the ids, the
// generated text and the timings instead of streaming.
#include <sys/resource.h>

#include <filesystem>
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "cli/command.h"
#include "kernels/cpu_features.h"
#include "model/runner.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace arbor::cli {
namespace {

struct Options {
  std::string model;
  std::string prompt;
  int32_t n = 128;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  int threads = 0;
  int32_t block_size = 16;
  std::string kv_dtype = "f16";
  bool no_bos = false;
  bool ignore_eos = false;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Generation {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;  // generated only
  std::string text;          // generated only
  std::string stop_reason = "length";
  double prompt_seconds = 0.0;
  double decode_seconds = 0.0;  // forwards of generated tokens and all sampling after prefill
  int32_t decode_forwards = 0;
  // Memory: the process's peak resident set, against the model file and the KV cache.
  uint64_t peak_rss_bytes = 0;
  uint64_t file_bytes = 0;
  uint64_t kv_bytes = 0;
};

uint64_t peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

Result<sampling::SamplingParams> sampling_params(const Options& o, int64_t vocab_size) {
  sampling::SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repeat_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  if (o.seed >= 0) p.seed = static_cast<uint64_t>(o.seed);
  ARBOR_RETURN_IF_ERROR(p.validate(vocab_size));
  return p;
}

Result<kernels::KvDtype> parse_kv_dtype(const std::string& name) {
  if (name == "f16") return kernels::KvDtype::kF16;
  if (name == "f32") return kernels::KvDtype::kF32;
  return invalid_argument("--kv-dtype is ", name, ", must be f16 or f32");
}

void log_configuration(model::ModelRunner& runner, const Options& o, int32_t num_tokens) {
  const model::LlamaModel& m = runner.model();
  const auto& w = m.weights();
  ARBOR_LOG(kInfo) << "model " << o.model << ": " << runner.config().summary();
  ARBOR_LOG(kInfo) << "weights: token_embd " << gguf::ggml_type_name(w.token_embd.type)
                   << ", attn_q " << gguf::ggml_type_name(w.layers[0].wq.type) << ", ffn_down "
                   << gguf::ggml_type_name(w.layers[0].w_down.type) << ", output "
                   << gguf::ggml_type_name(w.output.type) << (w.tied_output ? " (tied)" : "");
  const model::PagedKvCache& cache = runner.kv_cache();
  ARBOR_LOG(kInfo) << "threads " << runner.pool().num_threads()
                   << ", cpu " << kernels::isa_summary();
  ARBOR_LOG(kInfo) << "kv cache: " << cache.num_blocks() << " blocks x " << cache.block_size()
                   << " tokens (" << num_tokens << " needed), " << o.kv_dtype << ", "
                   << cache.total_bytes() / 1024 << " KiB";
}

// Samples, streams and extends the sequence until -n tokens or an end-of-generation token.
Status decode_loop(const Options& o, const tokenizer::Tokenizer& tok, model::SingleSequence& seq,
                   std::span<const float> logits, const sampling::SamplingParams& params,
                   tokenizer::IncrementalDetokenizer& detok, Generation& g) {
  sampling::Sampler sampler;
  sampling::Rng rng(params.seed ? *params.seed : sampling::Rng::random_seed());
  const Clock::time_point start = Clock::now();
  while (static_cast<int32_t>(g.ids.size()) < o.n) {
    const int32_t id = sampler.sample(logits, params, {g.prompt_ids, g.ids}, rng).token_id;
    if (!o.ignore_eos && (tok.is_eog(id) || id == tok.bos_id())) {
      g.stop_reason = tok.is_eog(id) ? "eos" : "bos";
      break;
    }
    g.ids.push_back(id);
    const std::string delta = detok.add(id);
    g.text += delta;
    if (!o.json) {
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
    if (static_cast<int32_t>(g.ids.size()) == o.n) break;  // the last token needs no forward
    ARBOR_ASSIGN_OR_RETURN(logits, seq.append({&g.ids.back(), 1}));
    ++g.decode_forwards;
  }
  const std::string rest = detok.flush();
  g.text += rest;
  if (!o.json) std::fwrite(rest.data(), 1, rest.size(), stdout);
  g.decode_seconds = seconds_since(start);
  return ok_status();
}

void report(const Options& o, const Generation& g) {
  const double pp = g.prompt_ids.size() / std::max(g.prompt_seconds, 1e-9);
  const double tg = g.decode_forwards / std::max(g.decode_seconds, 1e-9);
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = g.prompt_ids;
    j["ids"] = g.ids;
    j["text"] = g.text;
    j["stop_reason"] = g.stop_reason;
    j["timings"] = {{"prompt_tokens", g.prompt_ids.size()},
                    {"prompt_seconds", g.prompt_seconds},
                    {"prompt_tokens_per_second", pp},
                    {"generated_tokens", g.ids.size()},
                    {"decode_forwards", g.decode_forwards},
                    {"decode_seconds", g.decode_seconds},
                    {"generation_tokens_per_second", tg}};
    j["memory"] = {{"peak_rss_bytes", g.peak_rss_bytes},
                   {"model_file_bytes", g.file_bytes},
                   {"kv_cache_bytes", g.kv_bytes}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "prompt:     %zu tokens in %.3f s (%.2f tok/s)\n", g.prompt_ids.size(),
               g.prompt_seconds, pp);
  std::fprintf(stderr, "generation: %zu tokens, %d forwards in %.3f s (%.2f tok/s), stop: %s\n",
               g.ids.size(), g.decode_forwards, g.decode_seconds, tg, g.stop_reason.c_str());
  const double mib = 1024.0 * 1024.0;
  std::fprintf(stderr,
               "memory:     peak RSS %.1f MiB = model file %.1f MiB + KV cache %.1f MiB + %.1f MiB\n",
               g.peak_rss_bytes / mib, g.file_bytes / mib, g.kv_bytes / mib,
               (static_cast<double>(g.peak_rss_bytes) - g.file_bytes - g.kv_bytes) / mib);
}

Status run(const Options& o) {
  ARBOR_ASSIGN_OR_RETURN(kernels::KvDtype kv_dtype, parse_kv_dtype(o.kv_dtype));
  if (o.n < 1) return invalid_argument("-n is ", o.n, ", must be >= 1");
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model, model::LlamaModel::load(o.model));
  std::error_code size_error;
  const uint64_t file_bytes = std::filesystem::file_size(o.model, size_error);
  ARBOR_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                         tokenizer::Tokenizer::from_gguf(model->file()));
  const model::ModelConfig cfg = model->config();
  ARBOR_ASSIGN_OR_RETURN(sampling::SamplingParams params, sampling_params(o, cfg.vocab_size));
  Generation g;
  tokenizer::EncodeOptions enc;
  if (o.no_bos) enc.add_bos = false;
  g.prompt_ids = tok->encode(o.prompt, enc);
  if (g.prompt_ids.empty()) return invalid_argument("the prompt is empty (and --no-bos is set)");
  const int64_t total = static_cast<int64_t>(g.prompt_ids.size()) + o.n;
  if (total > cfg.context_length) {
    return out_of_range("prompt has ", g.prompt_ids.size(), " tokens and -n asks for ", o.n,
                        " more; the model's context_length is ", cfg.context_length);
  }
  if (o.block_size < 1) return invalid_argument("--block-size is ", o.block_size, ", must be >= 1");
  model::RunnerOptions ropts;
  ropts.block_size = o.block_size;
  ropts.num_blocks = (total + o.block_size - 1) / o.block_size;
  ropts.kv_dtype = kv_dtype;
  ropts.num_threads = o.threads;
  ropts.reserve_tokens = static_cast<int32_t>(g.prompt_ids.size());
  ARBOR_ASSIGN_OR_RETURN(auto runner, model::ModelRunner::create(std::move(model), ropts));
  log_configuration(*runner, o, static_cast<int32_t>(total));
  model::SingleSequence seq(*runner, model::SingleSequence::contiguous_blocks(
                                         0, static_cast<int32_t>(ropts.num_blocks)));
  tokenizer::IncrementalDetokenizer detok(*tok);
  std::string prompt_text;
  for (int32_t id : g.prompt_ids) prompt_text += detok.add(id);
  if (!o.json) {
    std::fwrite(prompt_text.data(), 1, prompt_text.size(), stdout);
    std::fflush(stdout);
  }
  const Clock::time_point start = Clock::now();
  ARBOR_ASSIGN_OR_RETURN(std::span<const float> logits, seq.append(g.prompt_ids));
  g.prompt_seconds = seconds_since(start);
  ARBOR_RETURN_IF_ERROR(decode_loop(o, *tok, seq, logits, params, detok, g));
  g.peak_rss_bytes = peak_rss_bytes();
  g.file_bytes = file_bytes;
  g.kv_bytes = runner->kv_cache().total_bytes();
  report(o, g);
  return ok_status();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt with one sequence");
  auto o = std::make_shared<Options>();
  sub->add_option("-m,--model", o->model, "GGUF model")->required();
  sub->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  sub->add_option("-n,--n-predict", o->n, "Tokens to generate")->capture_default_str();
  sub->add_option("--temp", o->temperature, "Temperature; 0 = greedy (default as llama.cpp)")
      ->capture_default_str();
  sub->add_option("--top-k", o->top_k, "Top-k; 0 = off")->capture_default_str();
  sub->add_option("--top-p", o->top_p, "Top-p; 1 = off")->capture_default_str();
  sub->add_option("--min-p", o->min_p, "Min-p; 0 = off")->capture_default_str();
  sub->add_option("--repeat-penalty", o->repeat_penalty,
                  "Repetition penalty over prompt + output; 1 = off")->capture_default_str();
  sub->add_option("--presence-penalty", o->presence_penalty, "Presence penalty (OpenAI)")
      ->capture_default_str();
  sub->add_option("--frequency-penalty", o->frequency_penalty, "Frequency penalty (OpenAI)")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Sampling seed; -1 = random")->capture_default_str();
  sub->add_option("-t,--threads", o->threads, "Threads; 0 = all cores")->capture_default_str();
  sub->add_option("--block-size", o->block_size, "KV cache block size (tokens)")
      ->capture_default_str();
  sub->add_option("--kv-dtype", o->kv_dtype, "KV cache element type: f16 or f32")
      ->capture_default_str();
  sub->add_flag("--no-bos", o->no_bos, "Do not prepend BOS to the prompt");
  sub->add_flag("--ignore-eos", o->ignore_eos,
                "Keep generating after end-of-generation tokens and BOS");
  sub->add_flag("--json", o->json,
                "Print one JSON object (prompt_ids, ids, text, timings) instead of streaming");
  sub->callback([o] { exit_on_error(run(*o)); });
}
ARBOR_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace arbor::cli
