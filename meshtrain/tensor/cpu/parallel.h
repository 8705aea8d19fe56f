// Small helpers that keep the kernels' OpenMP use uniform: when a loop is worth parallelising,
// and fixed chunking so that reductions do not depend on how many threads run them.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// Below this many scalar operations a parallel region costs more than it saves.
inline constexpr int64_t kParallelMinWork = 1 << 15;

inline bool worth_parallel(int64_t work) {
  return work >= kParallelMinWork;
}

// Reductions over a flat array are cut into kReduceChunks pieces whose bounds depend only on n;
// each piece is summed alone and the partial sums are added in piece order.
inline constexpr int kReduceChunks = 64;

inline int64_t chunk_begin(int64_t n, int chunk, int chunks) {
  return n * chunk / chunks;
}

}  // namespace meshtrain::cpu
