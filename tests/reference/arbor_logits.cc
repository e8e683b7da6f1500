// arbor_logits: arbor's side of the reference comparisons, with llama_ref's interface
//   arbor_logits MODEL.gguf TOKENS OUT.bin
// evaluates the comma-separated ids as one sequence from position 0 (F32 KV cache, one chunk)
// and writes float32 [num_tokens, vocab] logits to OUT.bin. tests/reference/hf/parity.py runs it
// beside llama.cpp and the numpy ports of the Hugging Face models (--engine arbor=...).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/runner.h"

int main(int argc, char** argv) {
  using namespace arbor;
  if (argc != 4) {
    std::fprintf(stderr, "usage: arbor_logits MODEL TOKENS OUT.bin\n");
    return 2;
  }
  std::vector<int32_t> ids;
  std::stringstream in(argv[2]);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) ids.push_back(static_cast<int32_t>(std::stol(item)));
  }
  const int32_t block = 16;
  const int32_t blocks = static_cast<int32_t>(ids.size()) / block + 2;
  auto runner = model::ModelRunner::load(
      argv[1], {.block_size = block, .num_blocks = blocks, .kv_dtype = kernels::KvDtype::kF32,
                .num_threads = 2});
  if (!runner.ok()) {
    std::fprintf(stderr, "arbor_logits: %s\n", runner.status().to_string().c_str());
    return 2;
  }
  model::SingleSequence seq(**runner, model::SingleSequence::contiguous_blocks(0, blocks));
  auto logits = seq.append_all_logits(ids);
  if (!logits.ok()) {
    std::fprintf(stderr, "arbor_logits: %s\n", logits.status().to_string().c_str());
    return 2;
  }
  std::ofstream out(argv[3], std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits->data()), logits->size() * sizeof(float));
  return out ? 0 : 2;
}
