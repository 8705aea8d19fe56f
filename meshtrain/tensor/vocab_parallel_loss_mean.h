// The vocabulary-parallel loss's mean from its rows combined over the tp group, one definition for
// the CPU's function and the device's one-thread kernel: the same loop in the same order.
#pragma once

#include <cmath>
#include <cstdint>

#include "meshtrain/tensor/host_device.h"

namespace meshtrain {

// out[0] = the mean over the rows not ignored of log(sum[n]) + max[n] - target_logit[n], added in
// double in row order (NaN where no row counts, or where a counted target is negative); out[1] =
// the count of those rows.
MESHTRAIN_HOST_DEVICE inline void vocab_parallel_loss_mean_rows(float* out, const float* max,
                                                                const float* sum,
                                                                const float* target_logit,
                                                                const int32_t* targets, int64_t N,
                                                                int32_t ignore_index) {
  double total = 0;
  int64_t count = 0;
  bool bad = false;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    bad = bad || targets[n] < 0;
    total += log(static_cast<double>(sum[n])) + max[n] - target_logit[n];
    ++count;
  }
  out[0] = count == 0 || bad ? NAN : static_cast<float>(total / static_cast<double>(count));
  out[1] = static_cast<float>(count);
}

}  // namespace meshtrain
