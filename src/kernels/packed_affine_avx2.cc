// The affine packed kernel for any AVX2 CPU (vpmaddubsw dots): packed_affine_avx2.inc.
#include "kernels/packed_affine.h"

#define ARBOR_AFFINE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ARBOR_AFFINE_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace arbor::kernels::internal {
namespace {
constexpr bool kVnni = false;
}  // namespace
}  // namespace arbor::kernels::internal

#include "kernels/packed_affine_avx2.inc"

namespace arbor::kernels::internal {

void affine_rows_avx2(const WeightView& w, const ActBlockAffine* acts, int64_t num_tokens,
                      float* y, int64_t group_begin, int64_t group_end) {
  affine_rows_avx2_impl(w, acts, num_tokens, y, group_begin, group_end);
}

}  // namespace arbor::kernels::internal
