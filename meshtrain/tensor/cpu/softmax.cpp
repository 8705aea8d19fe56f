// Each row belongs to one thread, and the row's max and sum are vectorised reductions with a fixed
// order, so the output does not depend on the thread count.
#include "meshtrain/tensor/cpu/softmax.h"

#include <algorithm>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/cpu/vec_math.h"

namespace meshtrain::cpu {

void softmax_row_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = exp_nonpositive(x[i] - m);
    x[i] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C * 4))
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    std::copy(x, x + C, y);
    softmax_row_inplace(y, C);
  }
}

void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t r = 0; r < N; ++r) {
    const float* y = out + r * C;
    const float* g = dout + r * C;
    float* dx = dinp + r * C;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += g[c] * y[c];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dx[c] += y[c] * (g[c] - dot);
  }
}

}  // namespace meshtrain::cpu
