// Paged attention kernels (cuda/attention.h has the design and the invariance argument).
#include "cuda/attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.h"

namespace arbor::cuda {
namespace {

constexpr int kWarps = 4;      // per block
constexpr int kThreads = kWarps * 32;
constexpr int kKeyTile = 32;   // keys per online-softmax step: one per lane for the scores
constexpr int kChunkKeys = 512;
constexpr float kNegInf = -INFINITY;

int32_t chunk_keys(int block_size) { return std::max(1, kChunkKeys / block_size) * block_size; }

// Dynamic shared memory of a block, carved in this order (floats, then ints).
struct SharedLayout {
  int head_dim, rows;  // rows = query heads per kv head
  __host__ __device__ int kv_stride() const { return head_dim + 1; }  // padded: no bank conflicts
  __host__ __device__ size_t floats() const {
    return 2 * (size_t)kKeyTile * kv_stride()   // K and V tiles, widened
           + 3 * (size_t)rows * head_dim        // q, acc (this chunk), facc (folded chunks)
           + 4 * (size_t)rows                   // m, l, fm, fl
           + (size_t)kWarps * kKeyTile;         // each warp's softmax weights of the tile
  }
  __host__ __device__ size_t bytes() const { return floats() * 4 + (kKeyTile + 2) * 4; }
};

struct Shared {
  float *kt, *vt, *q, *acc, *facc, *m, *l, *fm, *fl, *pw;
  int* phys;   // [kKeyTile] cache position of each key of the tile
  int* misc;   // [0]: the row's key count `end`
};

__device__ Shared carve(float* base, const SharedLayout& lay) {
  Shared s;
  const int tile = kKeyTile * lay.kv_stride(), rd = lay.rows * lay.head_dim;
  s.kt = base;
  s.vt = s.kt + tile;
  s.q = s.vt + tile;
  s.acc = s.q + rd;
  s.facc = s.acc + rd;
  s.m = s.facc + rd;
  s.l = s.m + lay.rows;
  s.fm = s.l + lay.rows;
  s.fl = s.fm + lay.rows;
  s.pw = s.fl + lay.rows;
  s.phys = reinterpret_cast<int*>(s.pw + kWarps * kKeyTile);
  s.misc = s.phys + kKeyTile;
  return s;
}

__device__ __forceinline__ bool mask_bit(const uint8_t* bits, int64_t offset, int n, int i,
                                         int j) {
  const int64_t bit = offset + (int64_t)i * n + j;
  return (bits[bit >> 3] >> (bit & 7)) & 1;
}

// Where query token t sits: sequence b, new token i of n, and its logical key count.
struct RowGeometry {
  int b, i, n, committed, end;
  bool masked;
  int64_t mask_offset;
};

// Largest b in [0, B) with qo_indptr[b] <= t (skips empty sequences, whose start repeats).
__device__ int sequence_of(const int32_t* qo_indptr, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qo_indptr[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Warp-wide count of the set bits of mask row i (every lane returns it).
__device__ int count_visible(const uint8_t* bits, int64_t off, int n, int i, int lane) {
  int count = 0;
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int j = j0 + lane;
    count += __popc(__ballot_sync(0xffffffffu, j < n && mask_bit(bits, off, n, i, j)));
  }
  return count;
}

// Warp-wide: from bit `cursor` of mask row i on, takes the next `count` set bits j and writes
// committed + j to out[0, count) (when out is not null). Returns the bit after the last one
// taken (or past n). Every lane returns the same cursor.
__device__ int scan_visible(const uint8_t* bits, int64_t off, int n, int i, int cursor, int count,
                            int committed, int* out, int lane) {
  int got = 0;
  while (got < count && cursor < n) {
    const int j = cursor + lane;
    const bool v = j < n && mask_bit(bits, off, n, i, j);
    const unsigned bal = __ballot_sync(0xffffffffu, v);
    const int avail = __popc(bal);
    const int take = min(avail, count - got);
    const int rank = __popc(bal & ((1u << lane) - 1u));
    if (v && rank < take && out != nullptr) out[got + rank] = committed + j;
    if (take < avail) {  // stopped inside this word: resume after the take-th set bit
      unsigned rest = bal;
      for (int k = 0; k < take - 1; ++k) rest &= rest - 1u;
      cursor += __ffs(rest);  // 1-based position of that bit
    } else {
      cursor += 32;
    }
    got += take;
  }
  return cursor;
}

__device__ __forceinline__ float load_kv(const void* cache, int64_t idx, bool f16) {
  return f16 ? __half2float(static_cast<const __half*>(cache)[idx])
             : static_cast<const float*>(cache)[idx];
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Xor butterfly: each level adds a pair in either order, which is the same float, so every lane
// ends with the same bits, and they depend only on the 32 inputs by lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// One online-softmax step of one row (warp-wide) over the tile's nk keys (kt / vt rows 0..nk).
// q: [hd]; acc: [hd]; m, l: the row's running max and sum (shared); pw: this warp's [kKeyTile].
__device__ void tile_step(const float* q, const float* kt, const float* vt, int stride, int nk,
                          int hd, float scale, float* m, float* l, float* acc, float* pw,
                          int lane) {
  float s = kNegInf;
  if (lane < nk) {
    const float* k = kt + lane * stride;
    float dot = 0.0f;
    for (int d = 0; d < hd; ++d) dot = __fmaf_rn(q[d], k[d], dot);
    s = __fmul_rn(dot, scale);
  }
  const float m_old = *m, l_old = *l;
  const float m_new = fmaxf(m_old, warp_max(s));
  const float corr = m_old == kNegInf ? 0.0f : expf(__fsub_rn(m_old, m_new));
  const float p = lane < nk ? expf(__fsub_rn(s, m_new)) : 0.0f;
  const float l_new = __fadd_rn(__fmul_rn(l_old, corr), warp_sum(p));
  pw[lane] = p;
  __syncwarp();
  for (int d = lane; d < hd; d += 32) {
    float a = __fmul_rn(acc[d], corr);
    for (int j = 0; j < nk; ++j) a = __fmaf_rn(pw[j], vt[j * stride + d], a);
    acc[d] = a;
  }
  __syncwarp();
  if (lane == 0) {
    *m = m_new;
    *l = l_new;
  }
  __syncwarp();
}

// Folds one chunk's (m, l, acc) into (fm, fl, facc) (fm = -inf: nothing folded yet), warp-wide,
// lanes over dimensions: the CPU's fold_partial. Used in-block and by the merge kernel alike.
__device__ void fold_chunk(float m, float l, const float* acc, float* fm, float* fl, float* facc,
                           int hd, int lane) {
  const float fm_old = *fm, fl_old = *fl;
  __syncwarp();
  if (m == kNegInf) return;
  if (fm_old == kNegInf) {
    for (int d = lane; d < hd; d += 32) facc[d] = acc[d];
    if (lane == 0) {
      *fm = m;
      *fl = l;
    }
  } else {
    const float m_new = fmaxf(fm_old, m);
    const float a = expf(__fsub_rn(fm_old, m_new)), c = expf(__fsub_rn(m, m_new));
    for (int d = lane; d < hd; d += 32) {
      facc[d] = __fadd_rn(__fmul_rn(facc[d], a), __fmul_rn(acc[d], c));
    }
    if (lane == 0) {
      *fm = m_new;
      *fl = __fadd_rn(__fmul_rn(fl_old, a), __fmul_rn(l, c));
    }
  }
  __syncwarp();
}

// out = acc / l, zeros for a row that saw no key.
__device__ void write_out(float l, const float* acc, float* out, int hd, int lane) {
  const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
  for (int d = lane; d < hd; d += 32) out[d] = __fmul_rn(acc[d], inv);
}

__device__ RowGeometry row_geometry(const kernels::PagedAttentionParams& p, int t, Shared sh,
                                    int lane, int warp) {
  RowGeometry r;
  r.b = sequence_of(p.qo_indptr, p.num_seqs, t);
  r.n = p.qo_indptr[r.b + 1] - p.qo_indptr[r.b];
  r.i = t - p.qo_indptr[r.b];
  r.committed = p.kv_len[r.b] - r.n;
  r.masked = p.mask_indptr != nullptr && p.mask_indptr[r.b + 1] > p.mask_indptr[r.b];
  r.mask_offset = r.masked ? p.mask_indptr[r.b] : 0;
  if (r.masked) {
    if (warp == 0) {
      const int count = count_visible(p.mask_bits, r.mask_offset, r.n, r.i, lane);
      if (lane == 0) sh.misc[0] = r.committed + count;
    }
    __syncthreads();
    r.end = sh.misc[0];
  } else {
    r.end = r.committed + r.i + 1;
  }
  return r;
}

struct KernelArgs {
  kernels::PagedAttentionParams p;
  SharedLayout lay;
  int32_t chunk;      // keys per chunk
  bool split;         // blockIdx.z is the chunk; partials go to the workspace
  float* partials;    // split: [T, num_q_heads, max_chunks, head_dim + 2] (m, l, acc)
  int32_t* nchunks;   // split: [T] chunks of token t's rows
  int32_t max_chunks;
  bool vector_loads;  // head_dim a multiple of 16 bytes' elements, both pools 16-byte aligned
};

__device__ __forceinline__ float half_bits_to_float(unsigned bits) {
  return __half2float(__ushort_as_half((unsigned short)bits));
}

// Element index of dimension 0 of the key at cache position `pos` of kv head g.
__device__ __forceinline__ int64_t key_index(const kernels::PagedAttentionParams& p,
                                             const int32_t* table, int g, int pos) {
  const int64_t block = table[pos / p.block_size];
  return ((block * p.num_kv_heads + g) * p.block_size + pos % p.block_size) * p.head_dim;
}

// sh.kt / sh.vt rows 0..nk = the K / V rows of the tile's keys (sh.phys), widened to f32.
// 16-byte loads (8 halves or 4 floats) where a.vector_loads, else one element per load.
__device__ __forceinline__ void load_tile(const KernelArgs& a, const int32_t* table, int g, int nk, Shared sh) {
  const kernels::PagedAttentionParams& p = a.p;
  const int hd = p.head_dim, stride = a.lay.kv_stride();
  const bool f16 = p.kv_dtype == kernels::KvDtype::kF16;
  if (!a.vector_loads) {
    for (int x = threadIdx.x; x < nk * hd; x += kThreads) {
      const int j = x / hd, d = x % hd;
      const int64_t idx = key_index(p, table, g, sh.phys[j]) + d;
      sh.kt[j * stride + d] = load_kv(p.k_cache, idx, f16);
      sh.vt[j * stride + d] = load_kv(p.v_cache, idx, f16);
    }
    return;
  }
  const int per_vec = f16 ? 8 : 4;
  const int vecs = hd / per_vec;  // per key row
  for (int x = threadIdx.x; x < nk * vecs; x += kThreads) {
    const int j = x / vecs, d0 = (x % vecs) * per_vec;
    const int64_t idx = key_index(p, table, g, sh.phys[j]) + d0;
    float* kd = sh.kt + j * stride + d0;
    float* vd = sh.vt + j * stride + d0;
    if (f16) {
      const uint4 kraw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(p.k_cache) + idx);
      const uint4 vraw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(p.v_cache) + idx);
      const unsigned kw[4] = {kraw.x, kraw.y, kraw.z, kraw.w};
      const unsigned vw[4] = {vraw.x, vraw.y, vraw.z, vraw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // element 2e in the low half of word e (little-endian)
        kd[2 * e] = half_bits_to_float(kw[e] & 0xffffu);
        kd[2 * e + 1] = half_bits_to_float(kw[e] >> 16);
        vd[2 * e] = half_bits_to_float(vw[e] & 0xffffu);
        vd[2 * e + 1] = half_bits_to_float(vw[e] >> 16);
      }
    } else {
      const float4 kf = *reinterpret_cast<const float4*>(static_cast<const float*>(p.k_cache) + idx);
      const float4 vf = *reinterpret_cast<const float4*>(static_cast<const float*>(p.v_cache) + idx);
      kd[0] = kf.x;
      kd[1] = kf.y;
      kd[2] = kf.z;
      kd[3] = kf.w;
      vd[0] = vf.x;
      vd[1] = vf.y;
      vd[2] = vf.z;
      vd[3] = vf.w;
    }
  }
}

// Runs keys [k0, k1) of one chunk for every row of the block into sh.m / sh.l / sh.acc.
__device__ void run_chunk(const KernelArgs& a, const RowGeometry& r, int g, int k0, int k1,
                          Shared sh, int lane, int warp) {
  const kernels::PagedAttentionParams& p = a.p;
  const int hd = p.head_dim, rows = a.lay.rows, stride = a.lay.kv_stride();
  const int32_t* table = p.kv_page_indices + p.kv_indptr[r.b];
  __syncthreads();  // every warp is done with the previous chunk's m / l / acc
  for (int x = threadIdx.x; x < rows * hd; x += kThreads) sh.acc[x] = 0.0f;
  for (int x = threadIdx.x; x < rows; x += kThreads) {
    sh.m[x] = kNegInf;
    sh.l[x] = 0.0f;
  }
  // Warp 0's cursor into mask row i: positioned at the chunk's first new-token key.
  int cursor = 0;
  if (r.masked && warp == 0 && k1 > r.committed) {
    const int tail0 = max(k0, r.committed);
    cursor = scan_visible(p.mask_bits, r.mask_offset, r.n, r.i, 0, tail0 - r.committed,
                          r.committed, nullptr, lane);
  }
  for (int kt0 = k0; kt0 < k1; kt0 += kKeyTile) {
    const int nk = min(kKeyTile, k1 - kt0);
    __syncthreads();  // the previous tile's readers are done with kt / vt / phys
    if (threadIdx.x < nk && (!r.masked || kt0 + (int)threadIdx.x < r.committed)) {
      sh.phys[threadIdx.x] = kt0 + threadIdx.x;
    }
    if (r.masked && warp == 0 && kt0 + nk > r.committed) {
      const int tail0 = max(kt0, r.committed);
      cursor = scan_visible(p.mask_bits, r.mask_offset, r.n, r.i, cursor, kt0 + nk - tail0,
                            r.committed, sh.phys + (tail0 - kt0), lane);
    }
    __syncthreads();
    load_tile(a, table, g, nk, sh);
    __syncthreads();
    for (int row = warp; row < rows; row += kWarps) {
      tile_step(sh.q + row * hd, sh.kt, sh.vt, stride, nk, hd, p.scale, sh.m + row, sh.l + row,
                sh.acc + row * hd, sh.pw + warp * kKeyTile, lane);
    }
  }
  __syncthreads();
}

// Launch: grid (T, num_kv_heads, split ? max_chunks : 1), kThreads threads, lay.bytes() of
// dynamic shared memory. Block (t, g, z) serves query heads g*r .. g*r + r-1 of token t, warp w
// the heads w, w + kWarps, ...
__global__ void __launch_bounds__(kThreads, 4) paged_attention_kernel(KernelArgs a) {
  extern __shared__ float smem[];
  const kernels::PagedAttentionParams& p = a.p;
  const Shared sh = carve(smem, a.lay);
  const int t = blockIdx.x, g = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hd = p.head_dim, rows = a.lay.rows;
  const RowGeometry r = row_geometry(p, t, sh, lane, warp);
  const int nchunks = (r.end + a.chunk - 1) / a.chunk;
  if (a.split && g == 0 && blockIdx.z == 0 && threadIdx.x == 0) a.nchunks[t] = nchunks;
  const int c_begin = a.split ? (int)blockIdx.z : 0;
  const int c_end = a.split ? min(nchunks, c_begin + 1) : nchunks;
  if (c_begin >= c_end && !(nchunks == 0 && c_begin == 0)) return;
  const int64_t q_row0 = (int64_t)t * p.num_q_heads + (int64_t)g * rows;
  for (int x = threadIdx.x; x < rows * hd; x += kThreads) sh.q[x] = p.q[q_row0 * hd + x];
  for (int x = threadIdx.x; x < rows; x += kThreads) {
    sh.fm[x] = kNegInf;
    sh.fl[x] = 0.0f;
  }
  for (int x = threadIdx.x; x < rows * hd; x += kThreads) sh.facc[x] = 0.0f;
  for (int c = c_begin; c < c_end; ++c) {
    run_chunk(a, r, g, c * a.chunk, min(r.end, (c + 1) * a.chunk), sh, lane, warp);
    for (int row = warp; row < rows; row += kWarps) {
      if (nchunks == 1) {  // the fold of one chunk is the chunk itself
        write_out(sh.l[row], sh.acc + row * hd, p.out + (q_row0 + row) * hd, hd, lane);
      } else if (a.split) {
        float* dst = a.partials + (((q_row0 + row) * a.max_chunks) + c) * (hd + 2);
        if (lane == 0) {
          dst[0] = sh.m[row];
          dst[1] = sh.l[row];
        }
        for (int d = lane; d < hd; d += 32) dst[2 + d] = sh.acc[row * hd + d];
      } else {
        fold_chunk(sh.m[row], sh.l[row], sh.acc + row * hd, sh.fm + row, sh.fl + row,
                   sh.facc + row * hd, hd, lane);
      }
    }
  }
  if (nchunks == 1 || (a.split && nchunks > 1)) return;
  // Several chunks folded here, or none (rows that see no key: zeros, from block z = 0 alone).
  __syncthreads();
  for (int row = warp; row < rows; row += kWarps) {
    write_out(sh.fl[row], sh.facc + row * hd, p.out + (q_row0 + row) * hd, hd, lane);
  }
}

// Launch: grid (T), kThreads threads; warp w folds the chunk partials of heads w, w + kWarps, ...
// of token t in chunk order and writes out. Tokens whose rows have one chunk were written by the
// attention kernel.
__global__ void __launch_bounds__(kThreads) merge_chunks_kernel(KernelArgs a) {
  __shared__ float facc[kWarps][512];
  __shared__ float fm[kWarps], fl[kWarps];
  const kernels::PagedAttentionParams& p = a.p;
  const int t = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int hd = p.head_dim, nchunks = a.nchunks[t];
  if (nchunks <= 1) return;
  for (int h = warp; h < p.num_q_heads; h += kWarps) {
    if (lane == 0) {
      fm[warp] = kNegInf;
      fl[warp] = 0.0f;
    }
    for (int d = lane; d < hd; d += 32) facc[warp][d] = 0.0f;
    __syncwarp();
    const int64_t row = (int64_t)t * p.num_q_heads + h;
    for (int c = 0; c < nchunks; ++c) {
      const float* src = a.partials + (row * a.max_chunks + c) * (hd + 2);
      fold_chunk(src[0], src[1], src + 2, &fm[warp], &fl[warp], facc[warp], hd, lane);
    }
    write_out(fl[warp], facc[warp], p.out + row * hd, hd, lane);
    __syncwarp();
  }
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

AttentionPlan plan_paged_attention(const kernels::PagedAttentionParams& p,
                                   const AttentionGeometry& g, int num_sms) {
  ARBOR_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0)
      << p.num_q_heads << " query heads, " << p.num_kv_heads << " kv heads";
  ARBOR_CHECK(p.head_dim > 0 && p.head_dim <= 512 && p.block_size > 0)
      << "head_dim " << p.head_dim << ", block_size " << p.block_size;
  AttentionPlan plan;
  const SharedLayout lay{p.head_dim, p.num_q_heads / p.num_kv_heads};
  plan.shared_bytes = lay.bytes();
  ARBOR_CHECK_LE(plan.shared_bytes, (size_t)227 * 1024)
      << "attention shared memory for head_dim " << p.head_dim << " and "
      << p.num_q_heads / p.num_kv_heads << " query heads per kv head";
  const int32_t chunk = chunk_keys(p.block_size);
  plan.max_chunks = (g.max_kv_len + chunk - 1) / chunk;
  const int64_t blocks = (int64_t)g.num_tokens * p.num_kv_heads;
  const size_t partial_bytes = (size_t)g.num_tokens * p.num_q_heads * plan.max_chunks *
                               (p.head_dim + 2) * sizeof(float);
  plan.split = plan.max_chunks > 1 && blocks < 2 * (int64_t)num_sms &&
               partial_bytes <= ((size_t)1 << 30);
  if (plan.split) {
    plan.workspace_bytes = align_up(partial_bytes, 256) + (size_t)g.num_tokens * sizeof(int32_t);
  }
  return plan;
}

void launch_paged_attention(const kernels::PagedAttentionParams& p, const AttentionGeometry& g,
                            const AttentionPlan& plan, void* workspace, cudaStream_t stream) {
  if (p.num_seqs == 0 || g.num_tokens == 0) return;
  KernelArgs a;
  a.p = p;
  a.lay = SharedLayout{p.head_dim, p.num_q_heads / p.num_kv_heads};
  a.chunk = chunk_keys(p.block_size);
  a.split = plan.split;
  a.max_chunks = std::max(plan.max_chunks, 1);
  a.partials = nullptr;
  a.nchunks = nullptr;
  const int per_vec = p.kv_dtype == kernels::KvDtype::kF16 ? 8 : 4;
  a.vector_loads = p.head_dim % per_vec == 0 && reinterpret_cast<uintptr_t>(p.k_cache) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.v_cache) % 16 == 0;
  if (plan.split) {
    ARBOR_CHECK(workspace != nullptr);
    a.partials = static_cast<float*>(workspace);
    const size_t partial_bytes = (size_t)g.num_tokens * p.num_q_heads * plan.max_chunks *
                                 (p.head_dim + 2) * sizeof(float);
    a.nchunks = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(workspace) +
                                           align_up(partial_bytes, 256));
  }
  if (plan.shared_bytes > 48 * 1024) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)plan.shared_bytes));
  }
  const dim3 grid((unsigned)g.num_tokens, (unsigned)p.num_kv_heads,
                  plan.split ? (unsigned)plan.max_chunks : 1u);
  paged_attention_kernel<<<grid, kThreads, plan.shared_bytes, stream>>>(a);
  ARBOR_CUDA_CHECK_LAUNCH();
  if (plan.split) {
    merge_chunks_kernel<<<(unsigned)g.num_tokens, kThreads, 0, stream>>>(a);
    ARBOR_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace arbor::cuda
