// Inverted dropout with a counter-based generator: element i is kept or dropped by a hash of
// (seed, offset + i) alone, so the mask does not depend on the thread count and the backward
// regenerates it from the seed instead of storing it.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// True when element `index` survives dropout with probability p under `seed`.
bool dropout_keep(uint64_t seed, uint64_t index, float p);

// out[n] = keep(i) ? inp[n] / (1 - p) : 0, where keep uses element index offset + i. p in [0, 1];
// p == 1 drops everything. offset lets several tensors share one seed without sharing a mask.
void dropout_forward(float* out, const float* inp, int64_t n, float p, uint64_t seed,
                     uint64_t offset = 0);

// dinp[n] += keep(i) ? dout[n] / (1 - p) : 0, with the forward's p, seed and offset.
void dropout_backward(float* dinp, const float* dout, int64_t n, float p, uint64_t seed,
                      uint64_t offset = 0);

}  // namespace meshtrain::cpu
