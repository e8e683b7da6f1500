// The portable half of the affine packed types (packed_affine.h): formats, decoding ggml
// blocks into (u, scales), packing, activation records and the scalar kernel.
#include "kernels/packed_affine.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "gguf/quants.h"
#include "kernels/matmul_internal.h"

namespace arbor::kernels::internal {

using gguf::GgmlType;

bool is_affine_type(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
    case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

AffineFormat affine_format(GgmlType type) {
  ARBOR_CHECK(is_affine_type(type)) << gguf::ggml_type_name(type)
                                    << " is not an affine packed type";
  return affine_format_of(type);
}

namespace {

constexpr uint16_t kFp16Sign = 0x8000;

template <class Block>
const Block& super_block(const uint8_t* row, int64_t b) {
  return reinterpret_cast<const Block*>(row)[b / 8];
}

template <class Block>
const Block& block32(const uint8_t* row, int64_t b) {
  return reinterpret_cast<const Block*>(row)[b];
}

void set_scales(AffineBlock* out, int sc0, int sc1, int mn0, int mn1) {
  out->sc[0] = static_cast<int8_t>(sc0);
  out->sc[1] = static_cast<int8_t>(sc1);
  out->mn[0] = static_cast<int8_t>(mn0);
  out->mn[1] = static_cast<int8_t>(mn1);
}

// Q4_K / Q5_K: sub-block j of a super-block is 32 columns; its nibbles are the low (j even)
// or high (j odd) halves of qs[32 * (j / 2) ..], its fifth bits bit j of qh[0..32).
template <class Block>
void decode_k4(const Block& x, int j, const uint8_t* qh, AffineBlock* out) {
  const uint8_t* qs = x.qs + 32 * (j / 2);
  for (int l = 0; l < 32; ++l) {
    int u = (qs[l] >> (4 * (j % 2))) & 0xF;
    if (qh != nullptr) u |= ((qh[l] >> j) & 1) << 4;
    out->u[l] = static_cast<uint8_t>(u);
  }
  uint8_t sc, m;
  gguf::get_scale_min_k4(j, x.scales, &sc, &m);
  set_scales(out, sc, sc, m, m);
  out->d = x.d;
  out->dm = x.dmin ^ kFp16Sign;
}

void decode_q6_K(const gguf::BlockQ6_K& x, int j, AffineBlock* out) {
  const int h = j / 4, jj = j % 4;
  const uint8_t* ql = x.ql + 64 * h + 32 * (jj & 1);
  const uint8_t* qh = x.qh + 32 * h;
  for (int l = 0; l < 32; ++l) {
    const int low = jj >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
    out->u[l] = static_cast<uint8_t>(low | ((qh[l] >> (2 * jj)) & 3) << 4);
  }
  set_scales(out, x.scales[2 * j], x.scales[2 * j + 1], 0, 0);
  out->d = x.d;
  out->dm = 0;
}

void decode_q3_K(const gguf::BlockQ3_K& x, int j, AffineBlock* out) {
  const int h = j / 4, jj = j % 4;
  for (int l = 0; l < 32; ++l) {
    const int low = (x.qs[32 * h + l] >> (2 * jj)) & 3;
    const int high = (x.hmask[l] >> (4 * h + jj)) & 1;  // set: no -4, so u = q + 4
    out->u[l] = static_cast<uint8_t>(low | high << 2);
  }
  int scales[16];
  gguf::unpack_scales_q3(x.scales, scales);
  set_scales(out, scales[2 * j], scales[2 * j + 1], 0, 0);
  out->d = x.d;
  out->dm = 0;
}

void decode_q2_K(const gguf::BlockQ2_K& x, int j, AffineBlock* out) {
  const int h = j / 4, jj = j % 4;
  for (int l = 0; l < 32; ++l) {
    out->u[l] = static_cast<uint8_t>((x.qs[32 * h + l] >> (2 * jj)) & 3);
  }
  const uint8_t s0 = x.scales[2 * j], s1 = x.scales[2 * j + 1];
  set_scales(out, s0 & 0xF, s1 & 0xF, s0 >> 4, s1 >> 4);
  out->d = x.d;
  out->dm = x.dmin ^ kFp16Sign;
}

// Q4_1 / Q5_0 / Q5_1: element l in the low nibble of qs[l], l + 16 in the high one; the fifth
// bit of element l is bit l of qh (little-endian u32).
void decode_legacy(const uint8_t* qs, const uint8_t* qh4, uint16_t d, uint16_t m,
                   AffineBlock* out) {
  uint32_t qh = 0;
  if (qh4 != nullptr) std::memcpy(&qh, qh4, sizeof(qh));
  for (int l = 0; l < 16; ++l) {
    out->u[l] = static_cast<uint8_t>((qs[l] & 0xF) | ((qh >> l) & 1) << 4);
    out->u[l + 16] = static_cast<uint8_t>((qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4);
  }
  set_scales(out, 1, 1, 1, 1);
  out->d = d;
  out->dm = m;
}

// IQ4_XS: sub-block j of a super-block is 32 columns, nibbles as IQ4_NL's at qs[16 j ..].
void decode_iq4_xs(const gguf::BlockIq4Xs& x, int j, AffineBlock* out) {
  decode_legacy(x.qs + 16 * j, nullptr, x.d, 0, out);
  const int ls = ((x.scales_l[j / 2] >> 4 * (j % 2)) & 0xF) | ((x.scales_h >> 2 * j) & 3) << 4;
  set_scales(out, ls - 32, ls - 32, 0, 0);
}

}  // namespace

void decode_affine_block(GgmlType type, const uint8_t* row, int64_t b, AffineBlock* out) {
  const int j = static_cast<int>(b % 8);
  switch (type) {
    case GgmlType::kQ4_K:
      return decode_k4(super_block<gguf::BlockQ4_K>(row, b), j, nullptr, out);
    case GgmlType::kQ5_K: {
      const auto& x = super_block<gguf::BlockQ5_K>(row, b);
      return decode_k4(x, j, x.qh, out);
    }
    case GgmlType::kQ6_K:
      return decode_q6_K(super_block<gguf::BlockQ6_K>(row, b), j, out);
    case GgmlType::kQ3_K:
      return decode_q3_K(super_block<gguf::BlockQ3_K>(row, b), j, out);
    case GgmlType::kQ2_K:
      return decode_q2_K(super_block<gguf::BlockQ2_K>(row, b), j, out);
    case GgmlType::kQ4_1: {
      const auto& x = block32<gguf::BlockQ4_1>(row, b);
      return decode_legacy(x.qs, nullptr, x.d, x.m, out);
    }
    case GgmlType::kQ5_0: {
      const auto& x = block32<gguf::BlockQ5_0>(row, b);
      return decode_legacy(x.qs, x.qh, x.d, 0, out);
    }
    case GgmlType::kQ5_1: {
      const auto& x = block32<gguf::BlockQ5_1>(row, b);
      return decode_legacy(x.qs, x.qh, x.d, x.m, out);
    }
    case GgmlType::kIQ4_NL: {
      const auto& x = block32<gguf::BlockIq4Nl>(row, b);
      return decode_legacy(x.qs, nullptr, x.d, 0, out);
    }
    case GgmlType::kIQ4_XS:
      return decode_iq4_xs(super_block<gguf::BlockIq4Xs>(row, b), j, out);
    case GgmlType::kMXFP4: {
      const auto& x = block32<gguf::BlockMxfp4>(row, b);
      return decode_legacy(x.qs, nullptr, x.e, 0, out);
    }
    default:
      ARBOR_CHECK(false) << gguf::ggml_type_name(type) << " is not an affine packed type";
  }
}

float affine_scale(const AffineFormat& f, const AffineBlock& blk, int h) {
  const float d = f.e8m0 ? gguf::e8m0_to_fp32_half(static_cast<uint8_t>(blk.d))
                         : fp16_to_fp32(blk.d);
  return f.int_scales ? d * static_cast<float>(blk.sc[h]) : d;
}

float affine_offset(const AffineFormat& f, const AffineBlock& blk, int h) {
  if (!f.has_min) return 0.0f;
  const float dm = fp16_to_fp32(blk.dm);
  return f.int_scales ? dm * static_cast<float>(blk.mn[h]) : dm;
}

// ---- Packing ----

size_t affine_packed_bytes(const WeightView& w) {
  const AffineFormat f = affine_format(w.type);
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const int64_t units = w.cols / kQBlock / f.blocks_per_unit;
  return static_cast<size_t>(groups * units) * f.unit_bytes();
}

namespace {

// Record of block `b` for rows r0 .. r0 + 15 (blocks[i] null past the matrix: all zero).
void write_record(const AffineFormat& f, const AffineBlock* const* blocks, uint8_t* rec) {
  if (f.nibbles) {
    for (int i = 0; i < kPackRows; ++i) {
      if (blocks[i] == nullptr) continue;
      const uint8_t* u = blocks[i]->u;
      for (int j = 0; j < 4; ++j) {
        for (int m = 0; m < 4; ++m) {
          rec[64 * j + 4 * i + m] =
              static_cast<uint8_t>((u[4 * j + m] & 0xF) | (u[16 + 4 * j + m] & 0xF) << 4);
        }
      }
    }
  }
  if (f.crumbs) {
    uint8_t* crumbs = rec + f.crumb_offset();
    for (int i = 0; i < kPackRows; ++i) {
      if (blocks[i] == nullptr) continue;
      for (int j = 0; j < 8; ++j) {
        for (int m = 0; m < 4; ++m) {
          const int two = (blocks[i]->u[4 * j + m] >> f.crumb_bit()) & 3;
          crumbs[64 * (j / 4) + 4 * i + m] |= static_cast<uint8_t>(two << (2 * (j % 4)));
        }
      }
    }
  }
  uint8_t* planes = rec + f.plane_offset();
  const int first_bit = f.first_plane_bit();
  for (int p = 0; p < f.bit_planes; ++p) {
    for (int j = 0; j < 8; ++j) {
      uint64_t word = 0;
      for (int i = 0; i < kPackRows; ++i) {
        for (int m = 0; blocks[i] != nullptr && m < 4; ++m) {
          const uint64_t bit = (blocks[i]->u[4 * j + m] >> (first_bit + p)) & 1;
          word |= bit << (4 * i + m);
        }
      }
      std::memcpy(planes + 64 * p + 8 * j, &word, sizeof(word));
    }
  }
  if (!f.int_scales) return;
  int8_t* sc = reinterpret_cast<int8_t*>(rec + f.scale_offset());
  int8_t* mn = sc + 16 * f.sub_blocks();
  for (int h = 0; h < f.sub_blocks(); ++h) {
    for (int i = 0; i < kPackRows; ++i) {
      sc[16 * h + i] = blocks[i] != nullptr ? blocks[i]->sc[h] : 0;
      if (f.has_min) mn[16 * h + i] = blocks[i] != nullptr ? blocks[i]->mn[h] : 0;
    }
  }
}

}  // namespace

void pack_affine(const WeightView& w, uint8_t* dst) {
  const AffineFormat f = affine_format(w.type);
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const int64_t units = w.cols / kQBlock / f.blocks_per_unit;
  std::memset(dst, 0, affine_packed_bytes(w));
  std::vector<AffineBlock> blocks(kPackRows);
  const AffineBlock* live[kPackRows];
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t u = 0; u < units; ++u) {
      uint8_t* unit = dst + static_cast<size_t>(g * units + u) * f.unit_bytes();
      for (int64_t jb = 0; jb < f.blocks_per_unit; ++jb) {
        const int64_t b = u * f.blocks_per_unit + jb;
        for (int i = 0; i < kPackRows; ++i) {
          const int64_t r = g * kPackRows + i;
          live[i] = nullptr;
          if (r >= w.rows) continue;
          const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_stride;
          decode_affine_block(w.type, row, b, &blocks[i]);
          live[i] = &blocks[i];
          if (jb == 0 && f.e8m0) {
            unit[i] = static_cast<uint8_t>(blocks[i].d);
          } else if (jb == 0) {  // d and dm are the unit's (one per super-block or block)
            std::memcpy(unit + 2 * i, &blocks[i].d, 2);
            if (f.has_min) std::memcpy(unit + 32 + 2 * i, &blocks[i].dm, 2);
          }
        }
        write_record(f, live, unit + f.header_bytes() + jb * f.record_bytes());
      }
    }
  }
}

// ---- Activations and the scalar kernel ----

struct ScalarActPieces {
  static float absmax(const float* x, int64_t n) { return act_absmax_scalar(x, n); }
  static void quantize(const float* x, float id, int8_t* qs) {
    quantize_act_block_scalar(x, id, qs);
  }
  // Sums in locals: qs is int8_t, which may alias anything, so accumulating into memory would
  // go through it once per element.
  static void half_sums(const int8_t* qs, int32_t& s0, int32_t& s1) {
    s0 = s1 = 0;
    for (int l = 0; l < 16; ++l) {
      s0 += qs[l];
      s1 += qs[16 + l];
    }
  }
};

void pack_act_row_affine(const float* x, int64_t cols, const AffineFormat& f, ActBlockAffine* out,
                         int64_t out_stride, bool avx2) {
  const int64_t group = act_scale_blocks(f);
  ARBOR_CHECK_EQ(cols % (kQBlock * group), 0) << "activations of " << cols << " columns";
  if (avx2) return pack_act_row_affine_avx2(x, cols, f, out, out_stride);
  pack_act_units<ScalarActPieces>(x, cols, f, out, out_stride);
}

float affine_block_step(const AffineFormat& f, const AffineBlock& blk, const ActBlockAffine& a,
                        float acc) {
  int32_t lo = 0, hi = 0;
  for (int l = 0; l < 16; ++l) {
    lo += affine_value(f, blk.u[l]) * a.qs[l];
    hi += affine_value(f, blk.u[16 + l]) * a.qs[16 + l];
  }
  if (!f.has_min) {
    lo -= f.zero * a.sum[0];
    hi -= f.zero * a.sum[1];
  }
  const bool per_unit = scales_per_unit(f);
  if (f.split) {
    if (per_unit) {
      acc = std::fma(static_cast<float>(lo), affine_scale(f, blk, 0), acc);
      acc = std::fma(static_cast<float>(hi), affine_scale(f, blk, 1), acc);
    } else {
      const float t = std::fma(static_cast<float>(lo), affine_scale(f, blk, 0),
                               static_cast<float>(hi) * affine_scale(f, blk, 1));
      acc = std::fma(t, a.d, acc);
    }
    if (f.has_min) {
      acc = std::fma(affine_offset(f, blk, 0), a.msum_half[0], acc);
      acc = std::fma(affine_offset(f, blk, 1), a.msum_half[1], acc);
    }
    return acc;
  }
  const float s = per_unit ? affine_scale(f, blk, 0) : affine_scale(f, blk, 0) * a.d;
  acc = std::fma(static_cast<float>(lo + hi), s, acc);
  if (f.has_min) acc = std::fma(affine_offset(f, blk, 0), a.msum, acc);
  return acc;
}

double affine_block_ref(const AffineFormat& f, const AffineBlock& blk, const ActBlockAffine& a) {
  int32_t dot[2] = {0, 0};
  for (int l = 0; l < 32; ++l) dot[l / 16] += affine_value(f, blk.u[l]) * a.qs[l];
  const bool per_unit = scales_per_unit(f);
  double sum = 0.0;
  for (int h = 0; h < 2; ++h) {
    const int s = f.split ? h : 0;
    if (!f.has_min) dot[h] -= f.zero * a.sum[h];
    // The f32 products the kernels form: S * d per block, or S alone (d after the unit).
    const float scale = per_unit ? affine_scale(f, blk, s) : affine_scale(f, blk, s) * a.d;
    sum += static_cast<double>(dot[h]) * static_cast<double>(scale);
    if (f.has_min) {
      sum += static_cast<double>(affine_offset(f, blk, s)) * static_cast<double>(a.msum_half[h]);
    }
  }
  return per_unit ? sum * static_cast<double>(a.d) : sum;
}

void affine_rows_scalar(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                        float* y, int64_t row_begin, int64_t row_end) {
  const AffineFormat f = affine_format(w.type);
  const int64_t nb = w.cols / kQBlock;
  const bool per_unit = scales_per_unit(f);
  thread_local std::vector<float> acc, unit;
  acc.resize(static_cast<size_t>(num_tokens));
  unit.resize(static_cast<size_t>(num_tokens));
  AffineBlock blk;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_stride;
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(unit.begin(), unit.end(), 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      decode_affine_block(w.type, row, b, &blk);
      const ActBlockAffine* ab = acts + b * num_tokens;
      for (int64_t t = 0; t < num_tokens; ++t) {
        if (!per_unit) {
          acc[t] = affine_block_step(f, blk, ab[t], acc[t]);
          continue;
        }
        unit[t] = affine_block_step(f, blk, ab[t], unit[t]);
        if ((b + 1) % f.blocks_per_unit == 0) {
          acc[t] = affine_unit_end(ab[t], unit[t], acc[t]);
          unit[t] = 0.0f;
        }
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t) y[t * w.rows + r] = acc[t];
  }
}

}  // namespace arbor::kernels::internal
