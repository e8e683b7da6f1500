// Packed weights (matmul.h): the portable repacking and the PackedWeights owner. Q8_0/Q4_0: layout
// in matmul_internal.h, kernels in matmul_packed_avx512.cc; the affine types: packed_affine.h.
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/packed_affine.h"

namespace arbor::kernels {

using gguf::GgmlType;
using internal::kPackRows;
using internal::kQBlock;

void PackedWeights::Free::operator()(uint8_t* p) const { std::free(p); }

bool packing_available(GgmlType type) {
  if (internal::is_affine_type(type)) return best_isa() >= Isa::kAvx2;
  return (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) && best_isa() >= Isa::kAvx512;
}

namespace {

// Block b of row r: the fp16 scale and the quant bytes (Q8_0: 32 int8, Q4_0: 16 nibble pairs).
const uint8_t* source_block(const WeightView& w, int64_t r, int64_t b) {
  const size_t block_bytes = weight_block_bytes(w.type);
  return static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride +
         static_cast<size_t>(b) * block_bytes;
}

// Writes block b of the 16-row group starting at row r0 (rows past w.rows get scale 0).
void pack_group_block(const WeightView& w, int64_t r0, int64_t b, uint8_t* dst) {
  const bool q8 = w.type == GgmlType::kQ8_0;
  uint8_t* quants = dst + internal::kPackScaleBytes;
  for (int64_t i = 0; i < kPackRows; ++i) {
    const int64_t r = r0 + i;
    const uint8_t* src = r < w.rows ? source_block(w, r, b) : nullptr;
    std::memcpy(dst + 2 * i, src != nullptr ? src : reinterpret_cast<const uint8_t*>("\0\0"), 2);
    const int64_t words = q8 ? 8 : 4;  // 4-byte groups per row and block
    for (int64_t j = 0; j < words; ++j) {
      for (int m = 0; m < 4; ++m) {
        uint8_t byte;
        if (q8) {
          byte = src != nullptr ? static_cast<uint8_t>(src[2 + 4 * j + m] ^ 0x80) : 0x80;
        } else {
          byte = src != nullptr ? src[2 + 4 * j + m] : 0x88;
        }
        quants[j * 64 + i * 4 + m] = byte;
      }
    }
  }
}

}  // namespace

namespace {

uint8_t* allocate_packed(size_t bytes) {
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  ARBOR_CHECK(data != nullptr) << "out of memory packing " << bytes << " bytes of weights";
  return data;
}

}  // namespace

namespace {

void check_packable(const WeightView& w) {
  ARBOR_CHECK(packing_available(w.type))
      << "no packed kernel for " << gguf::ggml_type_name(w.type) << " on this CPU";
  ARBOR_CHECK(w.cols % kQBlock == 0 && w.rows > 0);
}

}  // namespace

size_t packed_weight_bytes(const WeightView& w) {
  check_packable(w);
  if (internal::is_affine_type(w.type)) return internal::affine_packed_bytes(w);
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  return static_cast<size_t>(groups * (w.cols / kQBlock)) * internal::packed_block_bytes(w.type);
}

void pack_weights_into(const WeightView& w, uint8_t* dst) {
  check_packable(w);
  ARBOR_CHECK(reinterpret_cast<uintptr_t>(dst) % 64 == 0) << "packed weights at " << dst;
  if (internal::is_affine_type(w.type)) {
    internal::pack_affine(w, dst);
    return;
  }
  const int64_t nb = w.cols / kQBlock;
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const size_t block_bytes = internal::packed_block_bytes(w.type);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      pack_group_block(w, g * kPackRows, b, dst + static_cast<size_t>(g * nb + b) * block_bytes);
    }
  }
}

PackedWeights pack_weights(const WeightView& w) {
  PackedWeights p;
  p.bytes_ = packed_weight_bytes(w);
  p.data_.reset(allocate_packed(p.bytes_));
  pack_weights_into(w, p.data_.get());
  return p;
}

}  // namespace arbor::kernels
