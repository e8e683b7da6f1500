#include "kernels/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "base/check.h"
#include "base/log.h"

namespace arbor::kernels {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // GCC 12's __builtin_cpu_supports knows neither f16c, avxvnni nor avx512bf16: read CPUID.
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  f.f16c = (c >> 29) & 1u;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a >= 7) {
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    f.avxvnni = (a >> 4) & 1u;
    f.avx512bf16 = (a >> 5) & 1u;
  }
  // AVX state must be enabled by the OS; __builtin_cpu_supports("avx2") already checks XCR0.
  f.f16c = f.f16c && f.avx2;
  f.avxvnni = f.avxvnni && f.avx2;
  f.avx512bf16 = f.avx512bf16 && f.avx512f && f.avx512bw && f.avx512vl;
#endif
  return f;
}

Isa isa_from_env(Isa best) {
  const char* env = std::getenv("ARBOR_ISA");
  if (env == nullptr || *env == '\0') return best;
  const std::string name(env);
  Isa want = best;
  if (name == "scalar") {
    want = Isa::kScalar;
  } else if (name == "avx2") {
    want = Isa::kAvx2;
  } else if (name == "avx512") {
    want = Isa::kAvx512;
  } else {
    ARBOR_LOG(kWarn) << "ARBOR_ISA=" << name << " is not one of scalar|avx2|avx512; using "
                     << isa_name(best);
    return best;
  }
  if (static_cast<int>(want) > static_cast<int>(best)) {
    ARBOR_LOG(kWarn) << "ARBOR_ISA=" << name << " but this CPU supports at most " << isa_name(best)
                     << "; using " << isa_name(best);
    return best;
  }
  return want;
}

std::atomic<int>& active_isa_slot() {
  static std::atomic<int> slot{static_cast<int>(isa_from_env(best_isa()))};
  return slot;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa best_isa() {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa active_isa() { return static_cast<Isa>(active_isa_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  ARBOR_CHECK(static_cast<int>(isa) <= static_cast<int>(best_isa()))
      << "ISA " << isa_name(isa) << " is not supported by this CPU";
  active_isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

std::string isa_summary() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&s](bool has, const char* name) {
    if (!has) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512vnni, "avx512vnni");
  add(f.avxvnni, "avxvnni");
  add(f.avx512bf16, "avx512bf16");
  if (s.empty()) s = "baseline";
  s += " | kernels: ";
  s += isa_name(active_isa());
  return s;
}

}  // namespace arbor::kernels
