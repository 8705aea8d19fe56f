// The blocks of a multi-tensor launch: up to N arrays go to one kernel, array i taking
// ceil(n_i / kChunk) blocks of kChunk elements each, so that one launch covers many small arrays
// and a large one still spreads over the device. The plan travels in the kernel's argument beside
// the arrays' pointers; each block finds its array and its range from it.
#pragma once

#include <cstdint>

namespace meshtrain::cuda::detail {

template <int N, int64_t kChunk>
struct BlockPlan {
  int64_t n[N];
  int first_block[N + 1];  // blocks of array i: [first_block[i], first_block[i + 1])
  int count;

  // Plans the next array (n > 0 elements); returns its index.
  int add(int64_t len) {
    const int k = count;
    n[k] = len;
    first_block[k + 1] = first_block[k] + static_cast<int>((len + kChunk - 1) / kChunk);
    count = k + 1;
    return k;
  }
  bool full() const { return count == N; }
  unsigned blocks() const { return static_cast<unsigned>(first_block[count]); }

  // This block's array, and its elements [begin, end) of it.
  __device__ int locate(int64_t& begin, int64_t& end) const {
    int i = 0;
    while (i + 1 < count && static_cast<int>(blockIdx.x) >= first_block[i + 1]) ++i;
    begin = (static_cast<int64_t>(blockIdx.x) - first_block[i]) * kChunk;
    end = begin + kChunk < n[i] ? begin + kChunk : n[i];
    return i;
  }
};

}  // namespace meshtrain::cuda::detail
