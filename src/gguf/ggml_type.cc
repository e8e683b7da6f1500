#include "gguf/ggml_type.h"

#include <cctype>
#include <string>

#include "base/check.h"

namespace arbor::gguf {

namespace {

// Block geometry from ggml.c's type_traits table. Raw values 4, 5 (removed Q4_2/Q4_3) and
// 31-33 (removed Q4_0_4_4 family) and 36-38 (removed IQ4_NL_4_4 family) are not types.
const std::vector<GgmlTypeTraits>& table() {
  static const std::vector<GgmlTypeTraits> kTypes = {
      {GgmlType::kF32, "f32", 1, 4},          {GgmlType::kF16, "f16", 1, 2},
      {GgmlType::kQ4_0, "q4_0", 32, 18},      {GgmlType::kQ4_1, "q4_1", 32, 20},
      {GgmlType::kQ5_0, "q5_0", 32, 22},      {GgmlType::kQ5_1, "q5_1", 32, 24},
      {GgmlType::kQ8_0, "q8_0", 32, 34},      {GgmlType::kQ8_1, "q8_1", 32, 36},
      {GgmlType::kQ2_K, "q2_K", 256, 84},     {GgmlType::kQ3_K, "q3_K", 256, 110},
      {GgmlType::kQ4_K, "q4_K", 256, 144},    {GgmlType::kQ5_K, "q5_K", 256, 176},
      {GgmlType::kQ6_K, "q6_K", 256, 210},    {GgmlType::kQ8_K, "q8_K", 256, 292},
      {GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66}, {GgmlType::kIQ2_XS, "iq2_xs", 256, 74},
      {GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98}, {GgmlType::kIQ1_S, "iq1_s", 256, 50},
      {GgmlType::kIQ4_NL, "iq4_nl", 32, 18},  {GgmlType::kIQ3_S, "iq3_s", 256, 110},
      {GgmlType::kIQ2_S, "iq2_s", 256, 82},   {GgmlType::kIQ4_XS, "iq4_xs", 256, 136},
      {GgmlType::kI8, "i8", 1, 1},            {GgmlType::kI16, "i16", 1, 2},
      {GgmlType::kI32, "i32", 1, 4},          {GgmlType::kI64, "i64", 1, 8},
      {GgmlType::kF64, "f64", 1, 8},          {GgmlType::kIQ1_M, "iq1_m", 256, 56},
      {GgmlType::kBF16, "bf16", 1, 2},        {GgmlType::kTQ1_0, "tq1_0", 256, 54},
      {GgmlType::kTQ2_0, "tq2_0", 256, 66},   {GgmlType::kMXFP4, "mxfp4", 32, 17},
  };
  return kTypes;
}


}  // namespace

const std::vector<GgmlTypeTraits>& all_ggml_types() { return table(); }

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type) {
  for (const GgmlTypeTraits& t : table()) {
    if (static_cast<uint32_t>(t.type) == raw_type) return t;
  }
  return std::nullopt;
}

GgmlTypeTraits ggml_traits(GgmlType type) {
  const auto t = ggml_type_traits(static_cast<uint32_t>(type));
  ARBOR_CHECK(t.has_value()) << "unknown ggml type " << static_cast<uint32_t>(type);
  return *t;
}

std::string_view ggml_type_name(GgmlType type) { return ggml_traits(type).name; }

Result<GgmlType> parse_ggml_type(std::string_view name) {
  std::string accepted;
  for (const GgmlTypeTraits& t : table()) {
    if (equal_ignore_case(t.name, name)) return t.type;
    if (!accepted.empty()) accepted += ", ";
    accepted += t.name;
  }
  return invalid_argument("unknown ggml type '", name, "'; accepted: ", accepted);
}

uint64_t ggml_row_size(GgmlType type, int64_t n) {
  const GgmlTypeTraits t = ggml_traits(type);
  ARBOR_CHECK_GE(n, 0);
  ARBOR_CHECK_EQ(static_cast<uint64_t>(n) % t.block_size, 0u)
      << "row of " << t.name << " must be a multiple of " << t.block_size;
  return static_cast<uint64_t>(n) / t.block_size * t.type_size;
}

std::optional<uint64_t> ggml_nbytes(GgmlType type, const std::vector<int64_t>& dims) {
  const auto t = ggml_type_traits(static_cast<uint32_t>(type));
  if (!t || dims.empty()) return std::nullopt;
  for (int64_t d : dims) {
    if (d <= 0) return std::nullopt;
  }
  if (static_cast<uint64_t>(dims[0]) % t->block_size != 0) return std::nullopt;
  // Keep the element count and the byte count below 2^62 so both fit in int64 / off_t with
  // room for offsets added to them.
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t elements = static_cast<uint64_t>(dims[0]);
  uint64_t bytes = elements / t->block_size * t->type_size;
  if (elements > kLimit || bytes > kLimit) return std::nullopt;
  for (size_t i = 1; i < dims.size(); ++i) {
    const uint64_t d = static_cast<uint64_t>(dims[i]);
    if (elements > kLimit / d || bytes > kLimit / d) return std::nullopt;
    elements *= d;
    bytes *= d;
  }
  return bytes;
}


}  // namespace arbor::gguf
