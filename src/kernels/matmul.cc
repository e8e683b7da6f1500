#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "gguf/quants.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops.h"
#include "kernels/packed_affine.h"

namespace arbor::kernels {

using gguf::GgmlType;
using internal::BlockQ4_0;
using internal::BlockQ8_0;
using internal::kQBlock;
using internal::MatmulArgs;
using internal::QuantizedActs;

namespace {

// Types with their own kernels; other types that gguf can dequantise run a generic path.
bool has_native_kernels(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool rounds_acts_to_bf16(GgmlType type) {
  return type == GgmlType::kBF16 && active_isa() >= Isa::kAvx512 && cpu_features().avx512bf16;
}

float round_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if ((bits & 0x7F800000u) == 0) {
    bits &= 0x80000000u;  // zero and denormals: signed zero (vcvtneps2bf16 treats them as 0)
  } else if ((bits & 0x7FFFFFFFu) <= 0x7F800000u) {  // finite or infinite: nearest even
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  } else {
    bits = (bits | 0x00400000u) & 0xFFFF0000u;  // NaN stays a (quiet) NaN
  }
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

bool int8_kernels(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || internal::is_affine_type(type);
}

bool matmul_supported(GgmlType type) {
  return has_native_kernels(type) || gguf::can_dequantize(type);
}

int64_t weight_block_size(GgmlType type) {
  ARBOR_CHECK(matmul_supported(type)) << "unsupported weight type " << ggml_type_name(type);
  return gguf::ggml_traits(type).block_size;
}

size_t weight_block_bytes(GgmlType type) {
  ARBOR_CHECK(matmul_supported(type)) << "unsupported weight type " << ggml_type_name(type);
  return gguf::ggml_traits(type).type_size;
}

size_t weight_row_bytes(GgmlType type, int64_t cols) {
  const int64_t bs = weight_block_size(type);
  ARBOR_CHECK(cols >= 0 && cols % bs == 0) << "cols " << cols << " is not a multiple of "
                                           << ggml_type_name(type) << "'s block size " << bs;
  return static_cast<size_t>(cols / bs) * weight_block_bytes(type);
}

WeightView make_weight_view(GgmlType type, const void* data, int64_t rows, int64_t cols) {
  return WeightView{type, data, rows, cols, weight_row_bytes(type, cols)};
}

namespace {

const uint8_t* row_ptr(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride;
}

// Dequantises one row of w to f32. out: [w.cols].
void dequantize_row(const WeightView& w, int64_t r, float* out) {
  const uint8_t* p = row_ptr(w, r);
  const int64_t n = w.cols;
  switch (w.type) {
    case GgmlType::kF32:
      std::copy_n(reinterpret_cast<const float*>(p), n, out);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i)
        out[i] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(p)[i]);
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        out[i] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(p)[i]);
      return;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / kQBlock; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(p) + b;
        const float d = fp16_to_fp32(blk->d);
        for (int j = 0; j < kQBlock; ++j) out[b * kQBlock + j] = d * static_cast<float>(blk->qs[j]);
      }
      return;
    case GgmlType::kQ4_0:
      for (int64_t b = 0; b < n / kQBlock; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ4_0*>(p) + b;
        const float d = fp16_to_fp32(blk->d);
        for (int j = 0; j < 16; ++j) {
          out[b * kQBlock + j] = d * static_cast<float>((blk->qs[j] & 0xF) - 8);
          out[b * kQBlock + j + 16] = d * static_cast<float>((blk->qs[j] >> 4) - 8);
        }
      }
      return;
    default: {
      const Status st = gguf::dequantize_row(w.type, p, out, n);
      ARBOR_CHECK(st.ok()) << st.to_string();
    }
  }
}

void check_view(const WeightView& w) {
  ARBOR_CHECK(matmul_supported(w.type)) << "unsupported weight type " << ggml_type_name(w.type);
  ARBOR_CHECK(w.rows >= 0 && w.cols >= 0) << w.rows << " x " << w.cols;
  ARBOR_CHECK_GE(w.row_stride, weight_row_bytes(w.type, w.cols));
  ARBOR_CHECK(w.data != nullptr || w.rows == 0);
}

bool is_quantized(GgmlType t) { return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0; }

// Integer dot product of one weight block with one activation block.
int32_t block_dot(const WeightView& w, const uint8_t* row, int64_t b, const int8_t* aq) {
  int32_t s = 0;
  if (w.type == GgmlType::kQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    for (int j = 0; j < kQBlock; ++j) s += static_cast<int32_t>(blk->qs[j]) * aq[j];
  } else {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    for (int j = 0; j < 16; ++j) {
      s += ((blk->qs[j] & 0xF) - 8) * static_cast<int32_t>(aq[j]);
      s += ((blk->qs[j] >> 4) - 8) * static_cast<int32_t>(aq[j + 16]);
    }
  }
  return s;
}

// fp16 scale of block b of a Q8_0/Q4_0 row (both layouts start with it).
float block_scale(const WeightView& w, const uint8_t* row, int64_t b) {
  const uint8_t* blk = row + static_cast<size_t>(b) * weight_block_bytes(w.type);
  uint16_t d;
  std::memcpy(&d, blk, sizeof(d));
  return fp16_to_fp32(d);
}

// Scalar kernel for Q8_0/Q4_0: integer block dots, f32 accumulation.
void scalar_quant_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const WeightView& w = *a.w;
  const int64_t nb = w.cols / kQBlock;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = row_ptr(w, r);
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int8_t* aq = a.q.qs + t * w.cols;
      const float* ad = a.q.d + t * nb;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const float scale = block_scale(w, row, b) * ad[b];
        acc += static_cast<float>(block_dot(w, row, b, aq + b * kQBlock)) * scale;
      }
      a.y[t * w.rows + r] = acc;
    }
  }
}

// Element c of row r of a float-typed weight matrix.
float float_weight(const WeightView& w, const uint8_t* row, int64_t c) {
  uint16_t h;
  switch (w.type) {
    case GgmlType::kF32: {
      float f;
      std::memcpy(&f, row + c * 4, sizeof(f));
      return f;
    }
    case GgmlType::kF16:
      std::memcpy(&h, row + c * 2, sizeof(h));
      return fp16_to_fp32(h);
    default:
      std::memcpy(&h, row + c * 2, sizeof(h));
      return bf16_to_fp32(h);
  }
}

// Scalar kernel for float weights: converts a chunk of the row into a stack buffer (no heap on
// the hot path) and reuses it for every token; f32 accumulation.
void scalar_float_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const WeightView& w = *a.w;
  constexpr int64_t kChunk = 256;
  float buf[kChunk];
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = row_ptr(w, r);
    for (int64_t t = 0; t < a.num_tokens; ++t) a.y[t * w.rows + r] = 0.0f;
    for (int64_t c0 = 0; c0 < w.cols; c0 += kChunk) {
      const int64_t n = std::min(kChunk, w.cols - c0);
      for (int64_t c = 0; c < n; ++c) buf[c] = float_weight(w, row, c0 + c);
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        const float* x = a.x + t * w.cols + c0;
        float acc = 0.0f;
        for (int64_t c = 0; c < n; ++c) acc += buf[c] * x[c];
        a.y[t * w.rows + r] += acc;
      }
    }
  }
}

// Types without their own kernels (Q4_K, Q6_K, Q5_0, ...): each row is dequantised once per
// call into a per-thread buffer (grown, never shrunk) and dotted with every token.
void generic_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const WeightView& w = *a.w;
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(w.cols)) row.resize(static_cast<size_t>(w.cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    dequantize_row(w, r, row.data());
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      a.y[t * w.rows + r] = dot_f32(row.data(), a.x + t * w.cols, w.cols);
    }
  }
}

}  // namespace

namespace internal {

float act_absmax_scalar(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

void quantize_act_block_scalar(const float* x, float id, int8_t* qs) {
  for (int j = 0; j < kQBlock; ++j) qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
}

void quantize_act_row_scalar(const float* x, int64_t cols, int8_t* qs, float* d) {
  for (int64_t b = 0; b < cols / kQBlock; ++b) {
    const float db = act_absmax_scalar(x + b * kQBlock, kQBlock) / 127.0f;
    d[b] = db;
    quantize_act_block_scalar(x + b * kQBlock, db != 0.0f ? 1.0f / db : 0.0f, qs + b * kQBlock);
  }
}

void pack_x_blocked(const float* x, int64_t num_tokens, int64_t cols, float* out) {
  const int64_t steps = (cols + 15) / 16;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t c0 = s * 16, n = std::min<int64_t>(16, cols - c0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      float* dst = out + (s * num_tokens + t) * 16;
      std::memcpy(dst, x + t * cols + c0, static_cast<size_t>(n) * sizeof(float));
      std::fill(dst + n, dst + 16, 0.0f);
    }
  }
}

RowKernel scalar_kernel(GgmlType type) {
  return is_quantized(type) ? scalar_quant_rows : scalar_float_rows;
}

}  // namespace internal

namespace {
std::atomic<bool> g_affine_reference{false};
}  // namespace

void set_affine_reference_path(bool on) { g_affine_reference.store(on); }

namespace internal {

bool uses_packed(const WeightView& w, Isa isa) {
  if (w.packed == nullptr) return false;
  if (is_affine_type(w.type)) return isa >= Isa::kAvx2;
  return is_quantized(w.type) && isa >= Isa::kAvx512;
}

bool takes_packed_path(const WeightView& w, Isa isa) {
  return uses_packed(w, isa) &&
         !(is_affine_type(w.type) && g_affine_reference.load(std::memory_order_relaxed));
}

}  // namespace internal

using internal::uses_packed;

namespace {

struct MatmulJob {
  MatmulArgs args;
  internal::RowKernel kernel;
};

using internal::kChunksPerThread;
using internal::kMinParallelMacs;

// Runs fn(t) for every token t, split over the pool when there is enough work.
template <class Fn>
void for_each_token(int64_t num_tokens, int64_t cols, ThreadPool& pool, const Fn& fn) {
  if (num_tokens < 2 * pool.num_threads() || num_tokens * cols < kMinParallelMacs) {
    for (int64_t t = 0; t < num_tokens; ++t) fn(t);
    return;
  }
  // Capture one pointer so the std::function stores it inline (no allocation).
  pool.parallel_for(num_tokens, [&fn](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) fn(t);
  });
}

// Quantises x for the Q8_0/Q4_0 kernels into the pool's workspace and fills job.args.
void prepare_quantized_acts(const WeightView& w, const float* x, int64_t num_tokens, Isa isa,
                            ThreadPool& pool, MatmulJob& job) {
  const int64_t cols = w.cols, nb = cols / kQBlock;
  const size_t qs_bytes = (static_cast<size_t>(num_tokens * cols) + 63) / 64 * 64;
  const size_t d_bytes = (static_cast<size_t>(num_tokens * nb) * sizeof(float) + 63) / 64 * 64;
  const bool q4_sums = isa >= Isa::kAvx2 && w.type == GgmlType::kQ4_0;
  const size_t sums_bytes = q4_sums ? static_cast<size_t>(num_tokens * nb) * 16 : 0;
  auto* ws = static_cast<uint8_t*>(pool.workspace(0, qs_bytes + d_bytes + sums_bytes));
  auto* qs = reinterpret_cast<int8_t*>(ws);
  auto* d = reinterpret_cast<float*>(ws + qs_bytes);
  auto* sums = q4_sums ? reinterpret_cast<int16_t*>(ws + qs_bytes + d_bytes) : nullptr;
  const auto quantize =
      isa >= Isa::kAvx2 ? internal::quantize_act_row_avx2 : internal::quantize_act_row_scalar;
  for_each_token(num_tokens, cols, pool, [&](int64_t t) {
    quantize(x + t * cols, cols, qs + t * cols, d + t * nb);
    if (sums != nullptr) internal::act_q4_sums_avx2(qs + t * cols, cols, sums + t * nb * 8);
  });
  job.args.q = QuantizedActs{qs, d, cols, sums};
}

// Runs rows(w, acts, num_tokens, y, group_begin, group_end) for every row group of every matrix
// in ws over the pool, in one job; acts_of(thread) gives the records the thread reads ([cols /
// 32, num_tokens] records of type Act), called once per chunk. acts_step: matrix i reads acts + i
// * acts_step (0: all share acts; the segments of matmul_segments read their own columns' blocks).
template <class Act, class Rows, class ActsOf>
void run_packed_rows(std::span<const WeightView* const> ws, const ActsOf& acts_of,
                     std::span<float* const> ys, int64_t num_tokens, ThreadPool& pool,
                     const Rows& rows, int64_t acts_step = 0) {
  const int64_t cols = ws[0]->cols;
  // Work units: 16-row groups, the kernels' tile at every token count (packed_tiles.h);
  // unit_end[i] = units of matrices 0..i.
  int64_t unit_end[8];
  ARBOR_CHECK_LE(ws.size(), 8u);
  int64_t units = 0, macs = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    units += (ws[i]->rows + internal::kPackRows - 1) / internal::kPackRows;
    unit_end[i] = units;
    macs += ws[i]->rows * cols * num_tokens;
  }
  // Runs units [begin, end), which may span several matrices.
  const auto run_units = [&](int64_t begin, int64_t end, const Act* acts) {
    for (size_t i = 0; i < ws.size() && begin < end; ++i) {
      const int64_t first = i == 0 ? 0 : unit_end[i - 1];
      if (begin >= unit_end[i]) continue;
      const int64_t stop = std::min(end, unit_end[i]);
      rows(*ws[i], acts + i * acts_step, num_tokens, ys[i], begin - first, stop - first);
      begin = stop;
    }
  };
  if (pool.num_threads() == 1 || macs < kMinParallelMacs) {
    run_units(0, units, acts_of(0));
    return;
  }
  // Claimed dynamically, about four chunks per thread, as in matmul() below.
  const int64_t grain = std::max<int64_t>(1, units / (kChunksPerThread * pool.num_threads()));
  pool.parallel_for(
      units,
      [&](int64_t begin, int64_t end, int thread) { run_units(begin, end, acts_of(thread)); },
      grain);
}

// Quantises the activation rows of a packed matmul (pack(row, out, stride) writes one token's
// records, block-major: out[b * stride]) and runs the row groups (run_packed_rows).
// Up to kLocalActsTokens tokens, every thread of the job quantises all of them into its own
// records (pool workspace slot 1 + thread) when it takes its first chunk: records one core
// writes and another reads cross between the cores' caches line by line, which cost a 5-token
// step of a Qwen3-0.6B shape 13 us per matmul (1.9 ms a step) where quantising alone takes a
// fraction of that. The records are the same bytes either way. Longer steps quantise once, in
// slot 0, split by token, and every thread reads them (their matmuls are long enough).
constexpr int64_t kLocalActsTokens = 16;

template <class Act, class Pack, class Rows>
void pack_and_run(std::span<const WeightView* const> ws, const float* x, int64_t cols,
                  std::span<float* const> ys, int64_t num_tokens, ThreadPool& pool,
                  const Pack& pack, const Rows& rows, int64_t acts_step) {
  const size_t bytes = static_cast<size_t>(num_tokens * (cols / kQBlock)) * sizeof(Act);
  const auto pack_all = [&](Act* acts) {
    for (int64_t t = 0; t < num_tokens; ++t) pack(x + t * cols, acts + t, num_tokens);
  };
  if (pool.num_threads() > 1 && num_tokens <= kLocalActsTokens) {
    // The caller's list of each thread's records this call (a thread_local named inside the
    // lambda would be each worker's own); each thread writes only its own entry.
    thread_local std::vector<const Act*> caller_local;
    std::vector<const Act*>& local = caller_local;
    local.assign(static_cast<size_t>(pool.num_threads()), nullptr);
    const auto acts_of = [&local, &pool, &pack_all, bytes](int thread) {
      const Act*& mine = local[static_cast<size_t>(thread)];
      if (mine == nullptr) {
        auto* acts = static_cast<Act*>(pool.workspace(1 + thread, bytes));
        pack_all(acts);
        mine = acts;
      }
      return mine;
    };
    run_packed_rows<Act>(ws, acts_of, ys, num_tokens, pool, rows, acts_step);
    return;
  }
  auto* acts = static_cast<Act*>(pool.workspace(0, bytes));
  for_each_token(num_tokens, cols, pool,
                 [&](int64_t t) { pack(x + t * cols, acts + t, num_tokens); });
  run_packed_rows<Act>(ws, [acts](int) { return acts; }, ys, num_tokens, pool, rows, acts_step);
}

// The packed path for one or more matrices sharing x (same type and cols): activations into
// records (pack_and_run), then every matrix's row groups over the pool in one job.
// segments: matrix i multiplies columns [i * cols, (i + 1) * cols) of x ([num_tokens,
// ws.size() * cols]) instead of all of x ([num_tokens, cols]).
void matmul_packed(std::span<const WeightView* const> ws, const float* x,
                   std::span<float* const> ys, int64_t num_tokens, ThreadPool& pool,
                   bool segments = false) {
  const WeightView& w0 = *ws[0];
  const int64_t cols = segments ? w0.cols * static_cast<int64_t>(ws.size()) : w0.cols;
  // Activations are block-major ([nb, num_tokens]): segment i's blocks start i * nb_seg rows in.
  const int64_t acts_step = segments ? (w0.cols / kQBlock) * num_tokens : 0;
  if (internal::is_affine_type(w0.type)) {
    const internal::AffineFormat f = internal::affine_format(w0.type);
    pack_and_run<internal::ActBlockAffine>(
        ws, x, cols, ys, num_tokens, pool,
        [&](const float* row, internal::ActBlockAffine* out, int64_t stride) {
          internal::pack_act_row_affine(row, cols, f, out, stride, /*avx2=*/true);
        },
        active_isa() >= Isa::kAvx512 ? internal::affine_rows_avx512
        : cpu_features().avxvnni     ? internal::affine_rows_avxvnni
                                     : internal::affine_rows_avx2,
        acts_step);
    return;
  }
  const int32_t k = w0.type == GgmlType::kQ4_0 ? 8 : 128;
  pack_and_run<internal::ActBlockVnni>(
      ws, x, cols, ys, num_tokens, pool,
      [&](const float* row, internal::ActBlockVnni* out, int64_t stride) {
        internal::pack_act_row_vnni(row, cols, k, out, stride);
      },
      internal::packed_rows_avx512, acts_step);
}

// The scalar twin of the affine kernels (ISA scalar, or no packed copy on AVX-512 machines is
// not this: see matmul()): activations quantised once, rows split over the pool.
void matmul_affine_scalar(const WeightView& w, const float* x, float* y, int64_t num_tokens,
                          ThreadPool& pool) {
  const int64_t cols = w.cols, nb = cols / kQBlock;
  auto* acts = static_cast<internal::ActBlockAffine*>(pool.workspace(
      0, static_cast<size_t>(num_tokens * nb) * sizeof(internal::ActBlockAffine)));
  const internal::AffineFormat f = internal::affine_format(w.type);
  for (int64_t t = 0; t < num_tokens; ++t) {
    internal::pack_act_row_affine(x + t * cols, cols, f, acts + t, num_tokens, /*avx2=*/false);
  }
  if (pool.num_threads() == 1 || w.rows * cols * num_tokens < kMinParallelMacs) {
    internal::affine_rows_scalar(w, acts, num_tokens, y, 0, w.rows);
    return;
  }
  pool.parallel_for(w.rows, [&](int64_t begin, int64_t end, int) {
    internal::affine_rows_scalar(w, acts, num_tokens, y, begin, end);
  });
}

}  // namespace


void matmul(const WeightView& w, const float* x, float* y, int64_t num_tokens, ThreadPool& pool) {
  check_view(w);
  if (num_tokens <= 0 || w.rows == 0) return;
  const Isa isa = active_isa();
  if (internal::is_affine_type(w.type) &&
      (isa == Isa::kScalar || g_affine_reference.load(std::memory_order_relaxed))) {
    matmul_affine_scalar(w, x, y, num_tokens, pool);
    return;
  }
  if (uses_packed(w, isa)) {
    const WeightView* ws[1] = {&w};
    float* ys[1] = {y};
    matmul_packed(ws, x, ys, num_tokens, pool);
    return;
  }
  MatmulJob job;
  job.args.w = &w;
  job.args.x = x;
  job.args.num_tokens = num_tokens;
  job.args.y = y;
  job.kernel = !has_native_kernels(w.type) ? generic_rows
               : isa >= Isa::kAvx2         ? internal::avx2_kernel(w.type)
                                           : internal::scalar_kernel(w.type);
  if (is_quantized(w.type)) prepare_quantized_acts(w, x, num_tokens, isa, pool, job);
  if (rounds_acts_to_bf16(w.type)) {
    const int64_t stride = internal::bf16_act_stride(w.cols);
    auto* xh = static_cast<uint16_t*>(
        pool.workspace(0, static_cast<size_t>(num_tokens * stride) * sizeof(uint16_t)));
    internal::round_acts_bf16_avx512(x, num_tokens, w.cols, stride, xh);
    job.args.xh = xh;
    job.args.xh_stride = stride;
    job.kernel = internal::bf16_rows_avx512;
  } else if (isa >= Isa::kAvx512 && has_native_kernels(w.type) && !is_quantized(w.type)) {
    job.kernel = internal::avx512_float_kernel(w.type);
    if (num_tokens >= 2 && num_tokens <= 2 * internal::kMaxStationaryTokens) {
      const int64_t steps = (w.cols + 15) / 16;
      auto* xb = static_cast<float*>(
          pool.workspace(0, static_cast<size_t>(steps * num_tokens * 16) * sizeof(float)));
      internal::pack_x_blocked(x, num_tokens, w.cols, xb);
      job.args.xb = xb;
    }
  }
  if (pool.num_threads() == 1 || w.rows * w.cols * num_tokens < kMinParallelMacs) {
    job.kernel(job.args, 0, w.rows);
    return;
  }
  // About four chunks per thread, claimed dynamically: a thread that the OS preempts (or that
  // runs slower) leaves its remaining chunks to the others instead of stalling the call. Each
  // chunk is still a long contiguous run of rows, so weight reads stay sequential.
  const int64_t tile = internal::kRowTile;
  const int64_t groups = (w.rows + tile - 1) / tile;
  const int64_t grain = std::max<int64_t>(1, groups / (kChunksPerThread * pool.num_threads()));
  pool.parallel_for(
      groups,
      [&job, tile](int64_t begin, int64_t end, int) {
        job.kernel(job.args, begin * tile, std::min(job.args.w->rows, end * tile));
      },
      grain);
}

void matmul_multi(std::span<const WeightView* const> ws, const float* x, std::span<float* const> ys,
                  int64_t num_tokens, ThreadPool& pool) {
  ARBOR_CHECK_EQ(ws.size(), ys.size());
  if (ws.empty() || num_tokens <= 0) return;
  const Isa isa = active_isa();
  bool fused = ws.size() <= 8;
  for (const WeightView* w : ws) {
    check_view(*w);
    fused = fused && !g_affine_reference.load(std::memory_order_relaxed) &&
            uses_packed(*w, isa) && w->type == ws[0]->type && w->cols == ws[0]->cols &&
            w->rows > 0;
  }
  if (fused) {
    matmul_packed(ws, x, ys, num_tokens, pool);
    return;
  }
  for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, ys[i], num_tokens, pool);
}

void matmul_segments(std::span<const WeightView* const> segs, const float* x,
                     std::span<float* const> ys, int64_t num_tokens, ThreadPool& pool) {
  ARBOR_CHECK_EQ(segs.size(), ys.size());
  if (segs.empty() || num_tokens <= 0) return;
  const WeightView& w0 = *segs[0];
  const Isa isa = active_isa();
  bool fused = segs.size() <= 8 && w0.rows > 0;
  for (const WeightView* w : segs) {
    check_view(*w);
    ARBOR_CHECK(w->type == w0.type && w->rows == w0.rows && w->cols == w0.cols)
        << "segments of one matrix differ: " << w->rows << " x " << w->cols << " "
        << ggml_type_name(w->type) << " vs " << w0.rows << " x " << w0.cols << " "
        << ggml_type_name(w0.type);
    fused = fused && internal::takes_packed_path(*w, isa);
  }
  if (fused) {
    matmul_packed(segs, x, ys, num_tokens, pool, /*segments=*/true);
    return;
  }
  const int64_t cols = w0.cols, stride = cols * static_cast<int64_t>(segs.size());
  if (num_tokens == 1) {  // a segment's columns of one token are contiguous already
    for (size_t i = 0; i < segs.size(); ++i) matmul(*segs[i], x + i * cols, ys[i], 1, pool);
    return;
  }
  // Each segment's columns copied out ([num_tokens, cols]); matmul() uses the pool's workspace.
  thread_local std::vector<float> xs;
  xs.resize(static_cast<size_t>(num_tokens * cols));
  for (size_t i = 0; i < segs.size(); ++i) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::memcpy(xs.data() + t * cols, x + t * stride + i * cols,
                  static_cast<size_t>(cols) * sizeof(float));
    }
    matmul(*segs[i], xs.data(), ys[i], num_tokens, pool);
  }
}

void matmul_ref(const WeightView& w, const float* x, float* y, int64_t num_tokens) {
  check_view(w);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w, r, row.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

namespace {

void affine_ref(const WeightView& w, const float* x, float* y, int64_t num_tokens) {
  const internal::AffineFormat f = internal::affine_format(w.type);
  const int64_t nb = w.cols / kQBlock;
  std::vector<internal::ActBlockAffine> acts(static_cast<size_t>(num_tokens * nb));
  for (int64_t t = 0; t < num_tokens; ++t) {
    internal::pack_act_row_affine(x + t * w.cols, w.cols, f, acts.data() + t * nb, 1, false);
  }
  internal::AffineBlock blk;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        internal::decode_affine_block(w.type, row_ptr(w, r), b, &blk);
        acc += internal::affine_block_ref(f, blk, acts[t * nb + b]);
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace

void matmul_ref_quantized_act(const WeightView& w, const float* x, float* y, int64_t num_tokens) {
  check_view(w);
  if (internal::is_affine_type(w.type)) {
    affine_ref(w, x, y, num_tokens);
    return;
  }
  if (rounds_acts_to_bf16(w.type)) {
    std::vector<float> xr(x, x + num_tokens * w.cols);
    for (float& v : xr) v = round_to_bf16(v);
    matmul_ref(w, xr.data(), y, num_tokens);
    return;
  }
  if (!is_quantized(w.type)) {
    matmul_ref(w, x, y, num_tokens);
    return;
  }
  const int64_t nb = w.cols / kQBlock;
  std::vector<int8_t> qs(static_cast<size_t>(num_tokens * w.cols));
  std::vector<float> d(static_cast<size_t>(num_tokens * nb));
  for (int64_t t = 0; t < num_tokens; ++t) {
    internal::quantize_act_row_scalar(x + t * w.cols, w.cols, qs.data() + t * w.cols,
                                      d.data() + t * nb);
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = row_ptr(w, r);
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        // The kernels form the block scale as an f32 product; so does the reference.
        const float scale = block_scale(w, row, b) * d[t * nb + b];
        const int32_t dot = block_dot(w, row, b, qs.data() + t * w.cols + b * kQBlock);
        acc += static_cast<double>(dot) * static_cast<double>(scale);
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

void get_row(const WeightView& w, int64_t id, float* out) {
  check_view(w);
  ARBOR_CHECK(id >= 0 && id < w.rows) << "row " << id << " of " << w.rows;
  dequantize_row(w, id, out);
}

}  // namespace arbor::kernels
