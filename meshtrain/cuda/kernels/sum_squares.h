// The sum of squares of a float array on the device, for the global gradient norm. Summed in
// double in a fixed order that depends only on n, so the same gradients give the same bits on every
// run, as the CPU reference (ops::sum_squares) promises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtrain::cuda {

// The number of doubles of device scratch that sum_squares needs.
constexpr int64_t kSumSquaresScratch = 256;

// *out (one double of device memory) = sum of x[i]^2 over n elements; scratch holds
// kSumSquaresScratch doubles.
void sum_squares(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream);

// out[i] = sum_squares of xs[i] (ns[i] elements) for i < count, each with the bits sum_squares
// gives it (the same partial sums, combined the same way), in a few launches instead of two per
// array; xs and ns are host arrays, out and scratch (count * kSumSquaresScratch doubles) device
// memory.
void sum_squares_many(double* out, double* scratch, const float* const* xs, const int64_t* ns,
                      int64_t count, cudaStream_t stream);

}  // namespace meshtrain::cuda
