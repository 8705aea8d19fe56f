// OpenBLAS is the OpenMP build: inside an OpenMP parallel region it runs single-threaded, outside
// one it uses omp_get_max_threads() threads. matmul_batched relies on the first behaviour.
#include "meshtrain/tensor/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <string>

#include "meshtrain/tensor/cpu/gemm_onednn.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

// Below this many multiply-adds per matrix, one sgemm gains little from several threads, so a
// batch of them is better split across threads one matrix each.
constexpr int64_t kSmallGemmMacs = int64_t{1} << 22;

std::atomic<GemmBackend>& backend() {
  static std::atomic<GemmBackend> b{GemmBackend::onednn};
  return b;
}

void sgemm(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
           bool trans_a, bool trans_b, float alpha, float beta) {
  gemm(trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, b, trans_b ? K : N, beta, out, N);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  KernelTimer timer(KernelKind::gemm);
  if (M <= 0 || N <= 0) return;
  if (K > 0 && backend().load(std::memory_order_relaxed) == GemmBackend::onednn) {
    gemm_onednn::gemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (beta == 0.0f) {
    if (ldc == N) {
      std::memset(c, 0, static_cast<size_t>(M * N) * sizeof(float));
    } else {
      for (int64_t i = 0; i < M; ++i)
        std::memset(c + i * ldc, 0, static_cast<size_t>(N) * sizeof(float));
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void matmul(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha, float beta) {
  KernelTimer timer(KernelKind::gemm);
  MT_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul: negative size ", M, "x", N, "x", K);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // sgemm would leave beta*out; spell it out since some BLAS skip the scaling when K == 0.
    for (int64_t i = 0; i < M * N; ++i) out[i] = beta == 0.0f ? 0.0f : beta * out[i];
    return;
  }
  sgemm(out, a, b, M, N, K, trans_a, trans_b, alpha, beta);
}

void matmul_batched(float* out, const float* a, const float* b, int64_t batch, int64_t M, int64_t N,
                    int64_t K, bool trans_a, bool trans_b, int64_t stride_out, int64_t stride_a,
                    int64_t stride_b, float alpha, float beta) {
  KernelTimer timer(KernelKind::gemm);
  MT_CHECK(batch >= 0, "matmul_batched: negative batch ", batch);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < batch; ++i)
      matmul(out + i * stride_out, a, b, M, N, 0, false, false, alpha, beta);
    return;
  }
  const bool spread = batch > 1 && M * N * K < kSmallGemmMacs && omp_get_max_threads() > 1;
  if (spread) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch; ++i) {
      sgemm(out + i * stride_out, a + i * stride_a, b + i * stride_b, M, N, K, trans_a, trans_b,
            alpha, beta);
    }
  } else {
    for (int64_t i = 0; i < batch; ++i) {
      sgemm(out + i * stride_out, a + i * stride_a, b + i * stride_b, M, N, K, trans_a, trans_b,
            alpha, beta);
    }
  }
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t BT, int64_t C_in, int64_t C_out) {
  KernelTimer timer(KernelKind::gemm);
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed every row with the bias and let sgemm add the product on top (beta = 1): one pass
    // over out instead of a second sweep afterwards.
#pragma omp parallel for schedule(static) if (worth_parallel(BT * C_out))
    for (int64_t i = 0; i < BT; ++i) {
      float* row = out + i * C_out;
#pragma omp simd
      for (int64_t j = 0; j < C_out; ++j) row[j] = bias[j];
    }
    beta = 1.0f;
  }
  matmul(out, inp, weight, BT, C_out, C_in, false, true, 1.0f, beta);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int64_t C_in, int64_t C_out) {
  KernelTimer timer(KernelKind::gemm);
  if (dinp != nullptr) matmul(dinp, dout, weight, BT, C_in, C_out, false, false, 1.0f, 1.0f);
  if (dweight != nullptr) matmul(dweight, dout, inp, C_out, C_in, BT, true, false, 1.0f, 1.0f);
  if (dbias != nullptr) sum_first_dim(dbias, dout, BT, C_out, /*accumulate=*/true);
}

void set_gemm_backend(GemmBackend b) {
  backend().store(b, std::memory_order_relaxed);
}

GemmBackend gemm_backend() {
  return backend().load(std::memory_order_relaxed);
}

std::string blas_config() {
  std::string s = openblas_get_config();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string gemm_config() {
  return gemm_backend() == GemmBackend::onednn ? "GEMM " + gemm_onednn::config()
                                               : "BLAS " + blas_config();
}

}  // namespace meshtrain::cpu
