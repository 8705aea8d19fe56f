// Rows moved by an index on the device, tensor/cpu/index_rows.h's semantics: a mixture of
// experts' dispatch of token rows to its experts and the gated sum of their outputs. Index arrays
// are device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// out[i, :] = src[rows[i], :] for i < n.
void gather_rows(float* out, const float* src, const int32_t* rows, int64_t n, int64_t C,
                 cudaStream_t stream);

// out[rows[i], :] += weights[i] * src[i, :] (no weights: src[i, :]); the rows are distinct, so
// each output element is one thread's and no atomics are needed.
void scatter_add_rows(float* out, const float* src, const int32_t* rows, const float* weights,
                      int64_t n, int64_t C, cudaStream_t stream);

// dsrc[m, :] = weights[m] * dout[rows[m], :]; dweights[m] = dot(dout[rows[m], :], src[m, :]),
// in double, one block a row in a fixed tree (the same bits every run; not the CPU's order).
void weighted_rows_backward(float* dsrc, float* dweights, const float* dout, const float* src,
                            const float* weights, const int32_t* rows, int64_t n, int64_t C,
                            cudaStream_t stream);

}  // namespace meshtrain::cuda
