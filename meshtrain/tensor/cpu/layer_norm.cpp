// Rows are independent, so the forward and the input gradient split rows across threads. The
// parameter gradients sum over rows; to keep that sum in row order whatever the thread count,
// several threads compute them in a second pass over column blocks, and a single thread fuses them
// into the row pass (same additions in the same order, so the same bits).
#include "meshtrain/tensor/cpu/layer_norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::cpu {
namespace {

constexpr int64_t kColumnBlock = 64;

void accumulate_param_grads(float* dweight, float* dbias, const float* dout, const float* x,
                            float m, float s, int64_t c0, int64_t c1) {
  if (dweight != nullptr) {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) dweight[c] += dout[c] * ((x[c] - m) * s);
  }
  if (dbias != nullptr) {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) dbias[c] += dout[c];
  }
}

}  // namespace

void layer_norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int64_t N, int64_t C, float eps) {
  KernelTimer timer(KernelKind::elementwise);
  // Means are divided, not multiplied by a rounded 1 / C: a row of equal values then has its
  // value as its mean exactly and normalises to 0 (1000.25 over 7 columns gave -0.019, an ulp
  // of the mean times rstd = 1 / sqrt(eps)); the device divides too.
  const float c_f = static_cast<float>(C);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float* y = out + n * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const float m = sum / c_f;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) {
      const float d = x[c] - m;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq / c_f + eps);
    if (weight != nullptr && bias != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    } else if (weight != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c];
    } else if (bias != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s + bias[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s;
    }
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = s;
  }
}

void layer_norm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, bool accumulate) {
  KernelTimer timer(KernelKind::elementwise);
  const bool threaded = worth_parallel(N * C) && omp_get_max_threads() > 1;
  const bool params = dweight != nullptr || dbias != nullptr;
  const float c_f = static_cast<float>(C);
  if (dinp != nullptr || (params && !threaded)) {
#pragma omp parallel for schedule(static) if (threaded)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* g = dout + n * C;
      const float m = mean[n];
      const float s = rstd[n];
      if (dinp != nullptr) {
        // dnorm = dout * weight; dinp = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd.
        float sum_dnorm = 0.0f;
        float sum_dnorm_norm = 0.0f;
#pragma omp simd reduction(+ : sum_dnorm, sum_dnorm_norm)
        for (int64_t c = 0; c < C; ++c) {
          const float dn = weight != nullptr ? g[c] * weight[c] : g[c];
          sum_dnorm += dn;
          sum_dnorm_norm += dn * ((x[c] - m) * s);
        }
        const float a = sum_dnorm / c_f;
        const float b = sum_dnorm_norm / c_f;
        float* dx = dinp + n * C;
        if (accumulate) {
          // The row's gradient goes through memory before the sum, so that the compiler cannot
          // fuse its last product into the addition: the bits of writing it and adding apart.
          thread_local std::vector<float> row;
          row.resize(static_cast<size_t>(C));
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float dn = weight != nullptr ? g[c] * weight[c] : g[c];
            row[c] = (dn - a - ((x[c] - m) * s) * b) * s;
          }
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dx[c] += row[c];
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float dn = weight != nullptr ? g[c] * weight[c] : g[c];
            dx[c] = (dn - a - ((x[c] - m) * s) * b) * s;
          }
        }
      }
      if (params && !threaded) accumulate_param_grads(dweight, dbias, g, x, m, s, 0, C);
    }
  }
  if (params && threaded) {
    const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kColumnBlock;
      const int64_t c1 = std::min(C, c0 + kColumnBlock);
      for (int64_t n = 0; n < N; ++n) {
        accumulate_param_grads(dweight, dbias, dout + n * C, inp + n * C, mean[n], rstd[n], c0, c1);
      }
    }
  }
}

}  // namespace meshtrain::cpu
