// The GPU matmul's tensor-core kernel for the affine weight types (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K): int8 MMAs of the weights' quants against the activations quantised per
// block of 32 as for Q8_0, then per block the f32 step of the CPU's affine kernels. Layout,
// launch shape and why every output is batch invariant: docs/cuda.md, "Matmul".
//
// The shape is mma_quant_kernel's (matmul_mma.cu): a block computes 16 rows (blockIdx.y) for
// NT * 8 tokens (blockIdx.x), warp s walks K slice s of slice_plan(cols) chunk by chunk (a chunk
// is 32 columns: one block of activations; a K-quant super-block is 8 chunks), lane l = 4 g + q
// holds rows g and g + 8 and token column g. Per chunk b the lane decodes, with
// cuda/ggml_dequant.h, the runs at columns 32 b + 4 q (logical k 4 q..) and 32 b + 16 + 4 q
// (k 16 + 4 q..) of both rows: their v (int8) are the A fragment, their S and M stay in
// registers. A split type (sub-blocks of 16: Q2_K, Q3_K, Q6_K) takes two m16n8k16 MMAs, one per
// half; the others one m16n8k32. The exact int32 dots then enter ggml::affine_step, the f32
// operations of kernels::internal::affine_block_step, with the token's ggml::ActSums; the
// K-quants' activations share one scale per super-block, which multiplies the super-block's
// partial sum at its last chunk (ggml::affine_unit_end), as the CPU kernels do.
#include <cuda_runtime.h>

#include <cstdint>

#include "base/check.h"
#include "cuda/ggml_dequant.h"
#include "cuda/matmul_device.cuh"
#include "cuda/matmul_internal.cuh"

namespace arbor::cuda::internal {
namespace {

using gguf::GgmlType;

constexpr int kMaxThreads = kMaxSlices * 32;
// Chunks whose weights a warp decodes before computing on them: 2 for the multi-token instances
// (a group is then an aligned pair of chunks: Q4_K / Q5_K read the bytes holding both nibbles
// of the pair once from DRAM, the second load hits L1), 1 for decode (NT = 1): with 2 the
// decoding's loads of the K-quants spill at the 64 registers that two blocks of 512 threads per
// SM allow (ptxas -v, sm_90a), and two resident blocks (32 warps, 1 chunk each) keep as many
// bytes in flight as one block with 2. Divides kUnroll, so slices hold whole groups.
template <int NT>
constexpr int kAffineUnroll = NT == 1 ? 1 : 2;
static_assert(kUnroll % kAffineUnroll<1> == 0 && kUnroll % kAffineUnroll<2> == 0);

// One row's share of chunk b for lane q: v of the runs at 4q (lo) and 16 + 4q (hi) and their
// sub-blocks' S and M (for a type that is not split, hi's are lo's). Zeros for a missing row.
struct AffineFrag {
  ggml::WeightRun lo, hi;
};

template <GgmlType T>
__device__ __forceinline__ AffineFrag load_affine_frag(const uint8_t* row, bool ok, int b, int q) {
  constexpr bool kSplit = ggml::affine_traits(T).split;
  AffineFrag f;
  if (!ok) return f;
  const int32_t col = b * kChunk + 4 * q;
  f.lo = ggml::decode_run<T>(row, col);
  f.hi = ggml::decode_run<T, kSplit>(row, col + 16);
  if constexpr (!kSplit) {
    f.hi.scale = f.lo.scale;
    f.hi.offset = f.lo.offset;
  }
  return f;
}

// The fields of a token's ActSums that affine_step<T> reads (loaded one by one: fewer registers
// than a 16-byte load, which keeps the decode instances within 64); zeros for a padding token.
template <GgmlType T>
__device__ __forceinline__ ggml::ActSums load_sums(const ggml::ActSums* p, bool ok) {
  constexpr ggml::AffineTraits kT = ggml::affine_traits(T);
  ggml::ActSums s;
  if (!ok) return s;
  s.d = __ldg(&p->d);
  if constexpr (kT.has_min && kT.split) {
    s.msum0 = __ldg(&p->msum0);
    s.msum1 = __ldg(&p->msum1);
  } else if constexpr (kT.has_min) {
    s.msum = __ldg(&p->msum);
  }
  return s;
}

// The four (row, token) sums of a lane for chunk b: rows g (fa) and g + 8 (fb) x tokens s0, s1.
template <GgmlType T>
__device__ __forceinline__ void affine_steps(const int32_t (&lo)[4], const int32_t (&hi)[4],
                                             const AffineFrag& fa, const AffineFrag& fb,
                                             const ggml::ActSums& s0, const ggml::ActSums& s1,
                                             float (&sum)[4]) {
  sum[0] = ggml::affine_step<T>(lo[0], hi[0], fa.lo, fa.hi, s0, sum[0]);
  sum[1] = ggml::affine_step<T>(lo[1], hi[1], fa.lo, fa.hi, s1, sum[1]);
  sum[2] = ggml::affine_step<T>(lo[2], hi[2], fb.lo, fb.hi, s0, sum[2]);
  sum[3] = ggml::affine_step<T>(lo[3], hi[3], fb.lo, fb.hi, s1, sum[3]);
}

template <GgmlType T, int NT>
__global__ void __launch_bounds__(kMaxThreads, NT == 1 ? 2 : 1) mma_affine_kernel(MmaArgs a) {
  constexpr bool kSplit = ggml::affine_traits(T).split;
  const int lane = static_cast<int>(threadIdx.x) & 31, slice = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.y) * kRowTile;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * NT * kTokTile;
  const int nb = a.cols / kChunk;
  const bool ok0 = tile_row0 + g < a.rows, ok1 = tile_row0 + g + 8 < a.rows;
  const uint8_t* w0 = a.w + (ok0 ? tile_row0 + g : 0) * a.row_stride;
  const uint8_t* w1 = a.w + (ok1 ? tile_row0 + g + 8 : 0) * a.row_stride;
  // B column g of token tile j: token tok0 + 8 j + g, valid for j < tok_tiles_g. C columns
  // 2q, 2q + 1: tokens tc + 8 j and tc + 8 j + 1, tc = tok0 + 2q.
  const int tok_tiles_g =
      static_cast<int>(min64(NT, (a.num_tokens - tok0 - g + kTokTile - 1) / kTokTile));
  const int8_t* xrow0 =
      static_cast<const int8_t*>(a.acts) + (tok0 + min64(g, a.num_tokens - 1 - tok0)) * a.cols;
  const int64_t tc = tok0 + 2 * q;
  const int tok_left = static_cast<int>(min64(a.num_tokens - tc, NT * kTokTile));
  const ggml::ActSums* xs = a.act_sums + min64(tc, a.num_tokens - 1) * nb;
  // The K-quants sum a super-block's chunks into part, which the activations' super-block
  // scale multiplies at its last chunk (slice_plan keeps slices whole super-blocks); the other
  // types add every chunk to acc itself.
  constexpr bool kPerUnit = ggml::scales_per_unit(ggml::affine_traits(T));
  float acc[NT][4], part[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = part[j][e] = 0.0f;
  }

  const int c_begin = slice * a.plan.chunks_per_slice;
  const int c_end = min(c_begin + a.plan.chunks_per_slice, a.plan.chunks);
  constexpr int kU = kAffineUnroll<NT>;
  for (int c = c_begin; c < c_end; c += kU) {
    AffineFrag fa[kU], fb[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // all loads first: the group's chunks in flight
      const bool in = c + u < c_end;
      fa[u] = load_affine_frag<T>(w0, ok0 && in, c + u, q);
      fb[u] = load_affine_frag<T>(w1, ok1 && in, c + u, q);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int b = c + u;
      if (b >= c_end) break;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int8_t* xb = xrow0 + j * kTokTile * a.cols + b * kChunk + 4 * q;
        const bool tok_ok = j < tok_tiles_g;
        const uint32_t b0 = tok_ok ? __ldg(reinterpret_cast<const uint32_t*>(xb)) : 0u;
        const uint32_t b1 = tok_ok ? __ldg(reinterpret_cast<const uint32_t*>(xb + 16)) : 0u;
        // lo / hi: the dots of columns 0..15 / 16..31 (split); else lo is the whole block's.
        int32_t lo[4], hi[4] = {0, 0, 0, 0};
        if constexpr (kSplit) {
          mma_16816_s8(lo, fa[u].lo.q, fb[u].lo.q, b0);
          mma_16816_s8(hi, fa[u].hi.q, fb[u].hi.q, b1);
        } else {
          mma_16832_s8(lo, fa[u].lo.q, fb[u].lo.q, fa[u].hi.q, fb[u].hi.q, b0, b1);
        }
        const ggml::ActSums* xsj = xs + j * kTokTile * nb + b;
        const ggml::ActSums s0 = load_sums<T>(xsj, j * kTokTile < tok_left);
        const ggml::ActSums s1 = load_sums<T>(xsj + nb, j * kTokTile + 1 < tok_left);
        if constexpr (kPerUnit) {
          affine_steps<T>(lo, hi, fa[u], fb[u], s0, s1, part[j]);
        } else {
          affine_steps<T>(lo, hi, fa[u], fb[u], s0, s1, acc[j]);
        }
        if (kPerUnit && b % kUnitChunks == kUnitChunks - 1) {
          acc[j][0] = ggml::affine_unit_end(s0, part[j][0], acc[j][0]);
          acc[j][1] = ggml::affine_unit_end(s1, part[j][1], acc[j][1]);
          acc[j][2] = ggml::affine_unit_end(s0, part[j][2], acc[j][2]);
          acc[j][3] = ggml::affine_unit_end(s1, part[j][3], acc[j][3]);
          part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.0f;
        }
      }
    }
  }
  reduce_and_store<NT>(acc, a, tile_row0, tok0);
}

template <GgmlType T>
void launch_type(const MmaArgs& a, cudaStream_t stream) {
  const dim3 block(32 * a.plan.slices);
  auto grid = [&](int nt) {
    return dim3((a.num_tokens + nt * kTokTile - 1) / (nt * kTokTile),
                (a.rows + kRowTile - 1) / kRowTile);
  };
  switch (token_tiles(a.num_tokens)) {
    case 1:
      mma_affine_kernel<T, 1><<<grid(1), block, 0, stream>>>(a);
      break;
    case 2:
      mma_affine_kernel<T, 2><<<grid(2), block, 0, stream>>>(a);
      break;
    default:
      mma_affine_kernel<T, 4><<<grid(4), block, 0, stream>>>(a);
  }
  check_launch("mma_affine_kernel");
}

}  // namespace

void launch_affine(GgmlType type, const MmaArgs& a, cudaStream_t stream) {
  switch (type) {
    case GgmlType::kQ4_1:
      return launch_type<GgmlType::kQ4_1>(a, stream);
    case GgmlType::kQ5_0:
      return launch_type<GgmlType::kQ5_0>(a, stream);
    case GgmlType::kQ5_1:
      return launch_type<GgmlType::kQ5_1>(a, stream);
    case GgmlType::kQ2_K:
      return launch_type<GgmlType::kQ2_K>(a, stream);
    case GgmlType::kQ3_K:
      return launch_type<GgmlType::kQ3_K>(a, stream);
    case GgmlType::kQ4_K:
      return launch_type<GgmlType::kQ4_K>(a, stream);
    case GgmlType::kQ5_K:
      return launch_type<GgmlType::kQ5_K>(a, stream);
    case GgmlType::kQ6_K:
      return launch_type<GgmlType::kQ6_K>(a, stream);
    default:
      ARBOR_CHECK(false) << "no affine kernel for " << gguf::ggml_type_name(type);
  }
}

}  // namespace arbor::cuda::internal
