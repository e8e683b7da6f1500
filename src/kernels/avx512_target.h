// Internal to the kernels module: the target attributes of the AVX-512 kernel files (included
// only by .cc files that hold AVX-512 code; the rest of the build stays baseline x86-64).
#pragma once

// GCC 12 flags the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// uninitialised (GCC bug 105593, fixed in 12.3); the kernels read nothing uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// AVX-512 F/BW/VL + VNNI (with the AVX2/FMA/F16C they imply), for functions and for helpers
// that must inline into them.
#define ARBOR_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define ARBOR_AVX512_INLINE                                                    \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), \
                 always_inline)) inline

// The same plus AVX-512 BF16 (vdpbf16ps, vcvtneps2bf16): only for code that runs where
// cpu_features().avx512bf16.
#define ARBOR_AVX512_BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))
#define ARBOR_AVX512_BF16_INLINE                                                          \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16"), \
                 always_inline)) inline
