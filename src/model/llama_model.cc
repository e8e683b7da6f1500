#include "model/llama_model.h"

#include "base/log.h"
#include "base/mapped_file.h"
#include "base/progress.h"
#include "base/status.h"
#include "model/weight_check.h"

namespace arbor::model {
namespace {

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str_cat(i ? ", " : "", dims[i]);
  return s + "]";
}

// Finds `name` and checks its ggml-order dims.
Result<const gguf::TensorInfo*> find_checked(const gguf::GgufFile& f, const std::string& name,
                                             const std::vector<int64_t>& dims) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) return not_found(f.name(), ": tensor ", name, " is missing");
  if (t->dims != dims) {
    return invalid_argument(f.name(), ": tensor ", name, " has dims ", dims_string(t->dims),
                            ", expected ", dims_string(dims), " from the model config");
  }
  return t;
}

// A matrix [rows, cols] (ggml dims [cols, rows]) of a type matmul supports.
Result<kernels::WeightView> matrix(const gguf::GgufFile& f, const std::string& name, int64_t rows,
                                   int64_t cols) {
  ARBOR_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find_checked(f, name, {cols, rows}));
  if (!kernels::matmul_supported(t->type)) {
    return unimplemented(f.name(), ": tensor ", name, " has type ", gguf::ggml_type_name(t->type),
                         ", which the matmul kernels do not support");
  }
  return kernels::make_weight_view(t->type, t->data, rows, cols);
}

// An F32 vector [n].
Result<const float*> vector_f32(const gguf::GgufFile& f, const std::string& name, int64_t n) {
  ARBOR_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find_checked(f, name, {n}));
  if (t->type != gguf::GgmlType::kF32) {
    return unimplemented(f.name(), ": tensor ", name, " has type ", gguf::ggml_type_name(t->type),
                         ", expected f32");
  }
  return reinterpret_cast<const float*>(t->data);
}

// An optional F32 vector: null when absent.
Result<const float*> optional_vector_f32(const gguf::GgufFile& f, const std::string& name,
                                         int64_t n) {
  if (f.find_tensor(name) == nullptr) return static_cast<const float*>(nullptr);
  return vector_f32(f, name, n);
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path,
                                                     const ModelLoadOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  return from_file(std::move(file), options);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_file(gguf::GgufFile file,
                                                          const ModelLoadOptions& options) {
  ARBOR_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::from_gguf(file));
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(file), std::move(config)));
  ARBOR_RETURN_IF_ERROR(model->bind_weights());
  ARBOR_RETURN_IF_ERROR(model->check_cheap_weights());
  if (options.pack_for_cpu) model->pack_matrices();
  return model;
}

void LlamaModel::pack_matrices() {
  std::vector<kernels::WeightView*> views;
  for (LayerWeights& l : weights_.layers) {
    for (kernels::WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      if (kernels::packing_available(v->type)) views.push_back(v);
    }
  }
  if (kernels::packing_available(weights_.output.type)) views.push_back(&weights_.output);
  if (views.empty()) return;
  uint64_t total_mib = 0;
  for (const kernels::WeightView* v : views) total_mib += v->rows * v->row_stride >> 20;
  // Reads the whole file once (page faults on a cold cache dominate), so it shows progress.
  ProgressBar bar("packing weights", total_mib, "MiB");
  for (kernels::WeightView* v : views) {
    packed_.push_back(kernels::pack_weights(*v));
    v->packed = packed_.back().data();
    // The embedding's rows are still read from the mapping when the classifier is tied to it.
    if (!(v == &weights_.output && weights_.tied_output)) {
      release_mapped_pages(v->data, static_cast<size_t>(v->rows) * v->row_stride);
    }
    bar.add(v->rows * v->row_stride >> 20);
  }
  bar.finish();
}

// The weights every load checks (weight_check.h): the 1-D F32 tensors (norms, biases) and the
// classifier (token_embd when tied), which every logit reads.
Status LlamaModel::check_cheap_weights() const {
  for (const gguf::TensorInfo& t : file_.tensors()) {
    const bool vector = t.dims.size() == 1 && t.type == gguf::GgmlType::kF32;
    const bool classifier =
        t.name == (weights_.tied_output ? "token_embd.weight" : "output.weight");
    if (vector || classifier) ARBOR_RETURN_IF_ERROR(check_finite_tensor(file_, t));
  }
  return ok_status();
}

Status LlamaModel::bind_weights() {
  const ModelConfig& c = config_;
  ARBOR_ASSIGN_OR_RETURN(weights_.token_embd,
                         matrix(file_, "token_embd.weight", c.vocab_size, c.dim));
  ARBOR_ASSIGN_OR_RETURN(weights_.output_norm, vector_f32(file_, "output_norm.weight", c.dim));
  weights_.tied_output = file_.find_tensor("output.weight") == nullptr;
  if (weights_.tied_output) {
    weights_.output = weights_.token_embd;
  } else {
    ARBOR_ASSIGN_OR_RETURN(weights_.output, matrix(file_, "output.weight", c.vocab_size, c.dim));
  }
  // Llama 3.1-style scaling as llama.cpp stores it: per-frequency divisors.
  ARBOR_ASSIGN_OR_RETURN(weights_.rope_freqs,
                         optional_vector_f32(file_, "rope_freqs.weight", c.rope_dim / 2));
  if (weights_.rope_freqs != nullptr && c.rope_scaling != RopeScaling::kNone) {
    return invalid_argument(file_.name(), ": both rope_freqs.weight and ", c.arch_name,
                            ".rope.scaling.type are set; use one");
  }
  weights_.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) ARBOR_RETURN_IF_ERROR(bind_layer(l));
  return ok_status();
}

Status LlamaModel::bind_layer(int l) {
  const ModelConfig& c = config_;
  LayerWeights& w = weights_.layers[l];
  const std::string p = str_cat("blk.", l, ".");
  ARBOR_ASSIGN_OR_RETURN(w.attn_norm, vector_f32(file_, p + "attn_norm.weight", c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.wq, matrix(file_, p + "attn_q.weight", c.q_dim(), c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.wk, matrix(file_, p + "attn_k.weight", c.kv_dim(), c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.wv, matrix(file_, p + "attn_v.weight", c.kv_dim(), c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.wo, matrix(file_, p + "attn_output.weight", c.dim, c.q_dim()));
  ARBOR_ASSIGN_OR_RETURN(w.ffn_norm, vector_f32(file_, p + "ffn_norm.weight", c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.w_gate, matrix(file_, p + "ffn_gate.weight", c.ffn_dim, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.w_up, matrix(file_, p + "ffn_up.weight", c.ffn_dim, c.dim));
  ARBOR_ASSIGN_OR_RETURN(w.w_down, matrix(file_, p + "ffn_down.weight", c.dim, c.ffn_dim));
  if (c.arch == Arch::kQwen2) {
    ARBOR_ASSIGN_OR_RETURN(w.bq, vector_f32(file_, p + "attn_q.bias", c.q_dim()));
    ARBOR_ASSIGN_OR_RETURN(w.bk, vector_f32(file_, p + "attn_k.bias", c.kv_dim()));
    ARBOR_ASSIGN_OR_RETURN(w.bv, vector_f32(file_, p + "attn_v.bias", c.kv_dim()));
  } else {
    ARBOR_ASSIGN_OR_RETURN(w.bq, optional_vector_f32(file_, p + "attn_q.bias", c.q_dim()));
    ARBOR_ASSIGN_OR_RETURN(w.bk, optional_vector_f32(file_, p + "attn_k.bias", c.kv_dim()));
    ARBOR_ASSIGN_OR_RETURN(w.bv, optional_vector_f32(file_, p + "attn_v.bias", c.kv_dim()));
  }
  return ok_status();
}

}  // namespace arbor::model
