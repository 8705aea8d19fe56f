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

}  // namespace meshtrain::cuda
