// Same formulation as the CPU kernel: 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), with the
// exponent clamped so that neither side overflows.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
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

struct GeluForward {
  __device__ float operator()(float x) const { return x * half_one_plus_tanh(x); }
};

struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    const float s = half_one_plus_tanh(x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return (s + 2.0f * x * s * (1.0f - s) * du) * dout;
  }
};

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  detail::map(out, inp, n, GeluForward{}, stream);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   cudaStream_t stream) {
  detail::map(dinp, inp, dout, n, GeluBackward{}, stream);
}

}  // namespace meshtrain::cuda
