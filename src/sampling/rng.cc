#include "sampling/rng.h"

#include <random>

namespace arbor::sampling {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
}

Rng Rng::at(uint64_t seed, int64_t position, RngStream stream) {
  uint64_t x = seed;
  uint64_t h = splitmix64(x);
  x = h ^ static_cast<uint64_t>(position);
  h = splitmix64(x);
  x = h ^ static_cast<uint64_t>(stream);
  return Rng(splitmix64(x));
}

uint64_t Rng::random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

}  // namespace arbor::sampling
