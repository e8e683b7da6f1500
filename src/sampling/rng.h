// The per-request random generator used for sampling.
//
// Each request owns one Rng, seeded from SamplingParams::seed (or a fresh random seed when the
// request gives none). The Sampler draws exactly one value from it per sampled token — greedy
// steps included — so a seeded request produces the same tokens whatever else is in the batch
// and whichever thread samples it. Never share an Rng between requests.
//
// Generator: xoshiro256** (Blackman & Vigna), state initialised with splitmix64 from the seed.
// Not thread-safe; cheap to copy (32 bytes).
#pragma once

#include <cstdint>

namespace arbor::sampling {

// The draw sites of one produced token (see Rng::at).
enum class RngStream : uint32_t { kSample = 0, kAccept = 1, kRecover = 2, kDraft = 3 };

class Rng {
 public:
  explicit Rng(uint64_t seed);
  // The generator of one draw site: a pure function of (seed, position, stream), so a result
  // never depends on how many draws earlier steps made. position: the index, in prompt +
  // generated tokens, of the token being produced.
  static Rng at(uint64_t seed, int64_t position, RngStream stream);

  // A seed from the OS entropy source, for requests without one.
  static uint64_t random_seed();

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

}  // namespace arbor::sampling
