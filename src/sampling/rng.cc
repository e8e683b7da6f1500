#include "sampling/rng.h"

#include <random>

#include "base/bits.h"
#include "base/check.h"

namespace arbor::sampling {

namespace {

// Philox4x32 constants: round multipliers and the Weyl key increments (golden ratio, sqrt(3)-1).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

uint64_t join(uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(hi) << 32 | lo; }

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

RngStream tree_accept_stream(int32_t i) {
  ARBOR_CHECK(i >= 0 && i < (1 << 16)) << "tree accept index " << i;
  if (i == 0) return RngStream::kAccept;
  return static_cast<RngStream>(static_cast<uint32_t>(RngStream::kTreeAccept) +
                                static_cast<uint32_t>(i - 1));
}

RngStream tree_draft_stream(int32_t j) {
  ARBOR_CHECK(j >= 0 && j < (1 << 16)) << "tree draft index " << j;
  if (j == 0) return RngStream::kDraft;
  return static_cast<RngStream>(static_cast<uint32_t>(RngStream::kTreeDraft) +
                                static_cast<uint32_t>(j - 1));
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
}

Rng Rng::at(uint64_t seed, int64_t position, RngStream stream) {
  const auto pos = static_cast<uint64_t>(position);
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed),
                                       static_cast<uint32_t>(seed >> 32)};
  Rng rng;
  for (uint32_t block = 0; block < 2; ++block) {
    const std::array<uint32_t, 4> out = philox4x32_10(
        {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32),
         static_cast<uint32_t>(stream), block},
        key);
    rng.s_[2 * block] = join(out[0], out[1]);
    rng.s_[2 * block + 1] = join(out[2], out[3]);
  }
  // xoshiro's one forbidden state; Philox reaches it for at most one counter per key and block
  // pair, never in practice, but the generator must stay valid.
  if ((rng.s_[0] | rng.s_[1] | rng.s_[2] | rng.s_[3]) == 0) rng.s_[0] = 0x9e3779b97f4a7c15ULL;
  return rng;
}

uint64_t Rng::random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

uint64_t Rng::next_u64() { return xoshiro256ss_next(s_); }

}  // namespace arbor::sampling
