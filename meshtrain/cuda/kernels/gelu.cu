// Same formulation as the CPU kernel: 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), with the
// exponent clamped so that neither side overflows.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ inline float half_one_plus_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + expf(fminf(fmaxf(-2.0f * u, -87.5f), 88.72283f)));
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    out[i] = x * half_one_plus_tanh(x);
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float s = half_one_plus_tanh(x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_forward_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, inp, n);
  MT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  gelu_backward_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(dinp, inp, dout, n);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
