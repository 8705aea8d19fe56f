// Dropout's mask as a function of (seed, element index) alone: the splitmix64 finaliser over the
// seed-mixed index, its top 24 bits a uniform float in [0, 1). The CPU's kernel and the device's
// include this one definition, so a mask is the same bits on either, whatever the threads or the
// launch geometry, and the backward regenerates it instead of storing it.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/host_device.h"

namespace meshtrain::dropout_mask {

MESHTRAIN_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The seed's part of every element's hash; kernels compute it once.
MESHTRAIN_HOST_DEVICE inline uint64_t mixed_seed(uint64_t seed) {
  return mix64(seed);
}

// Uniform in [0, 1) for element `index` (24 random bits: exact in a float).
MESHTRAIN_HOST_DEVICE inline float uniform(uint64_t mixed, uint64_t index) {
  const uint64_t h = mix64(mixed + (index + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// The factor kept elements are multiplied by: 1 / (1 - p), or 0 when everything is dropped.
MESHTRAIN_HOST_DEVICE inline float keep_scale(float p) {
  return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

// Element `index` (offset included) of inverted dropout: kept (times scale) when its uniform
// draw is at least p.
MESHTRAIN_HOST_DEVICE inline float apply(float x, uint64_t mixed, uint64_t index, float p,
                                         float scale) {
  return uniform(mixed, index) >= p ? x * scale : 0.0f;
}

}  // namespace meshtrain::dropout_mask

#undef MESHTRAIN_HOST_DEVICE
