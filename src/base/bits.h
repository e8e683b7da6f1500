// Deterministic bit mixing shared by modules that may not depend on each other (sampling's RNG,
// synthetic weights, inflated models): SplitMix64, MurmurHash3's 64-bit finaliser and one step
// of xoshiro256**. Header-only, pure, thread-safe.
#pragma once

#include <cstdint>

namespace arbor {

// SplitMix64: advances `x` by the golden-ratio increment and returns its mixed value (seeding).
inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// MurmurHash3's fmix64: a bijective avalanche of x.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256**: returns the next output of state s ([4], not all zero) and advances it.
inline uint64_t xoshiro256ss_next(uint64_t (&s)[4]) {
  const uint64_t result = rotl64(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return result;
}

}  // namespace arbor
