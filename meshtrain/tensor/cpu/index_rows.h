// Rows of a [*, C] matrix moved by an index: what a mixture-of-experts layer does between its
// tokens and its experts' rows. The device's kernels (cuda/kernels/index_rows.h) have the same
// semantics and, where no product is summed, the same bits.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[i, :] = src[rows[i], :] for i < n.
void gather_rows(float* out, const float* src, const int32_t* rows, int64_t n, int64_t C);

// out[rows[i], :] += weights[i] * src[i, :] (src[i, :] when weights is null) for i < n, in i
// order. No two of the n rows may be the same (each output row is then one thread's, on the
// device too), so a sum over several calls runs in call order.
void scatter_add_rows(float* out, const float* src, const int32_t* rows, const float* weights,
                      int64_t n, int64_t C);

// The backward of out[rows[m], :] += weights[m] * src[m, :] over m < n: dsrc[m, :] =
// weights[m] * dout[rows[m], :] and dweights[m] = the dot product of dout[rows[m], :] and
// src[m, :], summed in double in column order.
void weighted_rows_backward(float* dsrc, float* dweights, const float* dout, const float* src,
                            const float* weights, const int32_t* rows, int64_t n, int64_t C);

}  // namespace meshtrain::cpu
