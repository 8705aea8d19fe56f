// Rows are independent and each belongs to one thread; within a row the order is fixed, so
// nothing depends on the thread count.
#include "meshtrain/tensor/cpu/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/vocab_parallel_loss_mean.h"

namespace meshtrain::cpu {

void vocab_parallel_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * valid))
  for (int64_t n = 0; n < N; ++n) {
    float m = -std::numeric_limits<float>::infinity();
    const float* l = logits + n * V;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, l[v]);
    max[n] = m;
  }
}

void vocab_parallel_row_sums(float* sum, float* target_logit, const float* logits, const float* max,
                             const int32_t* targets, int64_t N, int64_t V, int64_t valid,
                             int64_t begin, int32_t ignore_index) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * valid))
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    double s = 0;
    for (int64_t v = 0; v < valid; ++v) s += std::exp(l[v] - max[n]);
    sum[n] = static_cast<float>(s);
    const int64_t col = static_cast<int64_t>(targets[n]) - begin;
    target_logit[n] = targets[n] != ignore_index && col >= 0 && col < valid ? l[col] : 0.0f;
  }
}

void vocab_parallel_loss_mean(float* out, const float* max, const float* sum,
                              const float* target_logit, const int32_t* targets, int64_t N,
                              int32_t ignore_index) {
  KernelTimer timer(KernelKind::elementwise);
  vocab_parallel_loss_mean_rows(out, max, sum, target_logit, targets, N, ignore_index);
}

void vocab_parallel_backward(float* dlogits, const float* logits, const float* max,
                             const float* sum, const int32_t* targets, int64_t N, int64_t V,
                             int64_t valid, int64_t begin, int32_t ignore_index, float scale) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    float* d = dlogits + n * V;
    if (targets[n] == ignore_index) {
      std::fill(d, d + V, 0.0f);
      continue;
    }
    const float inv = 1.0f / sum[n];
    for (int64_t v = 0; v < valid; ++v) d[v] = std::exp(l[v] - max[n]) * inv * scale;
    std::fill(d + valid, d + V, 0.0f);
    const int64_t col = static_cast<int64_t>(targets[n]) - begin;
    if (col >= 0 && col < valid) d[col] -= scale;
  }
}

}  // namespace meshtrain::cpu
