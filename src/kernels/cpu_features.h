// CPU feature detection and the runtime ISA choice for the kernels.
//
// The default build targets baseline x86-64; ISA-specific kernels are compiled with function
// target attributes and chosen at run time from active_isa(). ARBOR_ISA=scalar|avx2|avx512 in the
// environment forces a path (read once, at the first call of active_isa()); asking for an ISA the
// CPU lacks falls back to the best supported one with a warning. Tests and benchmarks switch
// paths with set_active_isa().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace arbor::kernels {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avxvnni = false;
  bool avx512bf16 = false;  // vdpbf16ps (Cooper Lake, Sapphire Rapids, Zen 4 and later)
};

// Detected once (thread-safe static); never changes.
const CpuFeatures& cpu_features();

// Which CPU this is, for benchmark headers and logs: the same kernels run at very different
// speeds on, say, Zen 4 (512-bit operations as two halves) and Zen 5.
struct CpuId {
  std::string brand;  // CPUID 0x80000002..4, trimmed ("AMD EPYC"); empty if not reported
  int family = 0;     // display family and model, as the vendors define them (Zen 4: 25, 17)
  int model = 0;
  int stepping = 0;
};

// Detected once; never changes. All zero / empty off x86.
const CpuId& cpu_id();
// Family, model and stepping from CPUID leaf 1's EAX: family = base + extended family when the
// base is 0xF; model = base + (extended model << 4) when the base family is 6 or 0xF.
CpuId decode_cpu_signature(uint32_t eax);
// The 48 brand bytes without their NUL padding and surrounding spaces.
std::string trim_cpu_brand(std::string_view raw);
// "AMD EPYC (family 25, model 17, stepping 1)"; "unknown CPU" without a brand string.
std::string cpu_summary();

// Kernel families, best last; each includes the ones before it. kAvx2 means AVX2 + FMA + F16C;
// kAvx512 adds AVX-512 F/BW/VL + VNNI (the Q8_0/Q4_0 matmul tiles on 512-bit registers; other
// kernels use their AVX2 versions). Compare with >=, never ==.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view isa_name(Isa isa);
// Best ISA the CPU supports.
Isa best_isa();
// The ISA kernels dispatch on: ARBOR_ISA if set, else best_isa().
Isa active_isa();
// Overrides active_isa() (tests, benchmarks). CHECKs that the CPU supports `isa`.
// Not synchronised with running kernels: call it between matmuls, from one thread.
void set_active_isa(Isa isa);

// "avx2 fma f16c avx512f ... | kernels: avx2" for logs and `arbor bench`.
std::string isa_summary();

}  // namespace arbor::kernels
