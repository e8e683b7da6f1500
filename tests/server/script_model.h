// A "script model" for end-to-end tests: a real llama GGUF whose greedy next token depends only
// on the last token, as a table says. Real tiny models never write "<think>"; this one does,
// through the real executor, sampler, grammar masks, speculation and HTTP server, so tests can
// check what the server makes of a thinking model's output.
//
// How: one layer whose attention and FFN output matrices are zero, so the final hidden state is
// the token's embedding; every token of the table has its own embedding dimension (one-hot), the
// others share dimension 0; the output matrix gives, per dimension, the successors' logits:
// first choice 8 * kFirstLogit (after RMSNorm scales the one-hot to 8), the second choice less,
// every other token 0. So a grammar that refuses the first choice gets the second.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace arbor::server::testing {

struct ScriptModelSpec {
  // A tokenizer.json directory or GGUF (its vocabulary and chat template are used).
  std::string vocab_path;
  // Replaces the tokenizer's chat template when not empty.
  std::string chat_template;
  // token text -> its successors' texts, best first (at most 2). Every text must be exactly
  // one token (encoded with control tokens recognised). At most 60 keys.
  std::map<std::string, std::vector<std::string>> next;
  // The successor of every token not in `next`.
  std::string otherwise;
  // Tokens appended to the vocabulary (before `next` is read): control tokens (a vocabulary's
  // own markers, e.g. harmony's <|channel|>) and user-defined ones (written as text).
  std::vector<std::string> added_control;
  std::vector<std::string> added_user_defined;
};

// Writes the model (F32, dim 64, about 80 MB for Qwen 3's 151,669 tokens).
Status write_script_model(const ScriptModelSpec& spec, const std::string& path);

// The thinking model the reasoning, Responses and Messages tests serve: Qwen 3's vocabulary
// and chat template; greedy output "<think>\n\nLet me think.</think> Sure!" after the
// generation prompt, and '{"answer": "yes"}' after "</think>" where a grammar refuses " Sure".
// Written once per test process (a missing tokenizer fails the test); its path.
const std::string& thinking_script_model();

// gpt-oss script models (server_harmony_test.cc): Qwen 3's vocabulary plus the harmony markers
// (control tokens, as in o200k_harmony, where <|return|> and <|call|> end generation) and the
// shared gpt-oss template. The answer model's greedy output after "<|start|>assistant" is
//   <|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final
//   <|message|> Sure!<|return|>
// where a grammar refuses the final header (forced calls) it writes the commentary call below
// instead, and where one refuses "Sure" (structured output) '{"answer": "Paris"}'; the tool
// model's
//   <|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary
//   to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
// (each second header one user-defined token: the script is one token in, one token out, and
// the first header's markers already have successors).
const std::string& harmony_answer_script_model();
const std::string& harmony_tool_script_model();

}  // namespace arbor::server::testing
