// Channels are independent, so every step splits channels across threads and each thread walks
// its channels' values in one fixed order: the double sums are the same for any thread count.
// Splitting one channel's reduction would help only below a few channels (a model's stem), where
// the layer is cheap anyway.
#include "meshtrain/tensor/cpu/batch_norm.h"

#include <cmath>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::cpu {

void batch_norm_statistics(double* sums, const float* inp, int64_t N, int64_t C, int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C * HW))
  for (int64_t c = 0; c < C; ++c) {
    double s1 = 0.0, s2 = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;
      // Per image in double lanes: the order within an image is fixed by the vector width of
      // this build, the same for every thread.
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t i = 0; i < HW; ++i) {
        const double v = x[i];
        s1 += v;
        s2 += v * v;
      }
    }
    sums[c] = s1;
    sums[C + c] = s2;
  }
}

void batch_norm_moments(float* mean, float* invstd, double* var, const double* sums, int64_t count,
                        int64_t C, double eps) {
  KernelTimer timer(KernelKind::elementwise);
  const double n = static_cast<double>(count);
  for (int64_t c = 0; c < C; ++c) {
    const double m = sums[c] / n;
    double v = sums[C + c] / n - m * m;
    if (v < 0.0) v = 0.0;  // S2/n - mean^2 cancels; rounding can take it below zero
    mean[c] = static_cast<float>(m);
    invstd[c] = static_cast<float>(1.0 / std::sqrt(v + eps));
    if (var != nullptr) var[c] = v;
  }
}

void batch_norm_apply(float* out, const float* inp, const float* mean, const float* invstd,
                      const float* weight, const float* bias, int64_t N, int64_t C, int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for collapse(2) schedule(static) if (worth_parallel(N * C * HW))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const float m = mean[c], s = invstd[c];
      const float w = weight != nullptr ? weight[c] : 1.0f;
      const float b = bias != nullptr ? bias[c] : 0.0f;
      const float* x = inp + (n * C + c) * HW;
      float* y = out + (n * C + c) * HW;
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) y[i] = (x[i] - m) * s * w + b;
    }
}

void batch_norm_backward_reduce(double* sums, const float* dout, const float* inp,
                                const float* mean, const float* invstd, int64_t N, int64_t C,
                                int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C * HW))
  for (int64_t c = 0; c < C; ++c) {
    const float m = mean[c], s = invstd[c];
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + (n * C + c) * HW;
      const float* g = dout + (n * C + c) * HW;
#pragma omp simd reduction(+ : sdy, sdyx)
      for (int64_t i = 0; i < HW; ++i) {
        const double dy = g[i];
        sdy += dy;
        sdyx += dy * static_cast<double>((x[i] - m) * s);
      }
    }
    sums[c] = sdy;
    sums[C + c] = sdyx;
  }
}

void batch_norm_backward_apply(float* dinp, const float* dout, const float* inp, const float* mean,
                               const float* invstd, const float* weight, const double* sums,
                               int64_t count, int64_t N, int64_t C, int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
  const double n_total = static_cast<double>(count);
#pragma omp parallel for collapse(2) schedule(static) if (worth_parallel(N * C * HW))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const float m = mean[c], s = invstd[c];
      const float k = (weight != nullptr ? weight[c] : 1.0f) * s;
      const float* x = inp + (n * C + c) * HW;
      const float* g = dout + (n * C + c) * HW;
      float* dx = dinp + (n * C + c) * HW;
      if (sums == nullptr) {
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) dx[i] = k * g[i];
        continue;
      }
      const float mean_dy = static_cast<float>(sums[c] / n_total);
      const float mean_dy_xhat = static_cast<float>(sums[C + c] / n_total);
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) {
        const float xhat = (x[i] - m) * s;
        dx[i] = k * (g[i] - mean_dy - xhat * mean_dy_xhat);
      }
    }
}

}  // namespace meshtrain::cpu
