// Structured-output mask cost per token on the Llama 2 (32,000-token, SentencePiece GGUF) and
// Llama 3 (128,256-token, byte-level BPE tokenizer.json) vocabularies.
//
//   grammar_bench [--requests N] [--tokens N]
//
// For each vocabulary and grammar: N requests generate up to --tokens tokens each, choosing a
// uniformly random allowed token at every step (what a random-weight model does), one compiled
// grammar shared by the requests as in the executor. It prints the compile time, then the time
// of GrammarState::mask() (plus apply_mask over a logits row) per token: the first request
// (cold: per-state token sets still being built) and the later ones (warm), as median, p90 and
// max in microseconds. One thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/grammar_states.h"
#include "grammar/grammar_spec.h"
#include "grammar/token_masks.h"
#include "tokenizer/tokenizer.h"

namespace {

using arbor::grammar::GrammarKind;
using arbor::grammar::GrammarSpec;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Percentiles {
  double median = 0, p90 = 0, max = 0;
};

Percentiles percentiles(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10], v.back()};
}

struct Grammar {
  const char* name;
  GrammarSpec spec;
};

const std::vector<Grammar>& grammars() {
  static const std::vector<Grammar> g = {
      {"json_object", {GrammarKind::kJsonObject, ""}},
      {"schema: person",
       {GrammarKind::kJsonSchema,
        R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":8},"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"]}},"required":["name","age"]})"}},
      {"schema: enum + numbers",
       {GrammarKind::kJsonSchema,
        R"({"type":"array","items":{"type":"object","properties":{"op":{"enum":["add","remove","replace","move","copy","test"]},"value":{"type":"number"},"count":{"type":"integer"}},"required":["op","value"]},"maxItems":20})"}},
      {"regex: phone", {GrammarKind::kRegex, "\\(\\d{3}\\) \\d{3}-\\d{4}"}},
  };
  return g;
}

int run(const char* label, const std::string& path, int requests, int tokens) {
  auto tok = arbor::tokenizer::Tokenizer::from_file(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), tok.status().to_string().c_str());
    return 1;
  }
  const auto t_vocab = Clock::now();
  auto vocab = arbor::executor::grammar_vocabulary(**tok);
  std::printf("\n%s: %d tokens (vocabulary index %.1f ms)\n", label, vocab->size(),
              us_since(t_vocab) / 1000);
  std::printf("| grammar | compile ms | cold median / p90 / max us | warm median / p90 / max us |"
              " tokens | states built |\n|---|---|---|---|---|---|\n");
  std::vector<float> logits(static_cast<size_t>(vocab->size()), 0.0f);
  for (const Grammar& g : grammars()) {
    const auto t0 = Clock::now();
    auto automaton = arbor::grammar::compile_spec(g.spec);
    if (!automaton.ok()) {
      std::fprintf(stderr, "%s: %s\n", g.name, automaton.status().to_string().c_str());
      return 1;
    }
    auto compiled = std::make_shared<arbor::grammar::CompiledGrammar>(
        std::make_shared<const arbor::grammar::Automaton>(std::move(*automaton)), vocab);
    const double compile_ms = us_since(t0) / 1000;
    std::mt19937_64 rng(7);
    std::vector<double> cold, warm;
    int64_t total = 0;
    for (int r = 0; r < requests; ++r) {
      arbor::grammar::GrammarState state(compiled);
      for (int t = 0; t < tokens && !state.ended(); ++t) {
        const auto t1 = Clock::now();
        const arbor::grammar::TokenBitmask& mask = state.mask();
        arbor::grammar::apply_mask(mask, logits);
        (r == 0 ? cold : warm).push_back(us_since(t1));
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < mask.size(); ++id) {
          if (mask.test(id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        state.accept(allowed[rng() % allowed.size()]);
        ++total;
      }
    }
    const Percentiles c = percentiles(cold), w = percentiles(warm);
    std::printf("| %s | %.1f | %.1f / %.1f / %.0f | %.1f / %.1f / %.0f | %lld | %lld |\n", g.name,
                compile_ms, c.median, c.p90, c.max, w.median, w.p90, w.max,
                static_cast<long long>(total),
                static_cast<long long>(compiled->stats().states_built));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 8, tokens = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--requests") requests = std::atoi(argv[i + 1]);
    if (a == "--tokens") tokens = std::atoi(argv[i + 1]);
  }
  const std::string shared = ARBOR_SHARED_DIR;
  int rc = run("Llama 2 (ggml-vocab-llama-spm.gguf)",
               shared + "/tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf", requests, tokens);
  rc |= run("Llama 3 (hf/llama3/tokenizer.json)", shared + "/tokenizers/hf/llama3/tokenizer.json",
            requests, tokens);
  return rc;
}
