// Numerically stable softmax over the last dimension (subtract the row maximum before exp).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[N, C] = softmax of each row of inp[N, C].
void softmax_forward(float* out, const float* inp, int64_t N, int64_t C);

// dinp[N, C] += out * (dout - sum_c(dout * out)), from the forward's output.
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);

// One row in place: x[0, n) becomes its softmax. Shared with the attention kernel.
void softmax_row_inplace(float* x, int64_t n);

}  // namespace meshtrain::cpu
