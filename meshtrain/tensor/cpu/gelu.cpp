// Elementwise, so any split across threads gives the same bits. The tanh goes through the identity
// 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), which costs one exp and one division and has no
// cancellation near zero, with the vectorisable exp of vec_math.h.
#include "meshtrain/tensor/cpu/gelu.h"

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/cpu/vec_math.h"

namespace meshtrain::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// exp's largest finite argument. Past it (x below about -10.3) the factor 1 / (1 + exp(-2u)) is
// below 2^-127 and GELU is -0 with a derivative of 0; the clamped exponent alone would make it
// x / FLT_MAX (-0.88 at x = -3e38) and its derivative inf or NaN once x^2 overflows.
constexpr float kTop = 88.72283f;

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for simd schedule(static) if (worth_parallel(n * 8))
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = -2.0f * u;
    out[i] = select(t > kTop, -0.0f, x / (1.0f + exp_in_range(clamp_to(t, -87.5f, kTop))));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for simd schedule(static) if (worth_parallel(n * 8))
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    // With s = 0.5 * (1 + tanh(u)): d/dx [x * s] = s + x * 2 * s * (1 - s) * du/dx. Where s is
    // exactly 1 (x above about 4.9) that is 1, unless du overflowed (0 * inf).
    const float t = -2.0f * u;
    const float s = 1.0f / (1.0f + exp_in_range(clamp_to(t, -87.5f, kTop)));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = s + 2.0f * x * s * (1.0f - s) * du;
    dinp[i] = select(t > kTop, 0.0f, select(s == 1.0f, 1.0f, grad)) * dout[i];
  }
}

}  // namespace meshtrain::cpu
