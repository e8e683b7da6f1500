// Hugging Face tokenizer.json (+ tokenizer_config.json) -> GGUF `tokenizer.*` metadata, following
// llama.cpp's convert_hf_to_gguf.py:
//
//   BPE with byte_fallback (Llama 2 style)  -> tokenizer.ggml.model "llama", pre "default",
//       tokens in id order, every score -1000, type BYTE for "<0xXX>", CONTROL for special
//       tokens, USER_DEFINED for other added tokens, else NORMAL (LlamaHfVocab).
//   byte-level BPE (GPT-2, Llama 3, Qwen2)  -> model "gpt2", pre "qwen2" / "llama-bpe" /
//       "default", tokens in id order, CONTROL / USER_DEFINED for added tokens, merges.
//   Ids missing below the model's vocabulary size become "[PAD<id>]" (UNUSED).
//
// Special token ids come from tokenizer_config.json's bos/eos/unk/pad_token (looked up among the
// added tokens, then the vocabulary), falling back to config.json's bos/eos_token_id;
// add_bos_token / add_eos_token and chat_template are copied when present.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace arbor::convert {

struct HfTokenizerFiles {
  std::string tokenizer_json;                        // contents of tokenizer.json
  std::optional<std::string> tokenizer_config_json;  // contents of tokenizer_config.json
  std::optional<int64_t> config_bos_id;              // config.json bos_token_id
  std::optional<int64_t> config_eos_id;              // config.json eos_token_id
  uint32_t model_vocab_size = 0;                     // rows of the embedding (padding target)
  std::string pre_name = "default";                  // tokenizer.ggml.pre for byte-level BPE
};

Result<std::vector<gguf::KeyValue>> hf_tokenizer_metadata(const HfTokenizerFiles& files);

}  // namespace arbor::convert
