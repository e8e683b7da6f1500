// ggml tensor element types, with their block sizes and bytes per block.
//
// A row of n elements of type t takes (n / block_size(t)) * type_size(t) bytes; n must be a
// multiple of block_size(t). Values match ggml's enum (GGUF stores them as u32).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/strings.h"

namespace arbor::gguf {

enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // "q4_0", "f16", "q4_K", ... (exactly as ggml prints them)
  uint32_t block_size;    // elements per block
  uint32_t type_size;     // bytes per block
};

// nullopt for a value that is not a known ggml type.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);
GgmlTypeTraits ggml_traits(GgmlType type);  // CHECKs that the type is known
std::string_view ggml_type_name(GgmlType type);
// Accepts any known name in any case ("q4_0", "Q4_0", "q4_k", "BF16"). The error
// (kInvalidArgument) lists the accepted names.
Result<GgmlType> parse_ggml_type(std::string_view name);

// Bytes of a row of n elements (n a multiple of the block size; CHECKed).
uint64_t ggml_row_size(GgmlType type, int64_t n);
// Bytes of a whole tensor with ggml-order dims. Returns nullopt on overflow or when dims[0]
// is not a multiple of the block size.
// Returns nullopt too when dims is empty, a dim is not positive, or the element count
// reaches 2^62.
std::optional<uint64_t> ggml_nbytes(GgmlType type, const std::vector<int64_t>& dims);

// Every known type, in enum order.
const std::vector<GgmlTypeTraits>& all_ggml_types();

// ASCII case-insensitive equality of type and recipe names ("Q4_K" == "q4_K").
using ::arbor::equal_ignore_case;

}  // namespace arbor::gguf
