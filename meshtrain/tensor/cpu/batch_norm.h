// Batch normalisation over NCHW arrays, per channel C over the N*H*W values of that channel, cut
// into the four steps a synchronised batch norm needs, so that only per-channel sums ever cross
// ranks (two C-long vectors forward, two backward):
//   forward   (a) local sums S1 = sum x, S2 = sum x^2        -> (totals over ranks)
//             (b) out = (x - mean) * invstd * weight + bias  with mean, invstd from the totals
//   backward  (c) local sums sum dy, sum dy * xhat           -> (totals over ranks)
//             (d) dx = weight * invstd * (dy - sum_dy / n - xhat * sum_dy_xhat / n)
// where xhat = (x - mean) * invstd and n is the total count per channel over all ranks. The local
// sums of (c) are also the gradients of bias and weight. Sums are accumulated in double, per
// channel in a fixed order (images, then positions), so results never depend on the thread count.
// The variance S2/n - mean^2 cancels: it loses about log10(mean^2 / var) of double's 16 digits,
// harmless unless a channel's mean exceeds its spread by many orders of magnitude (plain sums are
// what lets ranks combine statistics with one all-reduce; Welford's update would need a gather).
// Evaluation uses (b) with the running statistics and (d) without the statistics terms.
// Here HW stands for H * W.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// (a) sums[c] = sum of inp[:, c, :], sums[C + c] = sum of its squares (written; 2C doubles).
void batch_norm_statistics(double* sums, const float* inp, int64_t N, int64_t C, int64_t HW);

// mean[c] = S1 / count and invstd[c] = 1 / sqrt(var + eps), var = S2 / count - mean^2 clamped at 0
// (the biased variance), from the 2C sums of batch_norm_statistics over `count` values per channel
// (count >= 1). var[c] (may be nullptr) gets the biased variance, for the running statistics.
void batch_norm_moments(float* mean, float* invstd, double* var, const double* sums, int64_t count,
                        int64_t C, double eps);

// (b) out = (inp - mean[c]) * invstd[c] * weight[c] + bias[c]; weight and bias may be nullptr
// (1 and 0). out may alias inp.
void batch_norm_apply(float* out, const float* inp, const float* mean, const float* invstd,
                      const float* weight, const float* bias, int64_t N, int64_t C, int64_t HW);

// (c) sums[c] = sum of dout[:, c, :], sums[C + c] = sum of dout * xhat over the same values
// (written; 2C doubles).
void batch_norm_backward_reduce(double* sums, const float* dout, const float* inp,
                                const float* mean, const float* invstd, int64_t N, int64_t C,
                                int64_t HW);

// (d) dinp = weight[c] * invstd[c] * (dout - sums[c] / count - xhat * sums[C + c] / count), from
// the total sums of (c) over `count` values per channel (written). With sums == nullptr the mean
// and invstd were constants (evaluation) and dinp = weight[c] * invstd[c] * dout. weight may be
// nullptr (1).
void batch_norm_backward_apply(float* dinp, const float* dout, const float* inp, const float* mean,
                               const float* invstd, const float* weight, const double* sums,
                               int64_t count, int64_t N, int64_t C, int64_t HW);

}  // namespace meshtrain::cpu
