#include "kernels/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/log.h"

namespace arbor::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// r = EAX, EBX, ECX, EDX of CPUID (leaf, subleaf).
void cpuid(unsigned leaf, unsigned subleaf, unsigned (&r)[4]) {
  __asm__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
}
#endif

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
  unsigned r[4];
  cpuid(1, 0, r);
  f.f16c = (r[2] >> 29) & 1u;
  cpuid(0, 0, r);
  if (r[0] >= 7) {
    cpuid(7, 1, r);
    f.avxvnni = (r[0] >> 4) & 1u;
    f.avx512bf16 = (r[0] >> 5) & 1u;
  }
  // AVX state must be enabled by the OS; __builtin_cpu_supports("avx2") already checks XCR0.
  f.f16c = f.f16c && f.avx2;
  f.avxvnni = f.avxvnni && f.avx2;
  f.avx512bf16 = f.avx512bf16 && f.avx512f && f.avx512bw && f.avx512vl;
#endif
  return f;
}

CpuId detect_id() {
  CpuId id;
#if defined(__x86_64__) || defined(__i386__)
  unsigned r[4];
  cpuid(1, 0, r);
  id = decode_cpu_signature(r[0]);
  cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    char raw[48];
    for (unsigned i = 0; i < 3; ++i) {
      cpuid(0x80000002u + i, 0, r);
      std::memcpy(raw + 16 * i, r, 16);
    }
    id.brand = trim_cpu_brand(std::string_view(raw, sizeof(raw)));
  }
#endif
  return id;
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

const CpuId& cpu_id() {
  static const CpuId id = detect_id();
  return id;
}

CpuId decode_cpu_signature(uint32_t eax) {
  CpuId id;
  const int base_family = static_cast<int>((eax >> 8) & 0xFu);
  const int base_model = static_cast<int>((eax >> 4) & 0xFu);
  id.stepping = static_cast<int>(eax & 0xFu);
  id.family = base_family == 0xF ? base_family + static_cast<int>((eax >> 20) & 0xFFu)
                                 : base_family;
  id.model = base_family == 0x6 || base_family == 0xF
                 ? base_model + (static_cast<int>((eax >> 16) & 0xFu) << 4)
                 : base_model;
  return id;
}

std::string trim_cpu_brand(std::string_view raw) {
  raw = raw.substr(0, raw.find('\0'));
  const size_t begin = raw.find_first_not_of(' ');
  if (begin == std::string_view::npos) return "";
  return std::string(raw.substr(begin, raw.find_last_not_of(' ') - begin + 1));
}

std::string cpu_summary() {
  const CpuId& id = cpu_id();
  if (id.brand.empty()) return "unknown CPU";
  return id.brand + " (family " + std::to_string(id.family) + ", model " +
         std::to_string(id.model) + ", stepping " + std::to_string(id.stepping) + ")";
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
