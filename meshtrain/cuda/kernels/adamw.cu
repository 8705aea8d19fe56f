// The step's scalar factors are computed on the host in double and passed by value, exactly as
// the CPU kernel computes them; each element is then independent.
#include <cmath>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/adamw.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

struct AdamWScalars {
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bias2_sqrt, eps;
};

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    const float p = param[i] * s.decay;
    const float mi = m[i] * s.beta1 + g * s.one_minus_b1;
    const float vi = v[i] * s.beta2 + (g * g) * s.one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    param[i] = p + s.neg_step_size * (mi / (sqrtf(vi) / s.bias2_sqrt + s.eps));
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                cudaStream_t stream) {
  MT_CHECK(t >= 1, "adamw_step: step must be >= 1, got ", t);
  if (n <= 0) return;
  const double bias1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const AdamWScalars s{
      static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay),
      beta1,
      beta2,
      static_cast<float>(1.0 - beta1),
      static_cast<float>(1.0 - beta2),
      static_cast<float>(-(static_cast<double>(lr) / bias1)),
      static_cast<float>(std::sqrt(bias2)),
      eps,
  };
  adamw_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(param, grad, m, v, n, s);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
