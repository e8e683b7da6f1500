#include "model/model_config.h"

#include <cmath>
#include <limits>

#include "base/status.h"

namespace arbor::model {
namespace {

// Reads an integer key into a positive int, naming the key on error.
Result<int> get_positive_int(const gguf::GgufFile& f, const std::string& key) {
  ARBOR_ASSIGN_OR_RETURN(const int64_t v, f.get_i64(key));
  if (v < 1 || v > std::numeric_limits<int32_t>::max()) {
    return invalid_argument(f.name(), ": ", key, " = ", v, " (must be in [1, 2^31))");
  }
  return (int)v;
}

Result<int> get_int_or(const gguf::GgufFile& f, const std::string& key, int fallback) {
  if (f.find(key) == nullptr) return fallback;
  return get_positive_int(f, key);
}

Result<float> get_float_or(const gguf::GgufFile& f, const std::string& key, float fallback) {
  if (f.find(key) == nullptr) return fallback;
  return f.get_f32(key);
}

Status read_rope(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  ARBOR_ASSIGN_OR_RETURN(c.rope_theta, get_float_or(f, a + ".rope.freq_base", 10000.0f));
  if (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)) {
    return invalid_argument(f.name(), ": ", a, ".rope.freq_base = ", c.rope_theta,
                            " (must be a positive finite number)");
  }
  ARBOR_ASSIGN_OR_RETURN(c.rope_dim, get_int_or(f, a + ".rope.dimension_count", c.head_dim));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return invalid_argument(f.name(), ": ", a, ".rope.dimension_count = ", c.rope_dim,
                            " (must be even and <= head_dim ", c.head_dim, ")");
  }
  c.rope_neox = c.arch == Arch::kQwen2;
  const std::string type_key = a + ".rope.scaling.type";
  std::string type = "none";
  if (f.find(type_key) != nullptr) {
    ARBOR_ASSIGN_OR_RETURN(type, f.get_string(type_key));
  }
  if (type == "none") return ok_status();
  if (type != "llama3") {
    return unimplemented(f.name(), ": ", type_key, " = \"", type,
                         "\" (supported: none, llama3)");
  }
  c.rope_scaling = RopeScaling::kLlama3;
  ARBOR_ASSIGN_OR_RETURN(c.rope_factor, f.get_f32(a + ".rope.scaling.factor"));
  ARBOR_ASSIGN_OR_RETURN(c.rope_original_context,
                         get_positive_int(f, a + ".rope.scaling.original_context_length"));
  ARBOR_ASSIGN_OR_RETURN(c.rope_low_freq_factor,
                         get_float_or(f, a + ".rope.scaling.low_freq_factor", 1.0f));
  ARBOR_ASSIGN_OR_RETURN(c.rope_high_freq_factor,
                         get_float_or(f, a + ".rope.scaling.high_freq_factor", 4.0f));
  if (!(c.rope_factor > 0.0f)) {
    return invalid_argument(f.name(), ": ", a, ".rope.scaling.factor = ", c.rope_factor,
                            " (must be > 0)");
  }
  return ok_status();
}

Status read_shape(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  ARBOR_ASSIGN_OR_RETURN(c.dim, get_positive_int(f, a + ".embedding_length"));
  ARBOR_ASSIGN_OR_RETURN(c.ffn_dim, get_positive_int(f, a + ".feed_forward_length"));
  ARBOR_ASSIGN_OR_RETURN(c.num_layers, get_positive_int(f, a + ".block_count"));
  ARBOR_ASSIGN_OR_RETURN(c.num_heads, get_positive_int(f, a + ".attention.head_count"));
  ARBOR_ASSIGN_OR_RETURN(c.num_kv_heads,
                         get_int_or(f, a + ".attention.head_count_kv", c.num_heads));
  ARBOR_ASSIGN_OR_RETURN(c.context_length, get_positive_int(f, a + ".context_length"));
  ARBOR_ASSIGN_OR_RETURN(c.rms_eps, f.get_f32(a + ".attention.layer_norm_rms_epsilon"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(f.name(), ": ", a, ".attention.head_count = ", c.num_heads,
                            " is not a multiple of ", a, ".attention.head_count_kv = ",
                            c.num_kv_heads);
  }
  const int default_head_dim = c.dim / c.num_heads;
  ARBOR_ASSIGN_OR_RETURN(c.head_dim, get_int_or(f, a + ".attention.key_length", default_head_dim));
  if (c.head_dim * c.num_heads != c.dim && f.find(a + ".attention.key_length") == nullptr) {
    return invalid_argument(f.name(), ": ", a, ".embedding_length = ", c.dim,
                            " is not a multiple of ", a, ".attention.head_count = ", c.num_heads);
  }
  if (!(c.rms_eps > 0.0f)) {
    return invalid_argument(f.name(), ": ", a, ".attention.layer_norm_rms_epsilon = ", c.rms_eps,
                            " (must be > 0)");
  }
  return ok_status();
}

}  // namespace

Result<ModelConfig> ModelConfig::from_gguf(const gguf::GgufFile& f) {
  ModelConfig c;
  ARBOR_ASSIGN_OR_RETURN(c.arch_name, f.get_string("general.architecture"));
  if (c.arch_name == "llama") {
    c.arch = Arch::kLlama;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::kQwen2;
  } else {
    return unimplemented(f.name(), ": general.architecture = \"", c.arch_name,
                         "\" (supported: llama, qwen2)");
  }
  const std::string& a = c.arch_name;
  ARBOR_RETURN_IF_ERROR(read_shape(f, a, c));
  ARBOR_RETURN_IF_ERROR(read_rope(f, a, c));
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return not_found(f.name(), ": tensor token_embd.weight is missing");
  if (embd->dims.size() != 2 || embd->dims[1] < 1 || embd->dims[1] > (1 << 30)) {
    return invalid_argument(f.name(), ": token_embd.weight must be 2-D [embedding_length, vocab]");
  }
  c.vocab_size = (int)embd->dims[1];
  return c;
}

std::string ModelConfig::summary() const {
  return str_cat(arch_name, ": dim ", dim, ", ffn ", ffn_dim, ", ", num_layers, " layers, ",
                 num_heads, " heads (", num_kv_heads, " kv, head_dim ", head_dim, "), vocab ",
                 vocab_size, ", context ", context_length, ", rope theta ", rope_theta, " dim ",
                 rope_dim, rope_neox ? " neox" : "", ", rms_eps ", rms_eps);
}

}  // namespace arbor::model
