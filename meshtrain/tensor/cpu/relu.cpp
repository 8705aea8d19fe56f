// Elementwise, so any split across threads gives the same bits.
#include "meshtrain/tensor/cpu/relu.h"

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::cpu {

void relu_forward(float* out, const float* inp, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for simd schedule(static) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    // x < 0 is false for NaN, so NaN passes through as in PyTorch (std::max would drop it).
    out[i] = x < 0.0f ? 0.0f : x;
  }
}

void relu_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for simd schedule(static) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

}  // namespace meshtrain::cpu
