// The random generators used for sampling.
//
// Two ways to get one:
//  * Rng(seed): a stateful stream. Each request used to own one and the Sampler draws exactly
//    one value from it per sampled token, so draws depend on how many were made before; the
//    scheduler still uses it until it is switched to counter-based draws.
//  * Rng::at(seed, position, stream): counter-based. The generator is a pure function of the
//    request's seed, the absolute position of the token being produced (index in prompt +
//    generated tokens) and the purpose of the draw (RngStream), so a draw never depends on how
//    many draws a step made, on speculation, on the batch or on the thread. Its first
//    next_double() is "the draw at that site".
//
// Generator: xoshiro256** (Blackman & Vigna). Rng(seed) initialises the state with splitmix64.
// Rng::at fills the 256-bit state with two blocks of Philox4x32-10 (Salmon, Moraes, Dror &
// Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11): key = the 64-bit seed, counter =
// (position low 32 bits, position high 32 bits, stream, block 0 or 1). Why Philox: it is a
// well-studied counter-based generator (passes TestU01 BigCrush with 10 rounds; used by
// cuRAND, PyTorch and TensorFlow) and, for a fixed key, a bijection of the 128-bit counter,
// so two different (position, stream) sites of one seed never get the same state. Checked against
// Random123's published known-answer vectors (tests/sampling/rng_test.cc).
//
// Not thread-safe; cheap to copy (32 bytes). Never share a stateful Rng between requests.
#pragma once

#include <array>
#include <cstdint>

namespace arbor::sampling {

// What a counter-based draw is for. Distinct streams at one position are independent draws.
enum class RngStream : uint32_t {
  kSample = 0,   // the token sampled at a position (plain decoding, bonus, sample-and-compare)
  kAccept = 1,   // the accept/reject coin of a model draft at a position
  kRecover = 2,  // the recovered token drawn from the residual after a rejection
  kDraft = 3,    // a draft model's own draw of its proposal at a position
  // Token trees (rejection_sampler.h): several children are tried at one position, so their sites
  // get an index; the first uses the chain's stream, so a width-1 tree draws the chain's sites.
  kTreeAccept = 1u << 16,  // base of tree_accept_stream(i), i >= 1
  kTreeDraft = 2u << 16,   // base of tree_draft_stream(j), j >= 1
};

// Site streams of token trees, i in [0, 65536) (CHECKed):
//  * tree_accept_stream(i): the accept coin of the i-th child tried at the tree node being
//    verified (i counts tries at that node from 0): kAccept for i = 0, kTreeAccept + i - 1 after.
//  * tree_draft_stream(j): a sampled tree's proposer's j-th draw at one position (j counts
//    every child drawn at that depth, over all parents, from 0): kDraft for j = 0,
//    kTreeDraft + j - 1 after.
RngStream tree_accept_stream(int32_t i);
RngStream tree_draft_stream(int32_t j);

// Philox4x32 with 10 rounds: one 128-bit block for (counter, key).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key);

class Rng {
 public:
  explicit Rng(uint64_t seed);

  // The generator of draw site (seed, position, stream): a pure function of the three.
  // position: absolute index, in prompt + generated tokens, of the token being produced.
  static Rng at(uint64_t seed, int64_t position, RngStream stream);

  // A seed from the OS entropy source, for requests without one.
  static uint64_t random_seed();

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  Rng() = default;

  uint64_t s_[4];
};

}  // namespace arbor::sampling
