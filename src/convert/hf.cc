// Hugging Face tensors -> planned GGUF tensors: the per-architecture name tables, shape checks,
// q/k row permutation, Gemma's norm offset, ties, and load_hf().
#include "convert/hf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>

#include "base/fp16.h"
#include "base/log.h"
#include "base/status.h"
#include "convert/hf_tokenizer.h"

namespace arbor::convert {

std::vector<float> llama3_rope_factors(const HfConfig& c) {
  ARBOR_CHECK(c.rope.type == RopeScalingType::kLlama3);
  const auto& s = c.rope;
  const double old_ctx = s.original_max_position_embeddings;
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  std::vector<float> factors;
  for (uint32_t i = 0; i < c.head_dim; i += 2) {
    // Same float32 frequency as llama.cpp's torch computation.
    const float freq =
        1.0f / std::pow(c.rope_theta, static_cast<float>(i) / static_cast<float>(c.head_dim));
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(s.factor);
    } else {
      const double smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth)));
    }
  }
  return factors;
}

namespace {

// PyTorch shape of a per-layer tensor, in terms of the config.
enum class Shape {
  kHidden,   // [hidden]
  kQ,        // [heads * head_dim, hidden]
  kQBias,    // [heads * head_dim]
  kKv,       // [kv_heads * head_dim, hidden]
  kKvBias,   // [kv_heads * head_dim]
  kO,        // [hidden, heads * head_dim]
  kFfnIn,    // [ffn, hidden]
  kFfnOut,   // [hidden, ffn]
  kHeadDim,  // [head_dim]            (per-head q/k norm)
  kQAll,     // [heads * head_dim]    (OLMo 2 q norm over the whole projection)
  kKvAll,    // [kv_heads * head_dim]
  kQkv,      // [(heads + 2 kv_heads) * head_dim, hidden]
  kGateUp,   // [2 ffn, hidden]
};

struct LayerTensor {
  std::string_view hf_suffix;
  std::string_view gguf_suffix;
  Shape shape;
  bool optional = false;
};

constexpr LayerTensor kAttnQkv[] = {
    {"self_attn.q_proj.weight", "attn_q.weight", Shape::kQ},
    {"self_attn.q_proj.bias", "attn_q.bias", Shape::kQBias, true},
    {"self_attn.k_proj.weight", "attn_k.weight", Shape::kKv},
    {"self_attn.k_proj.bias", "attn_k.bias", Shape::kKvBias, true},
    {"self_attn.v_proj.weight", "attn_v.weight", Shape::kKv},
    {"self_attn.v_proj.bias", "attn_v.bias", Shape::kKvBias, true},
    {"self_attn.o_proj.weight", "attn_output.weight", Shape::kO},
};
constexpr LayerTensor kMlp[] = {
    {"mlp.gate_proj.weight", "ffn_gate.weight", Shape::kFfnIn},
    {"mlp.up_proj.weight", "ffn_up.weight", Shape::kFfnIn},
    {"mlp.down_proj.weight", "ffn_down.weight", Shape::kFfnOut},
};
constexpr LayerTensor kInputNorm = {"input_layernorm.weight", "attn_norm.weight", Shape::kHidden};
constexpr LayerTensor kFfnNorm = {"post_attention_layernorm.weight", "ffn_norm.weight",
                                  Shape::kHidden};
constexpr LayerTensor kAttnPostNorm = {"post_attention_layernorm.weight", "post_attention_norm.weight",
                                       Shape::kHidden};
constexpr LayerTensor kFfnPostNorm = {"post_feedforward_layernorm.weight",
                                      "post_ffw_norm.weight", Shape::kHidden};

// The per-layer tensors of `arch`, in write order.
std::vector<LayerTensor> layer_table(HfArch arch) {
  std::vector<LayerTensor> t;
  const auto add = [&t](std::span<const LayerTensor> s) { t.insert(t.end(), s.begin(), s.end()); };
  switch (arch) {
    case HfArch::kLlama:
    case HfArch::kQwen2:
    case HfArch::kMistral3:
    case HfArch::kSmolLM3:
    case HfArch::kGranite:
    case HfArch::kQwen3:
      t.push_back(kInputNorm);
      add(kAttnQkv);
      if (arch == HfArch::kQwen3) {
        t.push_back({"self_attn.q_norm.weight", "attn_q_norm.weight", Shape::kHeadDim});
        t.push_back({"self_attn.k_norm.weight", "attn_k_norm.weight", Shape::kHeadDim});
      }
      t.push_back(kFfnNorm);
      add(kMlp);
      return t;
    case HfArch::kGemma2:
    case HfArch::kGemma3:
      t.push_back(kInputNorm);
      add(kAttnQkv);
      if (arch == HfArch::kGemma3) {
        t.push_back({"self_attn.q_norm.weight", "attn_q_norm.weight", Shape::kHeadDim});
        t.push_back({"self_attn.k_norm.weight", "attn_k_norm.weight", Shape::kHeadDim});
      }
      t.push_back(kAttnPostNorm);
      t.push_back({"pre_feedforward_layernorm.weight", "ffn_norm.weight", Shape::kHidden});
      add(kMlp);
      t.push_back(kFfnPostNorm);
      return t;
    case HfArch::kPhi3:
      return {kInputNorm,
              {"self_attn.qkv_proj.weight", "attn_qkv.weight", Shape::kQkv},
              {"self_attn.o_proj.weight", "attn_output.weight", Shape::kO},
              kFfnNorm,
              {"mlp.gate_up_proj.weight", "ffn_up.weight", Shape::kGateUp},
              {"mlp.down_proj.weight", "ffn_down.weight", Shape::kFfnOut}};
    case HfArch::kOlmo2:
      add(kAttnQkv);
      t.push_back({"self_attn.q_norm.weight", "attn_q_norm.weight", Shape::kQAll});
      t.push_back({"self_attn.k_norm.weight", "attn_k_norm.weight", Shape::kKvAll});
      t.push_back(kAttnPostNorm);
      add(kMlp);
      t.push_back(kFfnPostNorm);
      return t;
  }
  return t;
}

std::vector<int64_t> shape_of(const HfConfig& c, Shape s) {
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size, hd = c.head_dim;
  const int64_t q = int64_t{c.num_attention_heads} * hd;
  const int64_t kv = int64_t{c.num_key_value_heads} * hd;
  switch (s) {
    case Shape::kHidden:
      return {hidden};
    case Shape::kQ:
      return {q, hidden};
    case Shape::kQBias:
    case Shape::kQAll:
      return {q};
    case Shape::kKv:
      return {kv, hidden};
    case Shape::kKvBias:
    case Shape::kKvAll:
      return {kv};
    case Shape::kO:
      return {hidden, q};
    case Shape::kFfnIn:
      return {ffn, hidden};
    case Shape::kFfnOut:
      return {hidden, ffn};
    case Shape::kHeadDim:
      return {hd};
    case Shape::kQkv:
      return {q + 2 * kv, hidden};
    case Shape::kGateUp:
      return {2 * ffn, hidden};
  }
  return {};
}

bool permutes_qk(HfArch arch) {
  // GGUF's normal RoPE mode rotates adjacent pairs; these are converted from HF's rotate-half
  // layout (llama.cpp's LlamaModel.permute). The others run NEOX mode on HF's row order.
  return arch == HfArch::kLlama || arch == HfArch::kMistral3 || arch == HfArch::kSmolLM3 ||
         arch == HfArch::kGranite;
}

bool is_gemma(HfArch arch) { return arch == HfArch::kGemma2 || arch == HfArch::kGemma3; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Wraps a safetensors tensor as a planned GGUF tensor (dims reversed to ggml order).
Result<PlannedTensor> plan_tensor(const StTensor& st, std::string gguf_name,
                                  const std::vector<int64_t>& want_shape) {
  if (st.shape != want_shape) {
    return data_loss(*st.file, ": tensor '", st.name, "' has shape ", shape_str(st.shape),
                     ", config.json implies ", shape_str(want_shape));
  }
  PlannedTensor t;
  switch (st.dtype) {
    case StDtype::kF32:
      t.src_type = SourceType::kF32;
      break;
    case StDtype::kF16:
      t.src_type = SourceType::kF16;
      break;
    case StDtype::kBF16:
      t.src_type = SourceType::kBF16;
      break;
    default:
      return unimplemented(*st.file, ": tensor '", st.name, "' has dtype ", st_dtype_name(st.dtype),
                           " (supported: F32, F16, BF16)");
  }
  t.name = std::move(gguf_name);
  t.dims.assign(st.shape.rbegin(), st.shape.rend());
  t.src = st.bytes;
  return t;
}

// Gemma's RMSNorm multiplies by (1 + w); llama.cpp stores 1 + w. It adds in float32 for F32
// and BF16 sources (which it widens first) and in float16 for F16 ones; so does this.
void add_norm_offset(PlannedTensor* t) {
  const auto in = t->bytes();
  const int64_t n = t->num_elements();
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    float v = 0.0f;
    uint16_t h = 0;
    switch (t->src_type) {
      case SourceType::kF32:
        std::memcpy(&v, in.data() + 4 * i, 4);
        break;
      case SourceType::kF16:
        std::memcpy(&h, in.data() + 2 * i, 2);
        v = fp16_to_fp32(h);
        break;
      case SourceType::kBF16:
        std::memcpy(&h, in.data() + 2 * i, 2);
        v = bf16_to_fp32(h);
        break;
    }
    v += 1.0f;
    if (t->src_type == SourceType::kF16) {
      h = fp32_to_fp16(v);
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
    } else {
      const auto* p = reinterpret_cast<const uint8_t*>(&v);
      out.insert(out.end(), p, p + 4);
    }
  }
  if (t->src_type == SourceType::kBF16) t->src_type = SourceType::kF32;
  t->owned = std::move(out);
}

// The checkpoint's tensors by llama.cpp's normalised name: the text model of a multimodal
// checkpoint ("language_model.model.layers..." or "model.language_model.layers...") is read as
// "model.layers...", and its vision tower and projector are skipped.
using TensorMap = std::map<std::string, const StTensor*>;

Result<TensorMap> normalized_tensors(const SafetensorsModel& w) {
  TensorMap out;
  for (const StTensor* t : w.tensors()) {
    std::string n = t->name;
    for (const char* skip : {"vision_tower.", "multi_modal_projector.", "vision_model."}) {
      if (n.starts_with(skip) || n.starts_with(std::string("model.") + skip)) n.clear();
    }
    if (n.empty()) continue;
    if (const size_t pos = n.find("language_model."); pos != std::string::npos) n.erase(pos, 15);
    if (!out.emplace(n, t).second) {
      return data_loss(*t->file, ": tensor '", t->name, "' and '", out[n]->name,
                       "' are both the text model's '", n, "'");
    }
  }
  return out;
}

const StTensor* find(const TensorMap& m, const std::string& name) {
  const auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

// Accepts only tensors the converter knows, so a checkpoint of another architecture (or with
// biases the GGUF has no place for) fails loudly instead of losing weights.
Status check_known_names(const HfConfig& c, const TensorMap& m) {
  const auto table = layer_table(c.arch);
  for (const auto& [n, t] : m) {
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight" || n == "model.norm.weight")
      continue;
    if (n.rfind("model.layers.", 0) == 0) {
      const size_t dot = n.find('.', 13);
      const std::string idx = n.substr(13, dot == std::string::npos ? 0 : dot - 13);
      const bool numeric = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
      if (numeric && idx.size() < 6 && std::stoul(idx) < c.num_hidden_layers) {
        const std::string_view suffix = std::string_view(n).substr(dot + 1);
        if (suffix == "self_attn.rotary_emb.inv_freq") continue;  // recomputed from rope_theta
        for (const auto& lt : table) {
          if (lt.hf_suffix == suffix) goto known;
        }
      }
    }
    return unimplemented(*t->file, ": tensor '", t->name, "' has no GGUF mapping for ",
                         hf_arch_name(c.arch), " with ", c.num_hidden_layers, " layers");
  known:;
  }
  return ok_status();
}

// token_embd.weight and, unless tied, output.weight. Either HF tensor may be the stored one.
Status plan_embeddings(const HfConfig& c, const TensorMap& m, uint32_t n_vocab_tokens,
                       ModelPlan* plan) {
  const StTensor* embed = find(m, "model.embed_tokens.weight");
  // Gemma 2's lm_head is a leftover llama.cpp skips; the embedding is the classifier.
  const StTensor* head = c.arch == HfArch::kGemma2 ? nullptr : find(m, "lm_head.weight");
  if (embed == nullptr && head == nullptr) {
    return not_found("neither model.embed_tokens.weight nor lm_head.weight is in the checkpoint");
  }
  const StTensor* tok = embed != nullptr ? embed : head;
  const int64_t vocab = c.vocab_size > 0 ? c.vocab_size : tok->shape.empty() ? 0 : tok->shape[0];
  const std::vector<int64_t> shape = {vocab, int64_t{c.hidden_size}};
  ARBOR_ASSIGN_OR_RETURN(PlannedTensor t, plan_tensor(*tok, "token_embd.weight", shape));
  if (c.arch == HfArch::kGemma3 && n_vocab_tokens > 0 && n_vocab_tokens < vocab) {
    // llama.cpp drops the rows past the tokenizer's last token (Gemma 3 pads its vocabulary).
    t.dims[1] = n_vocab_tokens;
    t.src = t.src.first(static_cast<size_t>(n_vocab_tokens) * c.hidden_size *
                        source_type_size(t.src_type));
  }
  plan->hparams.vocab_size = static_cast<uint32_t>(t.dims[1]);
  plan->tensors.push_back(t);
  const bool tied = embed == nullptr || head == nullptr || c.tie_word_embeddings;
  if (head != nullptr && embed == nullptr && !c.tie_word_embeddings) {
    ARBOR_LOG(kWarn) << "only lm_head.weight is stored; tying it to the embedding";
  }
  if (!tied) {
    ARBOR_ASSIGN_OR_RETURN(PlannedTensor out, plan_tensor(*head, "output.weight", shape));
    plan->tensors.push_back(std::move(out));
  } else if (c.arch == HfArch::kOlmo2) {
    t.name = "output.weight";  // llama.cpp's olmo2 requires the classifier: a copy of the embedding
    plan->tensors.push_back(std::move(t));
  }
  return ok_status();
}

Status plan_layers(const HfConfig& c, const TensorMap& m, ModelPlan* plan) {
  const bool permute = permutes_qk(c.arch);
  const auto table = layer_table(c.arch);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const auto& lt : table) {
      const std::string hf_name = str_cat("model.layers.", l, ".", lt.hf_suffix);
      const StTensor* st = find(m, hf_name);
      if (st == nullptr) {
        if (lt.optional) continue;
        return not_found("tensor '", hf_name, "' is missing from the checkpoint");
      }
      ARBOR_ASSIGN_OR_RETURN(PlannedTensor t,
                             plan_tensor(*st, str_cat("blk.", l, ".", lt.gguf_suffix),
                                         shape_of(c, lt.shape)));
      if (permute && lt.gguf_suffix.starts_with("attn_q.")) t.permute_heads = c.num_attention_heads;
      if (permute && lt.gguf_suffix.starts_with("attn_k.")) t.permute_heads = c.num_key_value_heads;
      if (is_gemma(c.arch) && lt.hf_suffix.ends_with("norm.weight")) add_norm_offset(&t);
      plan->tensors.push_back(std::move(t));
    }
  }
  return ok_status();
}

PlannedTensor f32_tensor(std::string name, const std::vector<float>& v) {
  PlannedTensor r;
  r.name = std::move(name);
  r.dims = {static_cast<int64_t>(v.size())};
  r.owned.resize(v.size() * 4);
  std::memcpy(r.owned.data(), v.data(), r.owned.size());
  return r;
}

LlamaHparams hparams_of(const HfConfig& c, std::string name) {
  LlamaHparams hp;
  hp.arch = std::string(hf_arch_name(c.arch));
  hp.name = std::move(name);
  hp.context_length = c.max_position_embeddings;
  hp.embedding_length = c.hidden_size;
  hp.feed_forward_length = c.intermediate_size;
  hp.block_count = c.num_hidden_layers;
  hp.head_count = c.num_attention_heads;
  hp.head_count_kv = c.num_key_value_heads;
  hp.rope_dimension_count = c.head_dim;
  hp.rms_norm_eps = c.rms_norm_eps;
  hp.rope_freq_base = c.rope_theta;
  hp.write_rope_freq_base = true;
  return hp;
}

}  // namespace

Result<ModelPlan> plan_hf(const HfConfig& c, const SafetensorsModel& w, std::string model_name,
                          uint32_t n_vocab_tokens) {
  ARBOR_ASSIGN_OR_RETURN(TensorMap m, normalized_tensors(w));
  ARBOR_RETURN_IF_ERROR(check_known_names(c, m));
  ModelPlan plan;
  plan.hparams = hparams_of(c, std::move(model_name));
  ARBOR_RETURN_IF_ERROR(plan_embeddings(c, m, n_vocab_tokens, &plan));
  ARBOR_RETURN_IF_ERROR(plan_layers(c, m, &plan));
  const StTensor* norm = find(m, "model.norm.weight");
  if (norm == nullptr)
    return not_found("tensor 'model.norm.weight' is missing from the checkpoint");
  ARBOR_ASSIGN_OR_RETURN(PlannedTensor t,
                         plan_tensor(*norm, "output_norm.weight", {int64_t{c.hidden_size}}));
  if (is_gemma(c.arch)) add_norm_offset(&t);
  plan.tensors.push_back(std::move(t));
  if (c.rope.type == RopeScalingType::kLlama3) {
    plan.tensors.push_back(f32_tensor("rope_freqs.weight", llama3_rope_factors(c)));
  }
  if (c.rope.type == RopeScalingType::kLongRope) {
    plan.tensors.push_back(f32_tensor("rope_factors_long.weight", c.rope.long_factor));
    plan.tensors.push_back(f32_tensor("rope_factors_short.weight", c.rope.short_factor));
  }
  plan.arch_metadata = hf_arch_metadata(c, plan.hparams.vocab_size);
  return plan;
}

namespace {

// Gemma 3 keeps embedding rows only for tokenizer.json's tokens: len(model.vocab) +
// len(added_tokens), as llama.cpp counts them.
Result<uint32_t> count_tokens(const std::string& tokenizer_json) {
  const auto j = nlohmann::json::parse(tokenizer_json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_object() ||
      !j["model"].contains("vocab") || !j["model"]["vocab"].is_object()) {
    return data_loss("tokenizer.json: missing model.vocab object");
  }
  size_t n = j["model"]["vocab"].size();
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) n += j["added_tokens"].size();
  return static_cast<uint32_t>(n);
}

std::string pre_tokenizer_name(HfArch arch) {
  switch (arch) {
    case HfArch::kQwen2:
    case HfArch::kQwen3:
      return "qwen2";
    case HfArch::kMistral3:
      return "tekken";
    default:
      return "llama-bpe";
  }
}

}  // namespace

Result<HfModel> load_hf(const std::string& dir) {
  namespace fs = std::filesystem;
  HfModel m;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  ARBOR_ASSIGN_OR_RETURN(std::string config_text, read_file(config_path));
  ARBOR_ASSIGN_OR_RETURN(m.config, parse_hf_config(config_text, config_path));
  ARBOR_ASSIGN_OR_RETURN(m.weights, SafetensorsModel::open_dir(dir));
  HfTokenizerFiles tok;
  ARBOR_ASSIGN_OR_RETURN(tok.tokenizer_json,
                         read_file((fs::path(dir) / "tokenizer.json").string()));
  uint32_t n_vocab_tokens = 0;
  if (m.config.arch == HfArch::kGemma3) {
    ARBOR_ASSIGN_OR_RETURN(n_vocab_tokens, count_tokens(tok.tokenizer_json));
  }
  const std::string name = fs::path(dir).filename().empty()
                               ? fs::path(dir).parent_path().filename().string()
                               : fs::path(dir).filename().string();
  ARBOR_ASSIGN_OR_RETURN(m.plan, plan_hf(m.config, m.weights, name, n_vocab_tokens));
  const fs::path tok_config = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tok_config)) {
    ARBOR_ASSIGN_OR_RETURN(tok.tokenizer_config_json, read_file(tok_config.string()));
  }
  tok.config_bos_id = m.config.bos_token_id;
  tok.config_eos_id = m.config.eos_token_id;
  tok.model_vocab_size = m.plan.hparams.vocab_size;
  tok.pre_name = pre_tokenizer_name(m.config.arch);
  auto kv = hf_tokenizer_metadata(tok);
  if (!kv.ok()) return kv.status().with_context(dir);
  m.plan.tokenizer_metadata = std::move(kv).value();
  return m;
}

}  // namespace arbor::convert
