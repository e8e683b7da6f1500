#include "cuda/host_plan.h"

#include "base/check.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <array>

namespace arbor::cuda {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

class Planner {
 public:
  explicit Planner(bool (*supported)(gguf::GgmlType)) : supported_(supported) {}

  Status matrix(const std::string& name, const kernels::WeightView& w) {
    if (!supported_(w.type)) {
      return unimplemented(name, " has type ", gguf::ggml_type_name(w.type),
                           ", which the CUDA matmul does not support (f32, f16, bf16, q8_0, "
                           "q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K; mxfp4, iq4_nl "
                           "and iq4_xs have CPU kernels only: run it with --device cpu)");
    }
    const size_t row_bytes = kernels::weight_row_bytes(w.type, w.cols);
    add(name, w.data, w.row_stride != 0 ? w.row_stride : row_bytes, row_bytes, w.rows);
    return ok_status();
  }
  void vector(const std::string& name, const float* v, int64_t n) {
    if (v != nullptr) add(name, v, n * sizeof(float), n * sizeof(float), 1);
  }
  UploadPlan take() { return std::move(plan_); }

 private:
  void add(const std::string& name, const void* host, size_t stride, size_t row_bytes,
           int64_t rows) {
    if (!seen_.insert(host).second) return;  // tied output: the same tensor again
    plan_.tensors.push_back({name, host, stride, row_bytes, rows, plan_.total_bytes});
    plan_.total_bytes += align256(row_bytes * rows);
  }

  bool (*supported_)(gguf::GgmlType);
  std::unordered_set<const void*> seen_;
  UploadPlan plan_;
};

}  // namespace

Result<UploadPlan> plan_weight_upload(const model::LlamaModel& model,
                                      bool (*supported)(gguf::GgmlType)) {
  // for_each_weight walks a mutable structure; the plan only reads the copy's pointers.
  model::LlamaWeights w = model.weights();
  Planner p(supported);
  Status status = ok_status();
  model::for_each_weight(
      w, model.config(),
      [&](const model::MatrixRef& m) {
        if (status.ok()) status = p.matrix(m.name, *m.w);
      },
      [&](const model::VectorRef& v) { p.vector(v.name, *v.v, v.n); });
  if (w.tied_output) ARBOR_RETURN_IF_ERROR(p.matrix("token_embd.weight", w.output.w));
  ARBOR_RETURN_IF_ERROR(status);
  return p.take();
}

model::LlamaWeights device_weights(const model::LlamaWeights& host, const model::ModelConfig& c,
                                   const UploadPlan& plan, uint8_t* base) {
  std::unordered_map<const void*, size_t> offset;
  for (const UploadPlan::Tensor& t : plan.tensors) offset.emplace(t.host, t.offset);
  auto moved = [&](const void* p) -> uint8_t* {
    if (p == nullptr) return nullptr;
    const auto it = offset.find(p);
    ARBOR_CHECK(it != offset.end()) << "a weight missing from the upload plan";
    return base + it->second;
  };
  auto mat = [&](kernels::WeightView& w) {
    w.data = moved(w.data);
    w.row_stride = kernels::weight_row_bytes(w.type, w.cols);
    w.packed = nullptr;
  };
  model::LlamaWeights d = host;
  model::for_each_weight(
      d, c, [&](const model::MatrixRef& m) { mat(*m.w); },
      [&](const model::VectorRef& v) { *v.v = reinterpret_cast<const float*>(moved(*v.v)); });
  if (d.tied_output) d.output.w = d.token_embd;
  return d;
}

Status check_cuda_supports(const model::ModelConfig& c, const model::LlamaWeights& w) {
  auto refuse = [&](const std::string& what) {
    return unimplemented("the CUDA executor has not run ", what, " on a GPU yet (", c.arch_name,
                         "); serve this model with --device cpu");
  };
  if (c.arch != model::Arch::kLlama && c.arch != model::Arch::kQwen2) {
    return refuse(str_cat("the ", c.arch_name, " architecture"));
  }
  if (c.is_moe()) {
    return refuse(str_cat("mixture-of-experts feed-forward blocks (", c.num_experts,
                          " experts: routing and grouped expert matmuls)"));
  }
  const model::RopeVariant& r = c.ropes[0];
  if (c.ropes.size() != 1 || c.has_sliding_layers()) return refuse("sliding-window attention");
  if ((r.scaling != model::RopeScaling::kNone && r.scaling != model::RopeScaling::kLlama3) ||
      r.mscale != 1.0f) {
    return refuse("this RoPE scaling");
  }
  for (const model::LayerSpec& l : c.layers) {
    if (l.rope != 0) return refuse("layers without RoPE");
  }
  for (const model::LayerWeights& l : w.layers) {
    if (l.attn_sinks != nullptr) return refuse("attention sinks");
    for (const model::Linear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      if (x->scale != 1.0f) return refuse("per-tensor weight scales");
    }
    for (const model::Linear* x : {&l.o, &l.gate, &l.up, &l.down}) {
      if (x->bias != nullptr) return refuse("attention-output or feed-forward biases");
    }
  }
  if (w.output.scale != 1.0f) return refuse("per-tensor weight scales");
  return ok_status();
}

namespace {

// The batch's arrays as (pointer, bytes), in StagingLayout order.
struct ArrayBytes {
  const void* data;
  size_t bytes;
};
std::array<ArrayBytes, 11> arrays_of(const model::ForwardBatch& b) {
  auto i32 = [](std::span<const int32_t> s) { return ArrayBytes{s.data(), s.size_bytes()}; };
  return {i32(b.tokens),       i32(b.positions),      i32(b.qo_indptr),  i32(b.kv_indptr),
          i32(b.kv_page_indices), i32(b.kv_len),     i32(b.slot_mapping), i32(b.logits_indices),
          i32(b.mask_indptr),  ArrayBytes{b.mask_bits.data(), b.mask_bits.size_bytes()},
          i32(b.hidden_indices)};
}

// Each further KV cache group's kv_indptr, kv_page_indices and slot_mapping, in order.
std::vector<ArrayBytes> group_arrays_of(const model::ForwardBatch& b) {
  std::vector<ArrayBytes> out;
  for (const model::KvGroupArrays& g : b.more_kv_groups) {
    for (std::span<const int32_t> s : {g.kv_indptr, g.kv_page_indices, g.slot_mapping}) {
      out.push_back(ArrayBytes{s.data(), s.size_bytes()});
    }
  }
  return out;
}

}  // namespace

StagingLayout staging_layout(const model::ForwardBatch& batch) {
  StagingLayout lay;
  const auto arrays = arrays_of(batch);
  for (size_t i = 0; i < arrays.size(); ++i) {
    lay.offsets[i] = lay.total_bytes;
    lay.total_bytes += align256(arrays[i].bytes);
  }
  for (const ArrayBytes& a : group_arrays_of(batch)) {
    lay.group_offsets.push_back(lay.total_bytes);
    lay.total_bytes += align256(a.bytes);
  }
  lay.total_bytes = std::max<size_t>(lay.total_bytes, 256);
  return lay;
}

void write_staging(const model::ForwardBatch& batch, const StagingLayout& lay, uint8_t* dst) {
  const auto arrays = arrays_of(batch);
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i].bytes > 0) std::memcpy(dst + lay.offsets[i], arrays[i].data, arrays[i].bytes);
  }
  const std::vector<ArrayBytes> groups = group_arrays_of(batch);
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].bytes > 0) {
      std::memcpy(dst + lay.group_offsets[i], groups[i].data, groups[i].bytes);
    }
  }
}

model::ForwardBatch staged_batch(const model::ForwardBatch& batch, const StagingLayout& lay,
                                 const uint8_t* base, std::vector<model::KvGroupArrays>* groups) {
  auto at = [&](std::span<const int32_t> s, size_t offset) {
    if (s.empty()) return std::span<const int32_t>();
    return std::span<const int32_t>(reinterpret_cast<const int32_t*>(base + offset), s.size());
  };
  auto i32 = [&](std::span<const int32_t> s, int i) { return at(s, lay.offsets[i]); };
  model::ForwardBatch d;
  d.tokens = i32(batch.tokens, 0);
  d.positions = i32(batch.positions, 1);
  d.qo_indptr = i32(batch.qo_indptr, 2);
  d.kv_indptr = i32(batch.kv_indptr, 3);
  d.kv_page_indices = i32(batch.kv_page_indices, 4);
  d.kv_len = i32(batch.kv_len, 5);
  d.slot_mapping = i32(batch.slot_mapping, 6);
  d.logits_indices = i32(batch.logits_indices, 7);
  d.mask_indptr = i32(batch.mask_indptr, 8);
  if (!batch.mask_bits.empty()) {
    d.mask_bits = std::span<const uint8_t>(base + lay.offsets[9], batch.mask_bits.size());
  }
  d.hidden_indices = i32(batch.hidden_indices, 10);
  if (!batch.more_kv_groups.empty()) {
    ARBOR_CHECK(groups != nullptr) << "staging a batch of " << batch.num_kv_groups()
                                   << " KV cache groups needs storage for their views";
    groups->clear();
    for (size_t g = 0; g < batch.more_kv_groups.size(); ++g) {
      const model::KvGroupArrays& h = batch.more_kv_groups[g];
      groups->push_back(model::KvGroupArrays{at(h.kv_indptr, lay.group_offsets[3 * g]),
                                             at(h.kv_page_indices, lay.group_offsets[3 * g + 1]),
                                             at(h.slot_mapping, lay.group_offsets[3 * g + 2])});
    }
    d.more_kv_groups = *groups;
  }
  return d;
}

namespace {

// Disjoint byte ranges [begin, end), merged on insertion.
class RangeSet {
 public:
  bool overlaps(uintptr_t b, uintptr_t e) const {
    auto it = ranges_.lower_bound(e);  // ranges starting at or after e cannot overlap
    if (it == ranges_.begin()) return false;
    return std::prev(it)->second > b;  // the last range starting before e ends latest
  }
  void add(uintptr_t b, uintptr_t e) {
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second >= b) {
      --it;
      b = it->first;
      e = std::max(e, it->second);
      it = ranges_.erase(it);
    }
    while (it != ranges_.end() && it->first <= e) {
      e = std::max(e, it->second);
      it = ranges_.erase(it);
    }
    ranges_.emplace(b, e);
  }
  void clear() { ranges_.clear(); }

 private:
  std::map<uintptr_t, uintptr_t> ranges_;
};

}  // namespace

std::vector<CopyRun> copy_runs(std::span<const model::DeviceMemory::Copy> copies) {
  std::vector<CopyRun> runs;
  RangeSet reads, writes;
  CopyRun run;
  for (size_t i = 0; i < copies.size(); ++i) {
    const model::DeviceMemory::Copy& c = copies[i];
    const auto s = reinterpret_cast<uintptr_t>(c.src), d = reinterpret_cast<uintptr_t>(c.dst);
    const bool hazard = c.bytes > 0 && (writes.overlaps(s, s + c.bytes) ||
                                        writes.overlaps(d, d + c.bytes) ||
                                        reads.overlaps(d, d + c.bytes));
    if (hazard) {
      runs.push_back(run);
      run = CopyRun{(int32_t)i, 0, 0};
      reads.clear();
      writes.clear();
    }
    if (c.bytes > 0) {
      reads.add(s, s + c.bytes);
      writes.add(d, d + c.bytes);
    }
    ++run.count;
    run.max_bytes = std::max(run.max_bytes, c.bytes);
  }
  if (run.count > 0) runs.push_back(run);
  return runs;
}

}  // namespace arbor::cuda
