// matmul, matmul_batched and the Linear layer against naive double-precision loops. Tolerances:
// a float dot product of length K has relative error around sqrt(K) * 6e-8 of the summed
// magnitudes, so 1e-5 of the output scale plus 1e-5 relative is comfortably above it for K < 300.
#include "meshtrain/tensor/cpu/gemm.h"

#include <cmath>
#include <cstring>

#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

// Every test runs with each library behind gemm (train.gemm): OpenBLAS and oneDNN.
class Gemm : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override {
    saved_ = gemm_backend();
    set_gemm_backend(GetParam());
  }
  void TearDown() override { set_gemm_backend(saved_); }

 private:
  GemmBackend saved_ = GemmBackend::openblas;
};

// Row-major reference: out = alpha * op(a) op(b) + beta * out.
DVec ref_matmul(const Vec& a, const Vec& b, const Vec& c0, int64_t M, int64_t N, int64_t K, bool ta,
                bool tb, double alpha, double beta) {
  DVec out(M * N);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double x = ta ? a[k * M + i] : a[i * K + k];
        const double y = tb ? b[j * K + k] : b[k * N + j];
        s += x * y;
      }
      out[i * N + j] = alpha * s + beta * c0[i * N + j];
    }
  }
  return out;
}

TEST_P(Gemm, MatmulAllTransposesAndOddShapes) {
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 128, 96}, {129, 3, 250}};
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const Vec a = random_vec(M * K, seed++);
        const Vec b = random_vec(K * N, seed++);
        const Vec c0 = random_vec(M * N, seed++);
        Vec out = c0;
        matmul(out.data(), a.data(), b.data(), M, N, K, ta, tb, 0.5f, 2.0f);
        expect_close(out, ref_matmul(a, b, c0, M, N, K, ta, tb, 0.5, 2.0), 1e-5, 1e-5, "matmul");
        Vec fresh(M * N, std::nanf(""));  // beta = 0 must ignore whatever out held
        matmul(fresh.data(), a.data(), b.data(), M, N, K, ta, tb);
        expect_close(fresh, ref_matmul(a, b, c0, M, N, K, ta, tb, 1.0, 0.0), 1e-5, 1e-5,
                     "matmul beta=0");
      }
    }
  }
}

TEST_P(Gemm, BatchedSmallAndLargeMatrices) {
  // The first shape is spread over threads, the second runs with OpenBLAS threading inside.
  const int64_t shapes[][4] = {{6, 9, 13, 7}, {2, 200, 180, 130}};
  for (const auto& s : shapes) {
    const int64_t batch = s[0], M = s[1], N = s[2], K = s[3];
    const Vec a = random_vec(batch * M * K, 11);
    const Vec b = random_vec(batch * K * N, 12);
    const Vec c0 = random_vec(batch * M * N, 13);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      Vec out = c0;
      matmul_batched(out.data(), a.data(), b.data(), batch, M, N, K, false, true, M * N, M * K,
                     K * N, 1.0f, 1.0f);
      for (int64_t i = 0; i < batch; ++i) {
        const Vec ai(a.begin() + i * M * K, a.begin() + (i + 1) * M * K);
        const Vec bi(b.begin() + i * K * N, b.begin() + (i + 1) * K * N);
        const Vec ci(c0.begin() + i * M * N, c0.begin() + (i + 1) * M * N);
        const Vec got(out.begin() + i * M * N, out.begin() + (i + 1) * M * N);
        expect_close(got, ref_matmul(ai, bi, ci, M, N, K, false, true, 1.0, 1.0), 1e-5, 1e-5,
                     "matmul_batched");
      }
    }
    omp_set_num_threads(1);
  }
}

DVec ref_linear(const DVec& x, const DVec& w, const DVec& bias, int64_t BT, int64_t Ci,
                int64_t Co) {
  DVec out(BT * Co);
  for (int64_t i = 0; i < BT; ++i) {
    for (int64_t o = 0; o < Co; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int64_t k = 0; k < Ci; ++k) s += x[i * Ci + k] * w[o * Ci + k];
      out[i * Co + o] = s;
    }
  }
  return out;
}

TEST_P(Gemm, LinearForwardAndBackwardMatchFiniteDifferences) {
  const int64_t shapes[][3] = {{5, 3, 4}, {13, 17, 9}, {32, 24, 40}};
  for (const auto& s : shapes) {
    const int64_t BT = s[0], Ci = s[1], Co = s[2];
    const Vec x = random_vec(BT * Ci, 21), w = random_vec(Co * Ci, 22), bias = random_vec(Co, 23);
    const Vec dout = random_vec(BT * Co, 24);
    Vec out(BT * Co);
    linear_forward(out.data(), x.data(), w.data(), bias.data(), BT, Ci, Co);
    expect_close(out, ref_linear(to_double(x), to_double(w), to_double(bias), BT, Ci, Co), 1e-5,
                 1e-5, "linear out");
    Vec out_nb(BT * Co);
    linear_forward(out_nb.data(), x.data(), w.data(), nullptr, BT, Ci, Co);
    expect_close(out_nb, ref_linear(to_double(x), to_double(w), {}, BT, Ci, Co), 1e-5, 1e-5,
                 "linear out without bias");

    // Gradient buffers start non-zero: the kernel must add to them.
    const Vec dx0 = random_vec(BT * Ci, 25), dw0 = random_vec(Co * Ci, 26),
              db0 = random_vec(Co, 27);
    Vec dx = dx0, dw = dw0, db = db0;
    linear_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), BT, Ci, Co);
    const DVec wd = to_double(dout);
    const DVec gx = numeric_grad(
        [&](const DVec& v) { return ref_linear(v, to_double(w), to_double(bias), BT, Ci, Co); },
        to_double(x), wd);
    const DVec gw = numeric_grad(
        [&](const DVec& v) { return ref_linear(to_double(x), v, to_double(bias), BT, Ci, Co); },
        to_double(w), wd);
    const DVec gb = numeric_grad(
        [&](const DVec& v) { return ref_linear(to_double(x), to_double(w), v, BT, Ci, Co); },
        to_double(bias), wd);
    expect_close(dx, plus(dx0, gx), 1e-5, 1e-5, "linear dinp");
    expect_close(dw, plus(dw0, gw), 1e-5, 1e-5, "linear dweight");
    expect_close(db, plus(db0, gb), 1e-5, 1e-5, "linear dbias");

    // Optional gradients: skipping one leaves it untouched and still computes the others.
    Vec dw_only = dw0;
    linear_backward(nullptr, dw_only.data(), nullptr, dout.data(), x.data(), w.data(), BT, Ci, Co);
    expect_close(dw_only, plus(dw0, gw), 1e-5, 1e-5, "linear dweight alone");
  }
}

TEST_P(Gemm, StridedOperandsAndOutputWithLeadingDimensions) {
  // Products on sub-blocks of larger row-major arrays (attention's per-head views): lda, ldb and
  // ldc exceed the product's own widths, and what lies beside the block must stay untouched.
  const int64_t M = 19, N = 23, K = 29, pad = 5;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const Vec a = random_vec((ta ? K : M) * lda, 31);
      const Vec b = random_vec((tb ? N : K) * ldb, 32);
      const Vec c0 = random_vec(M * ldc, 33);
      Vec c = c0;
      gemm(ta, tb, M, N, K, 0.75f, a.data(), lda, b.data(), ldb, 1.5f, c.data(), ldc);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= N) {
            EXPECT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "beside the block at " << i << "," << j;
            continue;
          }
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            const double x = ta ? a[k * lda + i] : a[i * lda + k];
            const double y = tb ? b[j * ldb + k] : b[k * ldb + j];
            s += x * y;
          }
          const double want = 0.75 * s + 1.5 * c0[i * ldc + j];
          EXPECT_NEAR(c[i * ldc + j], want, 1e-5 * (1 + std::abs(want))) << i << "," << j;
        }
      }
    }
  }
}

TEST_P(Gemm, TheSameProductTwiceHasTheSameBits) {
  const Vec a = random_vec(64 * 96, 41), b = random_vec(96 * 80, 42);
  Vec first(64 * 80), second(64 * 80, std::nanf(""));
  matmul(first.data(), a.data(), b.data(), 64, 80, 96, false, false);
  matmul(second.data(), a.data(), b.data(), 64, 80, 96, false, false);
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Backends, Gemm,
                         ::testing::Values(GemmBackend::openblas, GemmBackend::onednn),
                         [](const ::testing::TestParamInfo<GemmBackend>& info) {
                           return info.param == GemmBackend::openblas ? "OpenBLAS" : "oneDNN";
                         });

}  // namespace
}  // namespace meshtrain::cpu::testing
