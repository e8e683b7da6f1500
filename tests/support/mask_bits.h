// Packs a tree mask written out one byte per bit, as tests spell masks, into the packed segment
// model::SequenceInput::mask_bits takes (docs/batch_layout.md: bit k in byte k / 8 at bit
// k % 8; sampling::TokenTree::packed_mask's format). Written independently of the builder so
// that a test compares the builder's bits with a second packing.
//
// Header-only.
#pragma once

#include <cstdint>
#include <vector>

namespace arbor::test {

// visible: [n * n] row-major, nonzero = query i sees key j. Returns [ceil(n * n / 8)] bytes.
inline std::vector<uint8_t> pack_mask_bits(const std::vector<uint8_t>& visible) {
  std::vector<uint8_t> bits((visible.size() + 7) / 8, 0);
  for (size_t k = 0; k < visible.size(); ++k) {
    if (visible[k] != 0) bits[k / 8] = static_cast<uint8_t>(bits[k / 8] | (1u << (k % 8)));
  }
  return bits;
}

}  // namespace arbor::test
