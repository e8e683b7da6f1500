#include "kernels/experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops.h"
#include "kernels/packed_affine.h"

namespace arbor::kernels {
namespace {

using gguf::GgmlType;
using internal::kQBlock;

constexpr size_t kMaxMats = 4;
// A unit's cost is groups x (pairs + kWeightCost): streaming a 16-row group's weights costs
// about as much as multiplying it with a couple of tokens, so an expert with one pair (decode)
// still counts its weight reads.
constexpr int64_t kWeightCost = 2;

// The expert whose range holds pair p.
int32_t expert_of(const ExpertRows& r, int32_t p) {
  const int32_t* end = r.expert_indptr + r.num_experts + 1;
  return static_cast<int32_t>(std::upper_bound(r.expert_indptr, end, p) - r.expert_indptr) - 1;
}

int32_t pairs_of(const ExpertRows& r, int32_t e) {
  return r.expert_indptr[e + 1] - r.expert_indptr[e];
}

void check_args(std::span<const ExpertMatmul> mats, const ExpertRows& r) {
  ARBOR_CHECK(!mats.empty() && mats.size() <= kMaxMats) << mats.size() << " matrix sets";
  ARBOR_CHECK(r.num_experts > 0 && r.expert_indptr != nullptr && r.expert_indptr[0] == 0);
  for (int32_t e = 0; e < r.num_experts; ++e) {
    ARBOR_CHECK_LE(r.expert_indptr[e], r.expert_indptr[e + 1]) << "expert " << e;
  }
  const WeightView& w0 = mats[0].experts[0];
  for (const ExpertMatmul& m : mats) {
    ARBOR_CHECK_EQ(static_cast<int64_t>(m.experts.size()), r.num_experts);
    for (const WeightView& w : m.experts) {
      ARBOR_CHECK(w.cols == w0.cols && w.type == m.experts[0].type && w.rows == m.experts[0].rows)
          << "the experts of one set must share type and shape";
    }
  }
}

// One work unit: row groups [g0, g1) of expert `expert` of matrix set `mat`.
struct Unit {
  int32_t mat;
  int32_t expert;
  int64_t g0, g1;
};

// Cuts every (set, expert with pairs) into units of about equal cost (see kWeightCost).
void plan_units(std::span<const ExpertMatmul> mats, const ExpertRows& r, int threads,
                std::vector<Unit>& units) {
  units.clear();
  auto groups_of = [](const WeightView& w) {
    return (w.rows + internal::kPackRows - 1) / internal::kPackRows;
  };
  int64_t total = 0;
  for (const ExpertMatmul& m : mats) {
    for (int32_t e = 0; e < r.num_experts; ++e) {
      const int32_t n = pairs_of(r, e);
      if (n > 0) total += groups_of(m.experts[e]) * (n + kWeightCost);
    }
  }
  const int64_t target = std::max<int64_t>(1, total / (internal::kChunksPerThread * threads));
  for (size_t mi = 0; mi < mats.size(); ++mi) {
    for (int32_t e = 0; e < r.num_experts; ++e) {
      const int32_t n = pairs_of(r, e);
      if (n == 0) continue;
      const int64_t groups = groups_of(mats[mi].experts[e]);
      const int64_t per = std::max<int64_t>(1, target / (n + kWeightCost));
      for (int64_t g = 0; g < groups; g += per) {
        units.push_back({static_cast<int32_t>(mi), e, g, std::min(groups, g + per)});
      }
    }
  }
}

// Quantises every pair's activations into acts: expert e's pairs as [cols / 32, n_e] records
// (block-major, the packed kernels' layout) at acts + expert_indptr[e] * (cols / 32).
template <class Act, class Pack>
void pack_pair_acts(const float* x, const ExpertRows& r, int64_t cols, Act* acts,
                    ThreadPool& pool, const Pack& pack) {
  const int64_t nb = cols / kQBlock;
  const int32_t n = r.num_pairs();
  auto one = [&](int32_t p) {
    const int32_t e = expert_of(r, p);
    const int32_t first = r.expert_indptr[e];
    const int64_t src = r.src_rows != nullptr ? r.src_rows[p] : p;
    pack(x + src * cols, acts + first * nb + (p - first), pairs_of(r, e));
  };
  if (n < 2 * pool.num_threads() || n * cols < internal::kMinParallelMacs) {
    for (int32_t p = 0; p < n; ++p) one(p);
    return;
  }
  pool.parallel_for(n, [&one](int64_t begin, int64_t end, int) {
    for (int64_t p = begin; p < end; ++p) one(static_cast<int32_t>(p));
  });
}

// Quantises expert e's pairs into acts (the layout of pack_pair_acts) on the calling thread.
template <class Act, class Pack>
void pack_expert_acts(const float* x, const ExpertRows& r, int64_t cols, int32_t e, Act* acts,
                      const Pack& pack) {
  const int64_t nb = cols / kQBlock;
  const int32_t first = r.expert_indptr[e], n = pairs_of(r, e);
  for (int32_t p = first; p < first + n; ++p) {
    const int64_t src = r.src_rows != nullptr ? r.src_rows[p] : p;
    pack(x + src * cols, acts + first * nb + (p - first), n);
  }
}

// Steps of up to this many pairs quantise per thread: each thread quantises the pairs of an
// expert into its own records (pool slot 1 + thread) when it first takes a unit of that expert,
// so no record crosses between cores (matmul.cc, kLocalActsTokens, has the measurements) and a
// decode step's few pairs are quantised inside the job by both threads rather than before it by
// the caller alone. Larger steps (prefill) quantise once, split by pair, and share the records.
constexpr int32_t kLocalActsPairs = 128;

// Runs every unit: rows(w, acts of its expert, n_e, y of its expert, g0, g1), the activations
// quantised by pack (pack_pair_acts' callback).
template <class Act, class Pack, class Rows>
void run_units(std::span<const ExpertMatmul> mats, const float* x, const ExpertRows& r,
               ThreadPool& pool, const Pack& pack, const Rows& rows) {
  const WeightView& w0 = mats[0].experts[0];
  const int64_t cols = w0.cols, nb = cols / kQBlock;
  const size_t bytes = static_cast<size_t>(r.num_pairs()) * nb * sizeof(Act);
  // The caller's lists (a thread_local named inside the lambda would be each worker's own).
  thread_local std::vector<Unit> caller_units;
  thread_local std::vector<uint8_t> caller_packed;  // [threads, experts]: this call packed it
  std::vector<Unit>& units = caller_units;
  plan_units(mats, r, pool.num_threads(), units);
  const bool local = pool.num_threads() > 1 && r.num_pairs() <= kLocalActsPairs;
  Act* shared = nullptr;
  std::vector<uint8_t>& packed = caller_packed;
  if (local) {
    packed.assign(static_cast<size_t>(pool.num_threads()) * r.num_experts, 0);
  } else {
    shared = static_cast<Act*>(pool.workspace(0, bytes));
    pack_pair_acts(x, r, cols, shared, pool, pack);
  }
  auto run = [&](int64_t begin, int64_t end, int thread) {
    Act* acts = shared;
    if (local) acts = static_cast<Act*>(pool.workspace(1 + thread, bytes));
    for (int64_t i = begin; i < end; ++i) {
      const Unit& u = units[i];
      if (local) {
        uint8_t& done = packed[static_cast<size_t>(thread) * r.num_experts + u.expert];
        if (!done) {
          pack_expert_acts(x, r, cols, u.expert, acts, pack);
          done = 1;
        }
      }
      const WeightView& w = mats[u.mat].experts[u.expert];
      const int32_t first = r.expert_indptr[u.expert];
      rows(w, acts + first * nb, pairs_of(r, u.expert), mats[u.mat].y + first * w.rows, u.g0,
           u.g1);
    }
  };
  int64_t macs = 0;
  for (const ExpertMatmul& m : mats) macs += m.experts[0].rows * w0.cols * r.num_pairs();
  const int64_t num_units = static_cast<int64_t>(units.size());
  if (pool.num_threads() == 1 || macs < internal::kMinParallelMacs) {
    run(0, num_units, 0);
    return;
  }
  pool.parallel_for(
      num_units, [&run](int64_t begin, int64_t end, int thread) { run(begin, end, thread); }, 1);
}

void matmul_experts_packed(std::span<const ExpertMatmul> mats, const float* x,
                           const ExpertRows& r, ThreadPool& pool) {
  const WeightView& w0 = mats[0].experts[0];
  const int64_t cols = w0.cols;
  if (internal::is_affine_type(w0.type)) {
    const internal::AffineFormat f = internal::affine_format(w0.type);
    run_units<internal::ActBlockAffine>(
        mats, x, r, pool,
        [&](const float* row, internal::ActBlockAffine* out, int64_t stride) {
          internal::pack_act_row_affine(row, cols, f, out, stride, /*avx2=*/true);
        },
        active_isa() >= Isa::kAvx512 ? internal::affine_rows_avx512
        : cpu_features().avxvnni     ? internal::affine_rows_avxvnni
                                     : internal::affine_rows_avx2);
    return;
  }
  const int32_t k = w0.type == GgmlType::kQ4_0 ? 8 : 128;
  run_units<internal::ActBlockVnni>(
      mats, x, r, pool,
      [&](const float* row, internal::ActBlockVnni* out, int64_t stride) {
        internal::pack_act_row_vnni(row, cols, k, out, stride);
      },
      internal::packed_rows_avx512);
}

// Types without a packed kernel: the pairs' rows gathered, then one matmul_multi per expert.
void matmul_experts_each(std::span<const ExpertMatmul> mats, const float* x, const ExpertRows& r,
                         ThreadPool& pool) {
  const int64_t cols = mats[0].experts[0].cols;
  const int32_t n = r.num_pairs();
  thread_local std::vector<float> gathered;
  const float* xs = x;
  if (r.src_rows != nullptr) {
    gathered.resize(static_cast<size_t>(n) * cols);
    for (int32_t p = 0; p < n; ++p) {
      std::memcpy(gathered.data() + static_cast<size_t>(p) * cols,
                  x + static_cast<int64_t>(r.src_rows[p]) * cols, cols * sizeof(float));
    }
    xs = gathered.data();
  }
  const WeightView* ws[kMaxMats];
  float* ys[kMaxMats];
  for (int32_t e = 0; e < r.num_experts; ++e) {
    const int32_t first = r.expert_indptr[e], count = pairs_of(r, e);
    if (count == 0) continue;
    for (size_t m = 0; m < mats.size(); ++m) {
      ws[m] = &mats[m].experts[e];
      ys[m] = mats[m].y + static_cast<int64_t>(first) * ws[m]->rows;
    }
    matmul_multi(std::span(ws, mats.size()), xs + static_cast<int64_t>(first) * cols,
                 std::span(ys, mats.size()), count, pool);
  }
}

}  // namespace

void route_softmax_top_k(const float* logits, int num_experts, int k, int32_t* ids,
                         float* weights, bool renormalize) {
  ARBOR_CHECK(k >= 1 && k <= num_experts) << "top-" << k << " of " << num_experts;
  float max = logits[0];
  for (int e = 1; e < num_experts; ++e) max = std::max(max, logits[e]);
  // Selection: k passes, each taking the largest logit not yet chosen (softmax is monotonic, so
  // this ranks p; strict > keeps the lower id on ties and never prefers a NaN).
  uint64_t chosen[8] = {};  // a bit per expert, up to 512
  ARBOR_CHECK_LE(num_experts, 512);
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < num_experts; ++e) {
      if ((chosen[e >> 6] >> (e & 63)) & 1) continue;
      if (best < 0 || logits[e] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[e]))) {
        best = e;
      }
    }
    chosen[best >> 6] |= uint64_t{1} << (best & 63);
    ids[j] = best;
    weights[j] = std::exp(logits[best] - max);
  }
  // The renormalised probabilities as a softmax over the chosen: the full softmax's sum cancels,
  // and leaving it out keeps the weights independent of the other experts' order (permuting
  // the experts changes no bit). llama.cpp's clamp of the chosen probabilities' sum at 2^-14
  // never applies: the k largest of E probabilities sum to at least k / E >= 1 / 512.
  float total = 0.0f;
  if (renormalize) {
    for (int j = 0; j < k; ++j) total += weights[j];
  } else {
    for (int e = 0; e < num_experts; ++e) total += std::exp(logits[e] - max);
  }
  for (int j = 0; j < k; ++j) weights[j] /= total;
}

void sort_pairs_by_expert(const int32_t* ids, int32_t num_tokens, int k, int num_experts,
                          int32_t* expert_indptr, int32_t* pair_token, int32_t* slot_pair) {
  const int64_t n = static_cast<int64_t>(num_tokens) * k;
  std::fill(expert_indptr, expert_indptr + num_experts + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    ARBOR_CHECK(ids[i] >= 0 && ids[i] < num_experts) << "expert " << ids[i];
    ++expert_indptr[ids[i] + 1];
  }
  for (int e = 0; e < num_experts; ++e) expert_indptr[e + 1] += expert_indptr[e];
  // expert_indptr[e] serves as expert e's next free position, then is restored.
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = expert_indptr[ids[i]]++;
    pair_token[pos] = static_cast<int32_t>(i / k);
    slot_pair[i] = pos;
  }
  for (int e = num_experts; e > 0; --e) expert_indptr[e] = expert_indptr[e - 1];
  expert_indptr[0] = 0;
}

void add_expert_bias(float* y, const ExpertRows& rows, const float* bias, int cols,
                     ThreadPool& pool) {
  const int32_t n = rows.num_pairs();
  auto add = [&](int64_t begin, int64_t end, int) {
    int32_t e = expert_of(rows, static_cast<int32_t>(begin));
    for (int64_t p = begin; p < end; ++p) {
      while (p >= rows.expert_indptr[e + 1]) ++e;
      kernels::add(y + p * cols, bias + static_cast<int64_t>(e) * cols, cols);  // vectorised
    }
  };
  if (n < 2 * pool.num_threads()) {
    add(0, n, 0);
  } else {
    pool.parallel_for(n, add);
  }
}

void matmul_experts(std::span<const ExpertMatmul> mats, const float* x, const ExpertRows& rows,
                    ThreadPool& pool) {
  check_args(mats, rows);
  if (rows.num_pairs() == 0) return;
  const Isa isa = active_isa();
  bool packed = true;
  for (const ExpertMatmul& m : mats) {
    for (const WeightView& w : m.experts) {
      packed = packed && internal::takes_packed_path(w, isa) && w.type == mats[0].experts[0].type;
    }
  }
  if (packed) {
    matmul_experts_packed(mats, x, rows, pool);
  } else {
    matmul_experts_each(mats, x, rows, pool);
  }
}

}  // namespace arbor::kernels
