// Internal to the kernels module: the target attributes of the AVX2 kernel files (included only
// by .cc files that hold AVX2 code; the rest of the build stays baseline x86-64). Isa::kAvx2
// means AVX2 + FMA + F16C, so every AVX2 function may use all three.
#pragma once

#define ARBOR_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ARBOR_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
