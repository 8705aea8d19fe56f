// The output size of a sliding window (convolution, pooling), shared so that every image kernel
// and op rounds it the same way, PyTorch's way (floor; ceil_mode=False).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// floor((in + 2 * pad - extent) / stride) + 1 positions of a window spanning `extent` inputs, or 0
// when it does not fit the padded input at all (C++ division would round -1 / 2 up to 0).
inline int64_t window_out_size(int64_t in, int64_t pad, int64_t extent, int64_t stride) {
  const int64_t span = in + 2 * pad - extent;
  return span < 0 ? 0 : span / stride + 1;
}

}  // namespace meshtrain::cpu
