// Reductions over the last dimension (per row) and the first dimension (per column, the shape of
// every bias gradient), plus the global sum of squares behind gradient-norm clipping. Each has a
// fixed summation order, so results do not depend on the number of threads.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[N] = sum over c of inp[N, C].
void sum_last_dim(float* out, const float* inp, int64_t N, int64_t C);

// out[N] = mean over c of inp[N, C].
void mean_last_dim(float* out, const float* inp, int64_t N, int64_t C);

// out[N] = max over c of inp[N, C]; argmax[N] (optional, may be nullptr) gets the first index of
// the maximum. A row containing NaN yields NaN and the index of its first NaN. C must be >= 1.
void max_last_dim(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C);

// out[outer, inner] = the sum over m of inp[outer, mid, inner], added in m order from zero (a
// dimension's sum, ops::sum's bits).
void sum_dim(float* out, const float* inp, int64_t outer, int64_t mid, int64_t inner);

// out[n] = a[n] + row[n % width]: a row (a bias, a position table) added to every row of a.
void add_rows(float* out, const float* a, const float* row, int64_t n, int64_t width);

// out[C] = sum over n of inp[N, C], or out[C] += that sum when accumulate (bias gradients).
void sum_first_dim(float* out, const float* inp, int64_t N, int64_t C, bool accumulate = false);

// out[C] = mean over n of inp[N, C].
void mean_first_dim(float* out, const float* inp, int64_t N, int64_t C);

// Sum of x[i]^2 over n elements, accumulated in double in a fixed chunk order.
double sum_squares(const float* x, int64_t n);

// Sum of x[i] over n elements, accumulated in double in a fixed chunk order.
double sum_all(const float* x, int64_t n);

}  // namespace meshtrain::cpu
