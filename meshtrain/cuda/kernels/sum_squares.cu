// Two passes with a fixed geometry: kSumSquaresScratch blocks each sum a grid-stride share of the
// elements into one double (a fixed tree inside the block), then one block combines the partial
// sums in a fixed tree. Neither depends on timing, so the result is the same on every run.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/sum_squares.h"

namespace meshtrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline double block_sum_double(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const double v = x[i];
    acc += v * v;
  }
  const double total = block_sum_double(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_squares_final_kernel(double* out, const double* partial, int64_t parts) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < parts; i += kThreads) acc += partial[i];
  const double total = block_sum_double(acc, shared);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

void sum_squares(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream) {
  sum_squares_partial_kernel<<<static_cast<unsigned>(kSumSquaresScratch), kThreads, 0, stream>>>(
      scratch, x, n);
  MT_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch, kSumSquaresScratch);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
