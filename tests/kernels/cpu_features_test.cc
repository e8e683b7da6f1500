// The CPU identity printed by `arbor bench` and the logs: signature decoding against the values
// the vendors document, brand trimming, and the live detection's consistency.
#include "kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <string>

namespace arbor::kernels {
namespace {

struct Signature {
  uint32_t eax;
  int family, model, stepping;
  const char* what;
};

TEST(CpuFeatures, SignaturesDecodeToTheVendorsFamilyAndModel) {
  const Signature cases[] = {
      {0x00A10F11, 25, 17, 1, "AMD Zen 4 Genoa (family 19h: base F + extended A)"},
      {0x00B00F21, 26, 2, 1, "AMD Zen 5 Turin (family 1Ah)"},
      {0x00830F10, 23, 49, 0, "AMD Zen 2 Rome (family 17h, model 31h)"},
      {0x000806F8, 6, 143, 8, "Intel Sapphire Rapids (family 6: extended model 8)"},
      {0x000306C3, 6, 60, 3, "Intel Haswell"},
      {0x00000F4A, 15, 4, 10, "Intel Pentium 4 (base F, extended family 0)"},
      {0x00000543, 5, 4, 3, "Intel Pentium MMX (family 5: no extended model)"},
      {0x01110623, 6, 18, 3, "synthetic: extended family bits count only with base family F"},
  };
  for (const Signature& c : cases) {
    const CpuId id = decode_cpu_signature(c.eax);
    EXPECT_EQ(id.family, c.family) << c.what;
    EXPECT_EQ(id.model, c.model) << c.what;
    EXPECT_EQ(id.stepping, c.stepping) << c.what;
    EXPECT_TRUE(id.brand.empty()) << c.what;
  }
}

TEST(CpuFeatures, BrandStringsLoseTheirPaddingOnly) {
  EXPECT_EQ(trim_cpu_brand(std::string("AMD EPYC") + std::string(40, '\0')), "AMD EPYC");
  EXPECT_EQ(trim_cpu_brand("       Intel(R) Xeon(R) CPU @ 2.00GHz  "),
            "Intel(R) Xeon(R) CPU @ 2.00GHz");
  EXPECT_EQ(trim_cpu_brand(std::string("a  b \0 junk", 11)), "a  b");
  EXPECT_EQ(trim_cpu_brand(std::string(48, ' ')), "");
  EXPECT_EQ(trim_cpu_brand(std::string(48, '\0')), "");
}

TEST(CpuFeatures, TheSummaryNamesTheDetectedCpu) {
  const CpuId& id = cpu_id();
  const std::string s = cpu_summary();
  if (id.brand.empty()) {
    EXPECT_EQ(s, "unknown CPU");
    return;
  }
  EXPECT_EQ(s, id.brand + " (family " + std::to_string(id.family) + ", model " +
                   std::to_string(id.model) + ", stepping " + std::to_string(id.stepping) + ")");
#if defined(__x86_64__)
  // Every x86-64 CPU has a display family of at least 6 (P6 and later, or AMD K8 = 15 and up).
  EXPECT_GE(id.family, 6);
#endif
}

}  // namespace
}  // namespace arbor::kernels
