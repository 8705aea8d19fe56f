// Grid-stride loops: each output element depends only on its own inputs.
#include "meshtrain/cuda/check.h"
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

// A block covers 32 columns with 32 x 8 threads: thread (x, y) sums rows y, y + 8, ... of column
// x, then the 8 partial sums combine in a fixed order.
__global__ void column_sum_kernel(float* out, const float* a, int64_t N, int64_t C) {
  __shared__ float partial[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  float s = 0.0f;
  if (c < C) {
    for (int64_t r = threadIdx.y; r < N; r += 8) s += a[r * C + c];
  }
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int k = 0; k < 8; ++k) t += partial[k][threadIdx.x];
    out[c] += t;
  }
}

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
  if (N <= 0 || C <= 0) return;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((C + 31) / 32));
  column_sum_kernel<<<grid, block, 0, stream>>>(out, a, N, C);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
