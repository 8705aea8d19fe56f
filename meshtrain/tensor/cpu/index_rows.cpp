// Each output row is one thread's (scatter_add_rows' rows are distinct), so nothing depends on
// the thread count.
#include "meshtrain/tensor/cpu/index_rows.h"

#include <cstring>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::cpu {

void gather_rows(float* out, const float* src, const int32_t* rows, int64_t n, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(n * C))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * C, src + int64_t{rows[i]} * C, sizeof(float) * static_cast<size_t>(C));
}

void scatter_add_rows(float* out, const float* src, const int32_t* rows, const float* weights,
                      int64_t n, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(n * C))
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + int64_t{rows[i]} * C;
    const float* s = src + i * C;
    if (weights == nullptr) {
      for (int64_t c = 0; c < C; ++c) o[c] += s[c];
    } else {
      const float w = weights[i];
      for (int64_t c = 0; c < C; ++c) o[c] += w * s[c];
    }
  }
}

void weighted_rows_backward(float* dsrc, float* dweights, const float* dout, const float* src,
                            const float* weights, const int32_t* rows, int64_t n, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(n * C))
  for (int64_t m = 0; m < n; ++m) {
    const float* row = dout + int64_t{rows[m]} * C;
    const float w = weights[m];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      dsrc[m * C + c] = w * row[c];
      dot += static_cast<double>(row[c]) * src[m * C + c];
    }
    dweights[m] = static_cast<float>(dot);
  }
}

}  // namespace meshtrain::cpu
