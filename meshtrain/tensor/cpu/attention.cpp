// Work is split over the B*NH (batch, head) pairs, one pair per thread at a time, with sgemm
// single-threaded inside the parallel region (pairs write disjoint parts of out and dqkv, so
// there are no races and the result does not depend on the thread count). Products run in blocks
// of kBlock query rows so that most of the masked upper triangle is never computed.
#include "meshtrain/tensor/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/softmax.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

constexpr int64_t kBlock = 64;

void check_shape(int64_t C, int64_t NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not divisible by NH=", NH);
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  KernelTimer timer(KernelKind::attention);
  check_shape(C, NH);
  const int64_t HS = C / NH;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const float* q = qkv + b * T * C3 + h * HS;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = att + bh * T * T;
    float* o = out + b * T * C + h * HS;
    for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
      const int64_t i1 = std::min(T, i0 + kBlock);
      const int64_t rows = i1 - i0;
      // Scores for this row block against keys [0, i1): everything right of i1 is masked.
      gemm(false, true, rows, i1, HS, scale, q + i0 * C3, C3, k, C3, 0.0f, p + i0 * T, T);
      for (int64_t i = i0; i < i1; ++i) {
        float* row = p + i * T;
        softmax_row_inplace(row, i + 1);
        std::fill(row + i + 1, row + T, 0.0f);
      }
      gemm(false, false, rows, HS, i1, 1.0f, p + i0 * T, T, v, C3, 0.0f, o + i0 * C, C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  KernelTimer timer(KernelKind::attention);
  check_shape(C, NH);
  const int64_t HS = C / NH;
  const int64_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const float* q = qkv + b * T * C3 + h * HS;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * C3 + h * HS;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + bh * T * T;
    const float* g = dout + b * T * C + h * HS;
    float* ds = scratch + bh * T * T;
    for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
      const int64_t i1 = std::min(T, i0 + kBlock);
      const int64_t rows = i1 - i0;
      // dP = dout V^T, then through the softmax: dS = P * (dP - rowsum(P * dP)) * scale.
      gemm(false, true, rows, i1, HS, 1.0f, g + i0 * C, C, v, C3, 0.0f, ds + i0 * T, T);
      for (int64_t i = i0; i < i1; ++i) {
        const float* pr = p + i * T;
        float* dr = ds + i * T;
        const int64_t n = i + 1;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < n; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
        std::fill(dr + n, dr + i1, 0.0f);
      }
      // dQ[rows] = dS[rows, 0:i1] K[0:i1].
      gemm(false, false, rows, HS, i1, 1.0f, ds + i0 * T, T, k, C3, 0.0f, dq + i0 * C3, C3);
    }
    // dK[j-block] = dS[j0:T, j-block]^T Q[j0:T] and dV[j-block] = P[j0:T, j-block]^T dout[j0:T];
    // rows above j0 are masked for these keys, and the diagonal block's upper part is zero.
    for (int64_t j0 = 0; j0 < T; j0 += kBlock) {
      const int64_t j1 = std::min(T, j0 + kBlock);
      const int64_t cols = j1 - j0;
      gemm(true, false, cols, HS, T - j0, 1.0f, ds + j0 * T + j0, T, q + j0 * C3, C3, 0.0f,
           dk + j0 * C3, C3);
      gemm(true, false, cols, HS, T - j0, 1.0f, p + j0 * T + j0, T, g + j0 * C, C, 0.0f,
           dv + j0 * C3, C3);
    }
  }
}

}  // namespace meshtrain::cpu
