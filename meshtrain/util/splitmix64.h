// A counter-based random source: the n-th draw of a stream is a pure function of (key, n), so
// every machine, thread or restarted process that knows the key reproduces the same numbers
// without carrying generator state. Used where determinism across ranks matters (data order).
#pragma once

#include <cstdint>

namespace meshtrain {

// The splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The n-th output of the splitmix64 sequence whose state starts at `key`.
constexpr uint64_t splitmix64_at(uint64_t key, uint64_t n) {
  return splitmix64_mix(key + (n + 1) * 0x9e3779b97f4a7c15ULL);
}

// Derives an independent stream key from a seed and a sub-stream id (e.g. an epoch).
constexpr uint64_t splitmix64_key(uint64_t seed, uint64_t stream) {
  return splitmix64_mix(splitmix64_mix(seed) ^ splitmix64_at(stream, 0x5eed));
}

// A uniform integer in [0, bound) from one 64-bit draw (multiply-shift; bias < bound / 2^64).
constexpr uint64_t bounded(uint64_t draw, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(draw) * bound) >> 64);
}

}  // namespace meshtrain
