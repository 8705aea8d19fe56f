// Rows are independent and each belongs to one thread; the mean is summed serially in row order,
// so nothing depends on the thread count. V need not be a multiple of the vector width: the
// vectorised loops carry their own remainders.
#include "meshtrain/tensor/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/cpu/vec_math.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

void check_targets(const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index) {
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    MT_CHECK(t == ignore_index || (t >= 0 && t < V), "cross_entropy: target ", t, " at row ", n,
             " is outside [0, ", V, ")");
  }
}

void check_smoothing(float label_smoothing) {
  MT_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f,
           "cross_entropy: label_smoothing must be in [0, 1), got ", label_smoothing);
}

}  // namespace

int64_t cross_entropy_count(const int32_t* targets, int64_t N, int32_t ignore_index) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index ? 1 : 0;
  return count;
}

float cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int64_t N, int64_t V, int32_t ignore_index, float label_smoothing) {
  KernelTimer timer(KernelKind::elementwise);
  MT_CHECK(V >= 1, "cross_entropy: empty vocabulary");
  check_targets(targets, N, V, ignore_index);
  check_smoothing(label_smoothing);
  const float eps = label_smoothing;
#pragma omp parallel for schedule(static) if (worth_parallel(N * V * 2))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += exp_nonpositive(x[v] - m);
    const float l = m + std::log(sum);
    lse[n] = l;
    const int32_t t = targets[n];
    if (t == ignore_index) {
      losses[n] = 0.0f;
    } else if (eps == 0.0f) {
      losses[n] = l - x[t];
    } else {
      // -log p summed over the classes is V * lse - sum(row): one more pass, no exp.
      float row_sum = 0.0f;
#pragma omp simd reduction(+ : row_sum)
      for (int64_t v = 0; v < V; ++v) row_sum += x[v];
      losses[n] = (1.0f - eps) * (l - x[t]) + eps * (l - row_sum / static_cast<float>(V));
    }
  }
  double total = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    total += losses[n];
    ++count;
  }
  if (count == 0) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(total / static_cast<double>(count));
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t N, int64_t V,
                            int32_t ignore_index, float label_smoothing) {
  KernelTimer timer(KernelKind::elementwise);
  check_targets(targets, N, V, ignore_index);
  check_smoothing(label_smoothing);
  const int64_t count = cross_entropy_count(targets, N, ignore_index);
  const float g = count == 0 ? 0.0f : dloss / static_cast<float>(count);
#pragma omp parallel for schedule(static) if (worth_parallel(N * V * 2))
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    float* dx = dlogits + n * V;
    if (t == ignore_index) {
      std::fill(dx, dx + V, 0.0f);
      continue;
    }
    const float* x = logits + n * V;
    const float l = lse[n];
    const float uniform = label_smoothing / static_cast<float>(V);
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dx[v] = (exp_nonpositive(x[v] - l) - uniform) * g;
    dx[t] -= (1.0f - label_smoothing) * g;
  }
}

}  // namespace meshtrain::cpu
