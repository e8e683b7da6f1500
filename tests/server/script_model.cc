#include "script_model.h"

#include <gtest/gtest.h>

#include <cstring>

#include "gguf/gguf.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace arbor::server::testing {

namespace {

constexpr int64_t kDim = 64;
constexpr float kFirstLogit = 4.0f;
constexpr float kSecondLogit = 2.0f;

using gguf::GgmlType;
using gguf::Value;

Result<int32_t> single_token(const tokenizer::Tokenizer& tok, const std::string& text) {
  tokenizer::EncodeOptions o;
  o.add_bos = false;
  o.parse_special = true;
  const std::vector<int32_t> ids = tok.encode(text, o);
  if (ids.size() != 1) {
    return invalid_argument("script text '", text, "' is ", ids.size(), " tokens, not one");
  }
  return ids[0];
}

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void set_metadata(gguf::GgufWriter& w, const tokenizer::Tokenizer& tok, int64_t vocab,
                  const std::string& chat_template) {
  w.set("general.architecture", Value::str("llama"));
  w.set("general.name", Value::str("arbor test script model"));
  w.set("general.file_type", Value::u32(0));
  w.set("llama.context_length", Value::u32(4096));
  w.set("llama.embedding_length", Value::u32(kDim));
  w.set("llama.block_count", Value::u32(1));
  w.set("llama.feed_forward_length", Value::u32(kDim));
  w.set("llama.rope.dimension_count", Value::u32(kDim / 4));
  w.set("llama.rope.freq_base", Value::f32(10000.0f));
  w.set("llama.attention.head_count", Value::u32(4));
  w.set("llama.attention.head_count_kv", Value::u32(4));
  w.set("llama.attention.layer_norm_rms_epsilon", Value::f32(1e-5f));
  w.set("llama.vocab_size", Value::u32(static_cast<uint32_t>(vocab)));
  for (gguf::KeyValue& kv : tok.to_gguf_metadata()) {
    if (kv.key == "tokenizer.chat_template" && !chat_template.empty()) continue;
    w.set(kv.key, std::move(kv.value));
  }
  if (!chat_template.empty()) w.set("tokenizer.chat_template", Value::str(chat_template));
}

// The vocabulary with spec's added tokens appended, written next to `path` and loaded back.
Result<std::unique_ptr<tokenizer::Tokenizer>> extended_vocab(const ScriptModelSpec& spec,
                                                             const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_file(spec.vocab_path));
  if (spec.added_control.empty() && spec.added_user_defined.empty()) return tok;
  gguf::GgufWriter w;
  for (gguf::KeyValue& kv : tok->to_gguf_metadata()) {
    auto* items = std::get_if<gguf::Array>(&kv.value.data);
    if (kv.key == "tokenizer.ggml.tokens" && items != nullptr) {
      for (const auto* list : {&spec.added_control, &spec.added_user_defined}) {
        for (const std::string& t : *list) items->items.push_back(Value::str(t));
      }
    } else if (kv.key == "tokenizer.ggml.token_type" && items != nullptr) {
      for (size_t i = 0; i < spec.added_control.size(); ++i) items->items.push_back(Value::i32(3));
      for (size_t i = 0; i < spec.added_user_defined.size(); ++i) {
        items->items.push_back(Value::i32(4));
      }
    }
    w.set(kv.key, std::move(kv.value));
  }
  w.set("general.architecture", Value::str("llama"));
  const std::string vocab_path = path + ".vocab.gguf";
  ARBOR_RETURN_IF_ERROR(w.write(vocab_path));
  return tokenizer::Tokenizer::from_file(vocab_path);
}

}  // namespace

Status write_script_model(const ScriptModelSpec& spec, const std::string& path) {
  ARBOR_ASSIGN_OR_RETURN(auto tok, extended_vocab(spec, path));
  const int64_t vocab = tok->vocab_size();
  if (static_cast<int64_t>(spec.next.size()) >= kDim - 3) {
    return invalid_argument("a script model holds at most ", kDim - 4, " keys");
  }
  std::vector<float> embd(static_cast<size_t>(vocab * kDim), 0.0f);
  std::vector<float> out(static_cast<size_t>(vocab * kDim), 0.0f);
  for (int64_t t = 0; t < vocab; ++t) embd[static_cast<size_t>(t * kDim)] = 1.0f;  // slot 0
  ARBOR_ASSIGN_OR_RETURN(const int32_t otherwise, single_token(*tok, spec.otherwise));
  out[static_cast<size_t>(otherwise) * kDim] = kFirstLogit;
  int64_t slot = 1;
  for (const auto& [key, successors] : spec.next) {
    ARBOR_ASSIGN_OR_RETURN(const int32_t k, single_token(*tok, key));
    if (successors.empty() || successors.size() > 2) {
      return invalid_argument("script key '", key, "' needs one or two successors");
    }
    float* row = embd.data() + static_cast<size_t>(k) * kDim;
    std::fill(row, row + kDim, 0.0f);
    row[slot] = 1.0f;
    for (size_t i = 0; i < successors.size(); ++i) {
      ARBOR_ASSIGN_OR_RETURN(const int32_t s, single_token(*tok, successors[i]));
      out[static_cast<size_t>(s) * kDim + static_cast<size_t>(slot)] =
          i == 0 ? kFirstLogit : kSecondLogit;
    }
    ++slot;
  }
  gguf::GgufWriter w;
  set_metadata(w, *tok, vocab, spec.chat_template);
  const std::vector<float> ones(kDim, 1.0f), zeros(kDim * kDim, 0.0f);
  w.add_tensor_owned("token_embd.weight", GgmlType::kF32, {kDim, vocab}, as_bytes(embd));
  w.add_tensor_owned("blk.0.attn_norm.weight", GgmlType::kF32, {kDim}, as_bytes(ones));
  for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
    w.add_tensor_owned(std::string("blk.0.") + m + ".weight", GgmlType::kF32, {kDim, kDim},
                       as_bytes(zeros));
  }
  w.add_tensor_owned("blk.0.ffn_norm.weight", GgmlType::kF32, {kDim}, as_bytes(ones));
  w.add_tensor_owned("output_norm.weight", GgmlType::kF32, {kDim}, as_bytes(ones));
  w.add_tensor_owned("output.weight", GgmlType::kF32, {kDim, vocab}, as_bytes(out));
  return w.write(path);
}

const std::string& thinking_script_model() {
  static test::TempDir dir("script_model");
  static const std::string path = [] {
    const std::string out = dir.path() + "/script_qwen3.gguf";
    EXPECT_TRUE(test::expect_shared_file("tokenizers/hf/qwen3/tokenizer.json"));
    ScriptModelSpec spec;
    spec.vocab_path = test::shared_path("tokenizers/hf/qwen3");
    spec.next = {{"\n", {"<think>"}},   {"<think>", {"\n\n"}}, {"\n\n", {"Let"}},
                 {"Let", {" me"}},      {" me", {" think"}},   {" think", {"."}},
                 {".", {"</think>"}},   {"</think>", {" Sure", "{\""}},
                 {" Sure", {"!"}},      {"!", {"<|im_end|>"}}, {"{\"", {"answer"}},
                 {"answer", {"\":"}},   {"\":", {" \""}},      {" \"", {"yes"}},
                 {"yes", {"\"}"}},      {"\"}", {"<|im_end|>"}}};
    spec.otherwise = "<|im_end|>";
    const Status s = write_script_model(spec, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }();
  return path;
}

namespace {

constexpr const char* kHarmonyFinalHeader = "<|end|><|start|>assistant<|channel|>final<|message|>";
constexpr const char* kHarmonyCallHeader =
    "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    "<|constrain|>json<|message|>";

std::string harmony_model(const std::string& name,
                          std::map<std::string, std::vector<std::string>> body,
                          std::vector<std::string> headers, const std::string& stop) {
  static test::TempDir dir("script_model_harmony");
  const std::string out = dir.path() + "/" + name + ".gguf";
  EXPECT_TRUE(test::expect_shared_file("tokenizers/hf/qwen3/tokenizer.json"));
  EXPECT_TRUE(test::expect_shared_file("templates/openai-gpt-oss-120b.jinja"));
  ScriptModelSpec spec;
  spec.vocab_path = test::shared_path("tokenizers/hf/qwen3");
  spec.chat_template = test::read_file(test::shared_path("templates/openai-gpt-oss-120b.jinja"));
  spec.added_control = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
                        "<|call|>", "<|return|>"};
  spec.added_user_defined = std::move(headers);
  spec.next = std::move(body);
  spec.next["assistant"] = {"<|channel|>"};
  spec.next["<|channel|>"] = {"analysis"};
  spec.next["analysis"] = {"<|message|>"};
  spec.otherwise = stop;
  const Status s = write_script_model(spec, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

}  // namespace

const std::string& harmony_answer_script_model() {
  static const std::string path = harmony_model(
      "harmony_answer",
      {{"<|message|>", {"Let"}}, {"Let", {" me"}}, {" me", {" think"}}, {" think", {"."}},
       {".", {kHarmonyFinalHeader, kHarmonyCallHeader}}, {kHarmonyFinalHeader, {"Sure", "{\""}},
       {"Sure", {"!"}}, {"!", {"<|return|>"}}, {kHarmonyCallHeader, {"{\""}},
       {"{\"", {"answer", "city"}}, {"answer", {"\":"}}, {"city", {"\":"}}, {"\":", {" \""}},
       {" \"", {"Paris"}}, {"Paris", {"\"}"}}, {"\"}", {"<|return|>"}}},
      {kHarmonyFinalHeader, kHarmonyCallHeader}, "<|return|>");
  return path;
}

const std::string& harmony_tool_script_model() {
  static const std::string path = harmony_model(
      "harmony_tool",
      {{"<|message|>", {"Need"}}, {"Need", {" weather"}}, {" weather", {"."}},
       {".", {kHarmonyCallHeader}}, {kHarmonyCallHeader, {"{\""}}, {"{\"", {"city"}},
       {"city", {"\":"}}, {"\":", {" \""}}, {" \"", {"Paris"}}, {"Paris", {"\"}"}},
       {"\"}", {"<|call|>"}}},
      {kHarmonyCallHeader}, "<|call|>");
  return path;
}

}  // namespace arbor::server::testing
