// Row reductions give each row to one thread; column reductions give each block of columns to one
// thread, which walks the rows in order. Flat reductions use parallel.h's fixed chunks.
#include "meshtrain/tensor/cpu/reduce.h"

#include <algorithm>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

// Columns per block in sum_first_dim: 16 AVX registers' worth, so the block's running sums stay in
// registers (or at worst in L1) while the rows stream past.
constexpr int64_t kColumnBlock = 64;

float row_sum(const float* x, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

template <typename Term>
double chunked_double_sum(int64_t n, Term term) {
  double partial[kReduceChunks];
#pragma omp parallel for schedule(static) if (worth_parallel(n))
  for (int k = 0; k < kReduceChunks; ++k) {
    const int64_t lo = chunk_begin(n, k, kReduceChunks);
    const int64_t hi = chunk_begin(n, k + 1, kReduceChunks);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += term(i);
    partial[k] = s;
  }
  double total = 0.0;
  for (int k = 0; k < kReduceChunks; ++k) total += partial[k];
  return total;
}

}  // namespace

void sum_last_dim(float* out, const float* inp, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t i = 0; i < N; ++i) out[i] = row_sum(inp + i * C, C);
}

void mean_last_dim(float* out, const float* inp, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  const float inv = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t i = 0; i < N; ++i) out[i] = row_sum(inp + i * C, C) * inv;
}

void max_last_dim(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  MT_CHECK(C >= 1, "max_last_dim: empty rows");
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float m = x[0];
    int64_t at = 0;
    for (int64_t c = 1; c < C && m == m; ++c) {
      if (x[c] > m || x[c] != x[c]) {
        m = x[c];
        at = c;
      }
    }
    out[i] = m;
    if (argmax != nullptr) argmax[i] = static_cast<int32_t>(at);
  }
}

void sum_first_dim(float* out, const float* inp, int64_t N, int64_t C, bool accumulate) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (worth_parallel(N * C) && blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, C - c0);
    float acc[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = inp + n * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) acc[c] += row[c];
    }
    float* dst = out + c0;
    if (accumulate) {
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) dst[c] += acc[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) dst[c] = acc[c];
    }
  }
}

void mean_first_dim(float* out, const float* inp, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  sum_first_dim(out, inp, N, C, false);
  const float inv = 1.0f / static_cast<float>(N);
  for (int64_t c = 0; c < C; ++c) out[c] *= inv;
}

double sum_squares(const float* x, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  return chunked_double_sum(n, [x](int64_t i) {
    const double v = x[i];
    return v * v;
  });
}

double sum_all(const float* x, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  return chunked_double_sum(n, [x](int64_t i) { return static_cast<double>(x[i]); });
}

void sum_dim(float* out, const float* inp, int64_t outer, int64_t mid, int64_t inner) {
  KernelTimer timer(KernelKind::elementwise);
  std::fill(out, out + outer * inner, 0.0f);
#pragma omp parallel for if (outer * mid * inner > (int64_t{1} << 15)) schedule(static)
  for (int64_t i = 0; i < outer; ++i) {
    float* orow = out + i * inner;
    for (int64_t m = 0; m < mid; ++m) {
      const float* prow = inp + (i * mid + m) * inner;
      for (int64_t j = 0; j < inner; ++j) orow[j] += prow[j];
    }
  }
}

void add_rows(float* out, const float* a, const float* row, int64_t n, int64_t width) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t rows = width == 0 ? 0 : n / width;
#pragma omp parallel for if (n > (int64_t{1} << 15)) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) out[r * width + j] = a[r * width + j] + row[j];
}

}  // namespace meshtrain::cpu
