// Grid-stride loops: each output element depends only on its own inputs.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/column_sums.cuh"
#include "meshtrain/cuda/kernels/elementwise.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

#define MT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void mul_kernel(float* out, const float* a, const float* b, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
__global__ void scale_kernel(float* out, const float* a, float s, int64_t n) {
  MT_GRID_STRIDE(i, n) out[i] = a[i] * s;
}
__global__ void axpy_kernel(float* y, const float* x, float alpha, int64_t n) {
  MT_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

// Element (r, c) of a row-major [N, C] array.
struct ElementOf {
  const float* a;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float* v) const { v[0] = a[r * C + c]; }
};

#undef MT_GRID_STRIDE

}  // namespace

void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, a, b, n);
  MT_CUDA_CHECK_LAUNCH();
}

void mul(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  mul_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, a, b, n);
  MT_CUDA_CHECK_LAUNCH();
}

void scale(float* out, const float* a, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, a, s, n);
  MT_CUDA_CHECK_LAUNCH();
}

void axpy(float* y, const float* x, float alpha, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  axpy_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(y, x, alpha, n);
  MT_CUDA_CHECK_LAUNCH();
}

void column_sum_accumulate(float* out, const float* a, int64_t N, int64_t C, cudaStream_t stream) {
  detail::column_sums_accumulate<1>({out}, N, C, ElementOf{a, C}, stream);
}

}  // namespace meshtrain::cuda
