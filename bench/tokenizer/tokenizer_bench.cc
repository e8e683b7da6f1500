// Tokenizer throughput on one core: Llama 3 (tokenizer.json) encode and decode of ~400 KB of
// deterministic English-like text, plus SentencePiece (Llama 2 GGUF vocab) encode.
//
//   tokenizer_bench [--benchmark_repetitions=5]
// Reports bytes_per_second (of input text for encode, of output text for decode).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

using arbor::tokenizer::Tokenizer;

// Sentences drawn from a fixed word list with a seeded generator: the same text on every run.
std::string english_text(size_t bytes) {
  static const char* const kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
      "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
      "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
      "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
      "government", "information", "development", "understanding", "international", "system",
      "language", "model", "inference", "tokenizer", "performance", "throughput", "memory",
      "people", "history", "between", "important", "example", "different", "following",
      "however", "something", "children", "American", "computer", "science", "university",
      "2024", "3.5", "100", "don't", "it's", "we're", "they've", "I'll", "London", "Paris"};
  static const char* const kPunct[] = {".", ",", ";", ":", "!", "?"};
  std::mt19937 rng(42);
  std::string text;
  text.reserve(bytes + 64);
  bool capital = true;
  while (text.size() < bytes) {
    std::string w = kWords[rng() % std::size(kWords)];
    if (capital) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    text += w;
    capital = false;
    const uint32_t r = rng() % 100;
    if (r < 8) {
      text += kPunct[rng() % std::size(kPunct)];
      capital = text.back() != ',' && text.back() != ';' && text.back() != ':';
    }
    text += (r < 2) ? "\n\n" : " ";
  }
  return text;
}

const Tokenizer* load(const std::string& rel) {
  static std::unique_ptr<Tokenizer> cache[2];
  const int slot = rel.find("llama3") != std::string::npos ? 0 : 1;
  if (!cache[slot]) {
    auto t = Tokenizer::from_file(std::string(ARBOR_SHARED_DIR) + "/" + rel);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return nullptr;
    }
    cache[slot] = std::move(t).value();
  }
  return cache[slot].get();
}

const std::string& corpus() {
  static const std::string text = english_text(400 * 1024);
  return text;
}

void BM_Encode(benchmark::State& state, const char* rel) {
  const Tokenizer* tok = load(rel);
  if (tok == nullptr) {
    state.SkipWithError("tokenizer not found (ARBOR_SHARED_DIR)");
    return;
  }
  const std::string& text = corpus();
  size_t num_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    num_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(num_tokens);
  state.counters["bytes_per_token"] = static_cast<double>(text.size()) / num_tokens;
}

void BM_Decode(benchmark::State& state, const char* rel) {
  const Tokenizer* tok = load(rel);
  if (tok == nullptr) {
    state.SkipWithError("tokenizer not found (ARBOR_SHARED_DIR)");
    return;
  }
  const auto ids = tok->encode(corpus());
  size_t out = 0;
  for (auto _ : state) {
    std::string text = tok->decode(ids);
    out = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out));
}

BENCHMARK_CAPTURE(BM_Encode, llama3_json, "tokenizers/hf/llama3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, llama3_json, "tokenizers/hf/llama3/tokenizer.json")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama_spm_gguf, "tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf")
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
