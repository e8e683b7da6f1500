#include "convert/llama2c.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/status.h"

namespace arbor::convert {

namespace {

using gguf::KeyValue;
using gguf::Value;

constexpr uint32_t kAk42Magic = 0x616b3432;
constexpr size_t kAk42HeaderBytes = 256;
constexpr size_t kLegacyHeaderBytes = 28;

int32_t read_i32(std::span<const uint8_t> b, size_t off) {
  int32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

Status check_range(const char* what, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) return data_loss(what, " = ", v, " is outside [", lo, ", ", hi, "]");
  return ok_status();
}

Status validate_header(const Llama2cHeader& h) {
  ARBOR_RETURN_IF_ERROR(check_range("dim", h.dim, 2, 1 << 16));
  ARBOR_RETURN_IF_ERROR(check_range("hidden_dim", h.hidden_dim, 1, 1 << 18));
  ARBOR_RETURN_IF_ERROR(check_range("n_layers", h.n_layers, 1, 1024));
  ARBOR_RETURN_IF_ERROR(check_range("n_heads", h.n_heads, 1, h.dim));
  ARBOR_RETURN_IF_ERROR(check_range("n_kv_heads", h.n_kv_heads, 1, h.n_heads));
  ARBOR_RETURN_IF_ERROR(check_range("vocab_size", h.vocab_size, 1, 1 << 22));
  ARBOR_RETURN_IF_ERROR(check_range("seq_len", h.seq_len, 1, 1 << 24));
  if (h.dim % h.n_heads != 0 || (h.dim / h.n_heads) % 2 != 0) {
    return data_loss("dim ", h.dim, " is not n_heads ", h.n_heads, " × an even head_dim");
  }
  if (h.n_heads % h.n_kv_heads != 0) {
    return data_loss("n_heads ", h.n_heads, " is not a multiple of n_kv_heads ", h.n_kv_heads);
  }
  if (h.version == 2) {
    ARBOR_RETURN_IF_ERROR(check_range("group_size", h.group_size, 1, h.dim));
    if (h.dim % h.group_size != 0) {
      return data_loss("dim ", h.dim, " is not a multiple of group_size ", h.group_size);
    }
  }
  return ok_status();
}

}  // namespace

Result<Llama2cHeader> parse_llama2c_header(std::span<const uint8_t> b, const std::string& name) {
  if (b.size() < kLegacyHeaderBytes) {
    return data_loss(name, ": file has ", b.size(), " bytes, too small for a llama2.c header (",
                     kLegacyHeaderBytes, ")");
  }
  Llama2cHeader h;
  size_t ints = 0;
  uint32_t magic;
  std::memcpy(&magic, b.data(), 4);
  if (magic == kAk42Magic) {
    if (b.size() < kAk42HeaderBytes) {
      return data_loss(name, ": file has ", b.size(), " bytes, too small for the ",
                       kAk42HeaderBytes, "-byte ak42 header");
    }
    h.version = read_i32(b, 4);
    if (h.version != 1 && h.version != 2) {
      return unimplemented(name, ": llama2.c export version ", h.version,
                           " is not supported (1 = fp32, 2 = Q8_0)");
    }
    ints = 8;
    h.shared_classifier = b[36] != 0;
    if (h.version == 2) h.group_size = read_i32(b, 37);
    h.header_bytes = kAk42HeaderBytes;
  } else {
    h.header_bytes = kLegacyHeaderBytes;
  }
  h.dim = read_i32(b, ints);
  h.hidden_dim = read_i32(b, ints + 4);
  h.n_layers = read_i32(b, ints + 8);
  h.n_heads = read_i32(b, ints + 12);
  h.n_kv_heads = read_i32(b, ints + 16);
  h.vocab_size = read_i32(b, ints + 20);
  h.seq_len = read_i32(b, ints + 24);
  if (h.version == 0) {
    h.shared_classifier = h.vocab_size > 0;
    // INT32_MIN has no positive counterpart; validate_header rejects the result.
    if (h.vocab_size < 0) h.vocab_size = h.vocab_size == INT32_MIN ? 0 : -h.vocab_size;
  }
  auto st = validate_header(h);
  if (!st.ok()) return st.with_context(name + ": header");
  return h;
}

namespace {

// Sequential reader over the checkpoint bytes; every take is bounds-checked.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, size_t pos, const std::string& name)
      : bytes_(bytes), pos_(pos), name_(name) {}

  Result<std::span<const uint8_t>> take(uint64_t n, const std::string& what) {
    if (n > bytes_.size() - pos_) {
      return data_loss(name_, ": truncated: ", what, " needs ", n, " bytes at offset ", pos_,
                       " but the file has ", bytes_.size(), " bytes");
    }
    auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t pos() const { return pos_; }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_;
  const std::string& name_;
};

// One weight: fp32 bytes in the mapping, or dequantised into `owned`.
struct Blob {
  std::span<const uint8_t> src;
  std::vector<uint8_t> owned;
};

struct Weights {
  Blob emb, final_norm, wcls;
  std::vector<Blob> att_norm, ffn_norm, wq, wk, wv, wo, w1, w2, w3;
};

struct Sizes {
  uint64_t dim, hidden, kv_dim, vocab, layers;
};

Sizes sizes_of(const Llama2cHeader& h) {
  const uint64_t head_dim = static_cast<uint64_t>(h.dim / h.n_heads);
  return {static_cast<uint64_t>(h.dim), static_cast<uint64_t>(h.hidden_dim),
          head_dim * static_cast<uint64_t>(h.n_kv_heads), static_cast<uint64_t>(h.vocab_size),
          static_cast<uint64_t>(h.n_layers)};
}

// Reads `layers` fp32 tensors of `numel` elements each (one per layer, stacked).
Status take_f32(Cursor& c, uint64_t numel, const char* what, std::vector<Blob>* out,
                uint64_t layers) {
  out->resize(layers);
  for (uint64_t l = 0; l < layers; ++l) {
    ARBOR_ASSIGN_OR_RETURN((*out)[l].src, c.take(numel * 4, str_cat(what, "[", l, "]")));
  }
  return ok_status();
}

Status take_one(Cursor& c, uint64_t numel, const char* what, Blob* out) {
  ARBOR_ASSIGN_OR_RETURN(out->src, c.take(numel * 4, what));
  return ok_status();
}

Status read_legacy(Cursor& c, const Llama2cHeader& h, Weights* w) {
  const Sizes s = sizes_of(h);
  ARBOR_RETURN_IF_ERROR(take_one(c, s.vocab * s.dim, "token_embedding_table", &w->emb));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_att_weight", &w->att_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim * s.dim, "wq", &w->wq, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.kv_dim * s.dim, "wk", &w->wk, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.kv_dim * s.dim, "wv", &w->wv, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim * s.dim, "wo", &w->wo, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_ffn_weight", &w->ffn_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w1", &w->w1, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w2", &w->w2, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w3", &w->w3, s.layers));
  ARBOR_RETURN_IF_ERROR(take_one(c, s.dim, "rms_final_weight", &w->final_norm));
  // freq_cis_real and freq_cis_imag: [seq_len, head_dim / 2] each, unused (RoPE is recomputed).
  const uint64_t freq_bytes = 2 * static_cast<uint64_t>(h.seq_len) * (s.dim / h.n_heads / 2) * 4;
  if (h.shared_classifier && c.remaining() == 0) return ok_status();  // tables omitted
  ARBOR_RETURN_IF_ERROR(c.take(freq_bytes, "freq_cis_real/imag"));
  if (!h.shared_classifier) ARBOR_RETURN_IF_ERROR(take_one(c, s.vocab * s.dim, "wcls", &w->wcls));
  return ok_status();
}

Status read_v1(Cursor& c, const Llama2cHeader& h, Weights* w) {
  const Sizes s = sizes_of(h);
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_att_weight", &w->att_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_ffn_weight", &w->ffn_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_one(c, s.dim, "rms_final_weight", &w->final_norm));
  ARBOR_RETURN_IF_ERROR(take_one(c, s.vocab * s.dim, "token_embedding_table", &w->emb));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim * s.dim, "wq", &w->wq, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.kv_dim * s.dim, "wk", &w->wk, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.kv_dim * s.dim, "wv", &w->wv, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim * s.dim, "wo", &w->wo, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w1", &w->w1, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w2", &w->w2, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.hidden * s.dim, "w3", &w->w3, s.layers));
  if (!h.shared_classifier) ARBOR_RETURN_IF_ERROR(take_one(c, s.vocab * s.dim, "wcls", &w->wcls));
  return ok_status();
}

// Reads one group-quantised tensor (int8 values, then fp32 scales) and dequantises it.
Status take_q80(Cursor& c, uint64_t numel, int32_t group_size, const std::string& what, Blob* out) {
  const uint64_t gs = static_cast<uint64_t>(group_size);
  if (numel % gs != 0) {
    return data_loss(what, " has ", numel, " elements, not a multiple of group_size ", gs);
  }
  ARBOR_ASSIGN_OR_RETURN(auto q, c.take(numel, what + " int8 values"));
  ARBOR_ASSIGN_OR_RETURN(auto scales, c.take(numel / gs * 4, what + " scales"));
  out->owned.resize(numel * 4);
  for (uint64_t g = 0; g < numel / gs; ++g) {
    float scale;
    std::memcpy(&scale, scales.data() + g * 4, 4);
    for (uint64_t i = g * gs; i < (g + 1) * gs; ++i) {
      const float v = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
      std::memcpy(out->owned.data() + i * 4, &v, 4);
    }
  }
  return ok_status();
}

Status take_q80_layers(Cursor& c, uint64_t numel, int32_t gs, const char* what,
                       std::vector<Blob>* out, uint64_t layers) {
  out->resize(layers);
  for (uint64_t l = 0; l < layers; ++l) {
    ARBOR_RETURN_IF_ERROR(take_q80(c, numel, gs, str_cat(what, "[", l, "]"), &(*out)[l]));
  }
  return ok_status();
}

Status read_v2(Cursor& c, const Llama2cHeader& h, Weights* w) {
  const Sizes s = sizes_of(h);
  const int32_t gs = h.group_size;
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_att_weight", &w->att_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_f32(c, s.dim, "rms_ffn_weight", &w->ffn_norm, s.layers));
  ARBOR_RETURN_IF_ERROR(take_one(c, s.dim, "rms_final_weight", &w->final_norm));
  ARBOR_RETURN_IF_ERROR(take_q80(c, s.vocab * s.dim, gs, "token_embedding_table", &w->emb));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.dim * s.dim, gs, "wq", &w->wq, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.kv_dim * s.dim, gs, "wk", &w->wk, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.kv_dim * s.dim, gs, "wv", &w->wv, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.dim * s.dim, gs, "wo", &w->wo, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.hidden * s.dim, gs, "w1", &w->w1, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.hidden * s.dim, gs, "w2", &w->w2, s.layers));
  ARBOR_RETURN_IF_ERROR(take_q80_layers(c, s.hidden * s.dim, gs, "w3", &w->w3, s.layers));
  if (!h.shared_classifier) {
    ARBOR_RETURN_IF_ERROR(take_q80(c, s.vocab * s.dim, gs, "wcls", &w->wcls));
  }
  return ok_status();
}

void add_tensor(ModelPlan* plan, std::string name, std::vector<int64_t> dims, Blob blob) {
  PlannedTensor t;
  t.name = std::move(name);
  t.dims = std::move(dims);
  t.src_type = SourceType::kF32;
  t.src = blob.src;
  t.owned = std::move(blob.owned);
  plan->tensors.push_back(std::move(t));
}

void emit_tensors(const Llama2cHeader& h, Weights& w, ModelPlan* plan) {
  const Sizes s = sizes_of(h);
  const auto d = [](uint64_t v) { return static_cast<int64_t>(v); };
  // A shared classifier is written as an explicit output.weight, as the reference does.
  Blob output = h.shared_classifier ? Blob{w.emb.src, w.emb.owned} : std::move(w.wcls);
  add_tensor(plan, "token_embd.weight", {d(s.dim), d(s.vocab)}, std::move(w.emb));
  add_tensor(plan, "output_norm.weight", {d(s.dim)}, std::move(w.final_norm));
  add_tensor(plan, "output.weight", {d(s.dim), d(s.vocab)}, std::move(output));
  for (uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = str_cat("blk.", l, ".");
    add_tensor(plan, p + "attn_q.weight", {d(s.dim), d(s.dim)}, std::move(w.wq[l]));
    add_tensor(plan, p + "attn_k.weight", {d(s.dim), d(s.kv_dim)}, std::move(w.wk[l]));
    add_tensor(plan, p + "attn_v.weight", {d(s.dim), d(s.kv_dim)}, std::move(w.wv[l]));
    add_tensor(plan, p + "attn_output.weight", {d(s.dim), d(s.dim)}, std::move(w.wo[l]));
    add_tensor(plan, p + "attn_norm.weight", {d(s.dim)}, std::move(w.att_norm[l]));
    add_tensor(plan, p + "ffn_gate.weight", {d(s.dim), d(s.hidden)}, std::move(w.w1[l]));
    add_tensor(plan, p + "ffn_down.weight", {d(s.hidden), d(s.dim)}, std::move(w.w2[l]));
    add_tensor(plan, p + "ffn_up.weight", {d(s.dim), d(s.hidden)}, std::move(w.w3[l]));
    add_tensor(plan, p + "ffn_norm.weight", {d(s.dim)}, std::move(w.ffn_norm[l]));
  }
}

LlamaHparams hparams_of(const Llama2cHeader& h, const std::string& name) {
  LlamaHparams hp;
  hp.arch = "llama";
  hp.name = name;
  hp.context_length = static_cast<uint32_t>(h.seq_len);
  hp.embedding_length = static_cast<uint32_t>(h.dim);
  hp.feed_forward_length = static_cast<uint32_t>(h.hidden_dim);
  hp.block_count = static_cast<uint32_t>(h.n_layers);
  hp.head_count = static_cast<uint32_t>(h.n_heads);
  hp.head_count_kv = static_cast<uint32_t>(h.n_kv_heads);
  hp.rope_dimension_count = static_cast<uint32_t>(h.dim / h.n_heads);
  hp.vocab_size = static_cast<uint32_t>(h.vocab_size);
  hp.rms_norm_eps = 1e-5f;  // llama2.c's rmsnorm hard-codes 1e-5
  return hp;
}

}  // namespace

namespace {

// SentencePiece token types as GGUF stores them (llama.cpp's llama_token_type).
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenUnknown = 2;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenByte = 6;

bool is_hex(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Mirrors llama.cpp's convert-llama2c-to-ggml: fixed names for ids 0-2, byte pieces typed BYTE,
// spaces escaped to U+2581.
void classify_token(int32_t id, std::string* text, int32_t* type) {
  if (id == 0) {
    *text = "<unk>";
    *type = kTokenUnknown;
    return;
  }
  if (id == 1 || id == 2) {
    *text = id == 1 ? "<s>" : "</s>";
    *type = kTokenControl;
    return;
  }
  if (text->empty()) {
    *type = kTokenControl;
  } else if (text->size() >= 4 && text->compare(0, 3, "<0x") == 0 &&
             is_hex(static_cast<uint8_t>((*text)[3]))) {
    *type = kTokenByte;
  } else {
    *type = kTokenNormal;
  }
  std::string escaped;
  for (char ch : *text) {
    if (ch == ' ') {
      escaped += "\xe2\x96\x81";
    } else {
      escaped += ch;
    }
  }
  *text = std::move(escaped);
}

}  // namespace

Result<std::vector<KeyValue>> llama2c_tokenizer_metadata(std::span<const uint8_t> b,
                                                         int32_t vocab_size,
                                                         const std::string& name) {
  if (b.size() < 4) return data_loss(name, ": file has ", b.size(), " bytes, no max_token_length");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  size_t pos = 4;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (b.size() - pos < 8) {
      return data_loss(name, ": truncated at token ", id, " of ", vocab_size, " (offset ", pos,
                       ", file has ", b.size(), " bytes)");
    }
    float score;
    std::memcpy(&score, b.data() + pos, 4);
    const int32_t len = read_i32(b, pos + 4);
    pos += 8;
    if (len < 0 || static_cast<uint64_t>(len) > b.size() - pos) {
      return data_loss(name, ": token ", id, " has length ", len, " but ", b.size() - pos,
                       " bytes remain at offset ", pos);
    }
    std::string text(reinterpret_cast<const char*>(b.data() + pos), static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    int32_t type = kTokenNormal;
    classify_token(id, &text, &type);
    tokens.push_back(std::move(text));
    scores.push_back(score);
    types.push_back(type);
  }
  std::vector<KeyValue> kv;
  kv.push_back({"tokenizer.ggml.model", Value::str("llama")});
  kv.push_back({"tokenizer.ggml.tokens", Value::string_array(tokens)});
  kv.push_back({"tokenizer.ggml.scores", Value::f32_array(scores)});
  kv.push_back({"tokenizer.ggml.token_type", Value::i32_array(types)});
  kv.push_back({"tokenizer.ggml.unknown_token_id", Value::u32(0)});
  kv.push_back({"tokenizer.ggml.bos_token_id", Value::u32(1)});
  kv.push_back({"tokenizer.ggml.eos_token_id", Value::u32(2)});
  return kv;
}

Result<ModelPlan> plan_llama2c(std::span<const uint8_t> model, std::span<const uint8_t> tokenizer,
                               const std::string& model_name, const std::string& tokenizer_name,
                               Llama2cHeader* header_out) {
  ARBOR_ASSIGN_OR_RETURN(Llama2cHeader h, parse_llama2c_header(model, model_name));
  Cursor cursor(model, h.header_bytes, model_name);
  Weights w;
  switch (h.version) {
    case 0:
      ARBOR_RETURN_IF_ERROR(read_legacy(cursor, h, &w));
      break;
    case 1:
      ARBOR_RETURN_IF_ERROR(read_v1(cursor, h, &w));
      break;
    case 2:
      ARBOR_RETURN_IF_ERROR(read_v2(cursor, h, &w));
      break;
    default:
      return unimplemented(model_name, ": llama2.c version ", h.version);
  }
  if (cursor.remaining() != 0) {
    return data_loss(model_name, ": ", cursor.remaining(),
                     " unexpected bytes after the weights at offset ", cursor.pos(),
                     " (header: dim ", h.dim, ", hidden_dim ", h.hidden_dim, ", n_layers ",
                     h.n_layers, ", vocab ", h.vocab_size, ")");
  }
  ModelPlan plan;
  plan.hparams = hparams_of(h, std::filesystem::path(model_name).stem().string());
  emit_tensors(h, w, &plan);
  ARBOR_ASSIGN_OR_RETURN(plan.tokenizer_metadata,
                         llama2c_tokenizer_metadata(tokenizer, h.vocab_size, tokenizer_name));
  if (header_out != nullptr) *header_out = h;
  return plan;
}

Result<Llama2cModel> load_llama2c(const std::string& model_path,
                                  const std::string& tokenizer_path) {
  Llama2cModel m;
  ARBOR_ASSIGN_OR_RETURN(m.model_file, MappedFile::open(model_path));
  ARBOR_ASSIGN_OR_RETURN(MappedFile tok, MappedFile::open(tokenizer_path));
  ARBOR_ASSIGN_OR_RETURN(m.plan, plan_llama2c(m.model_file.bytes(), tok.bytes(), model_path,
                                              tokenizer_path, &m.header));
  return m;
}

}  // namespace arbor::convert
