// Seeded random numbers for initialisation, dropout seeds and data order. Counter-based
// (splitmix64 over a 64-bit counter), so a stream is fully described by (seed, counter): it can
// be saved in a checkpoint and resumed exactly, and gives the same numbers on every machine.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

uint64_t splitmix64(uint64_t x);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t next_u64() { return splitmix64(seed_ ^ splitmix64(counter_++)); }
  // Uniform in [0, 1) with 24 random bits.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  // Standard normal (Box-Muller, in double).
  double normal();
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n);

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }
  void set_state(uint64_t seed, uint64_t counter) {
    seed_ = seed;
    counter_ = counter;
  }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// In-place initialisers for f32 tensors.
void normal_(Tensor& t, Generator& gen, double mean = 0.0, double std = 1.0);
void uniform_(Tensor& t, Generator& gen, double low = 0.0, double high = 1.0);
Tensor randn(const Shape& shape, Generator& gen);

}  // namespace meshtrain
