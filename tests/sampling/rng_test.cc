#include "sampling/rng.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_set>
#include <vector>

namespace arbor::sampling {
namespace {

constexpr RngStream kStreams[] = {RngStream::kSample, RngStream::kAccept, RngStream::kRecover,
                                  RngStream::kDraft};

TEST(RngTest, Philox4x32MatchesRandom123KnownAnswers) {
  // Random123's tests/kat_vectors for philox4x32 with 10 rounds.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Pinned outputs: a seeded request's tokens depend on them, so changing the generator or the
// mixer is a visible, deliberate change.
TEST(RngTest, PinnedOutputs) {
  Rng stateful(42);
  EXPECT_EQ(stateful.next_u64(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(stateful.next_u64(), 0x6104d9866d113a7eULL);
  Rng site = Rng::at(42, 7, RngStream::kAccept);
  EXPECT_EQ(site.next_u64(), 0x76508acec549315dULL);
  EXPECT_EQ(site.next_u64(), 0x48a45b92b5115d2fULL);
  Rng zero = Rng::at(0, 0, RngStream::kSample);
  EXPECT_EQ(zero.next_u64(), 0x93528c8db4a4ae1bULL);
}

TEST(RngTest, AtIsAPureFunctionOfSeedPositionStream) {
  for (uint64_t seed : {0ULL, 1ULL, 0xdeadbeefcafeULL}) {
    for (int64_t position : {int64_t{0}, int64_t{5}, int64_t{1} << 40}) {
      for (RngStream stream : kStreams) {
        Rng a = Rng::at(seed, position, stream);
        Rng unrelated = Rng::at(seed + 1, position, stream);
        (void)unrelated.next_u64();  // other generators' use cannot matter
        Rng b = Rng::at(seed, position, stream);
        for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
      }
    }
  }
}

// A grid of 8 seeds x 2,052 positions x 4 streams = 65,664 sites, including the extremes of
// each field and neighbouring values (the structured inputs a weak mixer confuses): all first
// outputs differ, and so do all second outputs.
TEST(RngTest, NoCollisionsOnAGridOfSites) {
  const std::vector<uint64_t> seeds = {0, 1, 2, 3, 42, 1ULL << 32, 1ULL << 63, ~0ULL};
  std::vector<int64_t> positions;
  for (int64_t p = 0; p < 2048; ++p) positions.push_back(p);
  for (int64_t p : {int64_t{-1}, int64_t{1} << 32, (int64_t{1} << 32) + 1,
                    std::numeric_limits<int64_t>::max()}) {
    positions.push_back(p);
  }
  std::unordered_set<uint64_t> first, second;
  size_t sites = 0;
  for (uint64_t seed : seeds) {
    for (int64_t position : positions) {
      for (RngStream stream : kStreams) {
        Rng rng = Rng::at(seed, position, stream);
        EXPECT_TRUE(first.insert(rng.next_u64()).second)
            << "seed " << seed << " position " << position << " stream "
            << static_cast<uint32_t>(stream);
        second.insert(rng.next_u64());
        ++sites;
      }
    }
  }
  EXPECT_EQ(sites, 65664u);
  EXPECT_EQ(second.size(), sites);
}

// Each of the 64 bits of `values` is set in half of them within 6 sigma (sigma = sqrt(n) / 2);
// for 64 independent fair bits a false alarm has probability < 1.3e-7.
void expect_bits_balanced(const std::vector<uint64_t>& values, const char* what) {
  const double n = static_cast<double>(values.size());
  const double bound = 6.0 * std::sqrt(n) / 2.0;
  for (int bit = 0; bit < 64; ++bit) {
    double ones = 0;
    for (uint64_t v : values) ones += static_cast<double>((v >> bit) & 1);
    EXPECT_LE(std::fabs(ones - n / 2), bound) << what << ": bit " << bit << " set " << ones
                                              << " times in " << n;
  }
}

// Sites that differ in one field by one (adjacent positions, adjacent seeds, other stream):
// the first outputs are balanced bit by bit, and so is the XOR of neighbours (each output bit
// flips with probability 1/2 when the input changes).
TEST(RngTest, NeighbouringSitesGiveBalancedIndependentLookingBits) {
  const int n = 1 << 16;
  std::vector<uint64_t> outputs, position_flip, seed_flip, stream_flip;
  for (int i = 0; i < n; ++i) {
    const uint64_t seed = 12345 + static_cast<uint64_t>(i / 4096);
    const int64_t position = i % 4096;
    const uint64_t x = Rng::at(seed, position, RngStream::kSample).next_u64();
    outputs.push_back(x);
    position_flip.push_back(x ^ Rng::at(seed, position + 1, RngStream::kSample).next_u64());
    seed_flip.push_back(x ^ Rng::at(seed + 1, position, RngStream::kSample).next_u64());
    stream_flip.push_back(x ^ Rng::at(seed, position, RngStream::kAccept).next_u64());
  }
  expect_bits_balanced(outputs, "outputs");
  expect_bits_balanced(position_flip, "position +1");
  expect_bits_balanced(seed_flip, "seed +1");
  expect_bits_balanced(stream_flip, "other stream");
}

// Pearson chi-square of 2^16 pairs (a, b) in [0,1)^2 over a 16 x 16 grid (255 degrees of
// freedom, 256 expected per cell). P(chi2_255 > 400) < 1e-7 (Wilson-Hilferty), so a failure
// means the draws are not uniform or the two are dependent.
double pair_chi_square(const std::vector<std::pair<double, double>>& pairs) {
  std::vector<double> cells(256, 0.0);
  for (const auto& [a, b] : pairs) {
    cells[static_cast<int>(a * 16) * 16 + static_cast<int>(b * 16)] += 1.0;
  }
  const double expected = static_cast<double>(pairs.size()) / 256;
  double chi = 0.0;
  for (double c : cells) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

TEST(RngTest, DrawsOfDifferentSitesAreJointlyUniformChiSquare) {
  const int n = 1 << 16;
  std::vector<std::pair<double, double>> sample_accept, next_position, next_seed, first_second;
  for (int i = 0; i < n; ++i) {
    const uint64_t seed = 7 + static_cast<uint64_t>(i / 8192);
    const int64_t position = i % 8192;
    Rng site = Rng::at(seed, position, RngStream::kSample);
    const double u = site.next_double();
    sample_accept.push_back({u, Rng::at(seed, position, RngStream::kAccept).next_double()});
    next_position.push_back({u, Rng::at(seed, position + 1, RngStream::kSample).next_double()});
    next_seed.push_back({u, Rng::at(seed + 1, position, RngStream::kSample).next_double()});
    first_second.push_back({u, site.next_double()});
  }
  EXPECT_LT(pair_chi_square(sample_accept), 400.0);
  EXPECT_LT(pair_chi_square(next_position), 400.0);
  EXPECT_LT(pair_chi_square(next_seed), 400.0);
  EXPECT_LT(pair_chi_square(first_second), 400.0);
  // The check has power: a pair of a draw with itself fills only the diagonal.
  std::vector<std::pair<double, double>> same;
  for (const auto& [a, b] : sample_accept) same.push_back({a, a});
  EXPECT_GT(pair_chi_square(same), 1e5);
}

}  // namespace
}  // namespace arbor::sampling
