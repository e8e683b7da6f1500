#include "collective/collective.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace arbor::collective {

std::string tag_string(const CollectiveTag& t) {
  char digest[24];
  std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(t.digest));
  return str_cat("step ", t.step, ", batch digest ", digest, ", collective #", t.op);
}

void tree_sum(std::span<const float* const> parts, float* out, int64_t n) {
  const size_t k = parts.size();
  ARBOR_CHECK(k >= 1 && k <= 64) << k << " parts";
  if (k == 1) {
    if (out != parts[0]) std::memmove(out, parts[0], static_cast<size_t>(n) * sizeof(float));
    return;
  }
  // Level by level over chunks that stay in L1; each level adds adjacent pairs (vectorised, and
  // float addition is exact IEEE: the same tree gives the same bits however it is coded).
  constexpr int64_t kChunk = 512;
  float buf[64 / 2][kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    // Level 0: pairs of the inputs into buf.
    size_t count = 0;
    for (size_t i = 0; i < k; i += 2, ++count) {
      const float* a = parts[i] + c0;
      float* dst = buf[count];
      if (i + 1 < k) {
        const float* b = parts[i + 1] + c0;
        for (int64_t j = 0; j < m; ++j) dst[j] = a[j] + b[j];
      } else {
        std::memcpy(dst, a, static_cast<size_t>(m) * sizeof(float));
      }
    }
    while (count > 1) {
      size_t next = 0;
      for (size_t i = 0; i < count; i += 2, ++next) {
        if (i + 1 < count) {
          for (int64_t j = 0; j < m; ++j) buf[next][j] = buf[i][j] + buf[i + 1][j];
        } else if (next != i) {
          std::memcpy(buf[next], buf[i], static_cast<size_t>(m) * sizeof(float));
        }
      }
      count = next;
    }
    std::memcpy(out + c0, buf[0], static_cast<size_t>(m) * sizeof(float));
  }
}

}  // namespace arbor::collective
