// Batch-norm kernels: the four steps chained into a training forward and backward, against a
// double reference and its finite differences; evaluation against the formula; hand-computed
// statistics; folding into a convolution against its formula. Float normalisation of O(1) values
// agrees with double to a few ulp (1e-5 relative); gradients get 1e-4 for the finite differences'
// own error.
#include "meshtrain/tensor/cpu/batch_norm.h"

#include <cmath>
#include <string>

#include "meshtrain/tensor/cpu/batch_norm_fold.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

constexpr double kEps = 1e-5;

// Training-mode batch norm in double: y = (x - mean) / sqrt(var + eps) * w + b per channel.
DVec ref_train(const DVec& x, const DVec& w, const DVec& b, int64_t N, int64_t C, int64_t HW) {
  DVec y(x.size());
  const double n = static_cast<double>(N * HW);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0, sq = 0.0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < HW; ++j) s += x[static_cast<size_t>((i * C + c) * HW + j)];
    const double mean = s / n;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < HW; ++j) {
        const double d = x[static_cast<size_t>((i * C + c) * HW + j)] - mean;
        sq += d * d;
      }
    const double invstd = 1.0 / std::sqrt(sq / n + kEps);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < HW; ++j) {
        const size_t k = static_cast<size_t>((i * C + c) * HW + j);
        y[k] = (x[k] - mean) * invstd * w[static_cast<size_t>(c)] + b[static_cast<size_t>(c)];
      }
  }
  return y;
}

struct Train {
  Vec out, mean, invstd, dinp, dweight, dbias;
};

// The four kernels chained as the autograd op chains them on one rank.
Train run_train(const Vec& x, const Vec& w, const Vec& b, const Vec& dout, int64_t N, int64_t C,
                int64_t HW) {
  Train t;
  std::vector<double> sums(static_cast<size_t>(2 * C));
  batch_norm_statistics(sums.data(), x.data(), N, C, HW);
  t.mean.resize(static_cast<size_t>(C));
  t.invstd.resize(static_cast<size_t>(C));
  batch_norm_moments(t.mean.data(), t.invstd.data(), nullptr, sums.data(), N * HW, C, kEps);
  t.out.resize(x.size());
  batch_norm_apply(t.out.data(), x.data(), t.mean.data(), t.invstd.data(), w.data(), b.data(), N, C,
                   HW);
  std::vector<double> gsums(static_cast<size_t>(2 * C));
  batch_norm_backward_reduce(gsums.data(), dout.data(), x.data(), t.mean.data(), t.invstd.data(), N,
                             C, HW);
  t.dinp = random_vec(x.size(), 77);  // written over
  batch_norm_backward_apply(t.dinp.data(), dout.data(), x.data(), t.mean.data(), t.invstd.data(),
                            w.data(), gsums.data(), N * HW, N, C, HW);
  for (int64_t c = 0; c < C; ++c) {
    t.dbias.push_back(static_cast<float>(gsums[static_cast<size_t>(c)]));
    t.dweight.push_back(static_cast<float>(gsums[static_cast<size_t>(C + c)]));
  }
  return t;
}

TEST(BatchNormKernels, StatisticsAndMomentsByHand) {
  // N=2, C=2, HW=2: channel 0 holds {1, 2, 3, 4}, channel 1 holds {-1, -1, 5, 5}.
  const Vec x = {1, 2, -1, -1, 3, 4, 5, 5};
  double sums[4];
  batch_norm_statistics(sums, x.data(), 2, 2, 2);
  EXPECT_EQ(sums[0], 10.0);
  EXPECT_EQ(sums[1], 8.0);
  EXPECT_EQ(sums[2], 30.0);
  EXPECT_EQ(sums[3], 52.0);
  float mean[2], invstd[2];
  double var[2];
  batch_norm_moments(mean, invstd, var, sums, 4, 2, kEps);
  EXPECT_EQ(mean[0], 2.5f);
  EXPECT_EQ(mean[1], 2.0f);
  EXPECT_DOUBLE_EQ(var[0], 1.25);
  EXPECT_DOUBLE_EQ(var[1], 9.0);
  EXPECT_EQ(invstd[0], static_cast<float>(1.0 / std::sqrt(1.25 + kEps)));
  EXPECT_EQ(invstd[1], static_cast<float>(1.0 / std::sqrt(9.0 + kEps)));
}

TEST(BatchNormKernels, VarianceIsClampedAtZero) {
  // Sums of a (nearly) constant channel whose S2/n - mean^2 comes out below zero, as rounding
  // can make it: mean 1, S2/n = 1 - 3e-13.
  const double sums[2] = {3.0, 3.0 - 1e-12};
  float mean, invstd;
  double var;
  batch_norm_moments(&mean, &invstd, &var, sums, 3, 1, kEps);
  EXPECT_EQ(var, 0.0);
  EXPECT_EQ(invstd, static_cast<float>(1.0 / std::sqrt(kEps)));
}

TEST(BatchNormKernels, TrainingForwardAndBackwardMatchReference) {
  const int64_t N = 3, C = 4, HW = 5;
  const Vec x = random_vec(N * C * HW, 1, -2.0f, 3.0f), w = random_vec(C, 2, 0.5f, 1.5f),
            b = random_vec(C, 3), dout = random_vec(N * C * HW, 4);
  const Train t = run_train(x, w, b, dout, N, C, HW);
  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  expect_close(t.out, ref_train(xd, wd, bd, N, C, HW), 1e-5, 1e-6, "out");
  const DVec dx = numeric_grad([&](const DVec& v) { return ref_train(v, wd, bd, N, C, HW); }, xd,
                               to_double(dout));
  expect_close(t.dinp, dx, 1e-4, 1e-5, "dinp");
  const DVec dw = numeric_grad([&](const DVec& v) { return ref_train(xd, v, bd, N, C, HW); }, wd,
                               to_double(dout));
  expect_close(t.dweight, dw, 1e-4, 1e-5, "dweight");
  const DVec db = numeric_grad([&](const DVec& v) { return ref_train(xd, wd, v, N, C, HW); }, bd,
                               to_double(dout));
  expect_close(t.dbias, db, 1e-4, 1e-5, "dbias");
}

TEST(BatchNormKernels, EvaluationUsesConstantStatistics) {
  const int64_t N = 2, C = 3, HW = 4;
  const Vec x = random_vec(N * C * HW, 5), dout = random_vec(N * C * HW, 6);
  const Vec mean = {0.5f, -1.0f, 0.0f}, var = {2.0f, 0.25f, 1.0f}, w = {1.5f, -0.5f, 1.0f},
            b = {0.1f, 0.2f, 0.3f};
  Vec invstd(3);
  for (size_t c = 0; c < 3; ++c) invstd[c] = static_cast<float>(1.0 / std::sqrt(var[c] + kEps));
  Vec out(x.size()), dx(x.size());
  batch_norm_apply(out.data(), x.data(), mean.data(), invstd.data(), w.data(), b.data(), N, C, HW);
  batch_norm_backward_apply(dx.data(), dout.data(), x.data(), mean.data(), invstd.data(), w.data(),
                            nullptr, 0, N, C, HW);
  DVec want_out(x.size()), want_dx(x.size());
  for (int64_t i = 0; i < N * C * HW; ++i) {
    const size_t c = static_cast<size_t>((i / HW) % C), k = static_cast<size_t>(i);
    const double s = 1.0 / std::sqrt(static_cast<double>(var[c]) + kEps);
    want_out[k] = (x[k] - mean[c]) * s * w[c] + b[c];
    want_dx[k] = w[c] * s * dout[k];
  }
  expect_close(out, want_out, 1e-5, 1e-6, "eval out");
  expect_close(dx, want_dx, 1e-5, 1e-6, "eval dinp");
}

TEST(BatchNormKernels, ThreadCountDoesNotChangeBits) {
  const int64_t N = 4, C = 24, HW = 17 * 19;
  const Vec x = random_vec(N * C * HW, 8, -1.0f, 4.0f), w = random_vec(C, 9), b = random_vec(C, 10),
            dout = random_vec(N * C * HW, 11);
  expect_thread_independent([&] {
    Train t = run_train(x, w, b, dout, N, C, HW);
    return std::vector<Vec>{t.out, t.mean, t.invstd, t.dinp, t.dweight, t.dbias};
  });
}

// The folded weight and bias are the double-precision products rounded once: within half an
// f32 ulp of the formula evaluated in double, and the gamma / beta defaults are 1 and 0.
TEST(BatchNormFold, FoldedWeightAndBiasAreTheFormulaRoundedOnce) {
  const int64_t C = 5, per = 7;
  const Vec w = random_vec(static_cast<size_t>(C * per), 1), b = random_vec(C, 2);
  const Vec gamma = random_vec(C, 3), beta = random_vec(C, 4), mean = random_vec(C, 5);
  const Vec var = random_vec(C, 6, 0.05f, 3.0f);
  const double eps = 1e-5, half_ulp = std::ldexp(1.0, -24);
  for (bool affine : {false, true})
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(affine ? "affine" : "no affine") + (bias ? ", bias" : ", no bias"));
      Vec fw(w.size()), fb(C);
      fold_batch_norm(fw.data(), fb.data(), w.data(), bias ? b.data() : nullptr,
                      affine ? gamma.data() : nullptr, affine ? beta.data() : nullptr, mean.data(),
                      var.data(), eps, C, per);
      for (int64_t c = 0; c < C; ++c) {
        const size_t k = static_cast<size_t>(c);
        const double scale = (affine ? gamma[k] : 1.0) / std::sqrt(double{var[k]} + eps);
        for (int64_t i = 0; i < per; ++i) {
          const double want = w[static_cast<size_t>(c * per + i)] * scale;
          EXPECT_LE(std::abs(fw[static_cast<size_t>(c * per + i)] - want),
                    half_ulp * std::abs(want));
        }
        const double want_b = ((bias ? b[k] : 0.0) - mean[k]) * scale + (affine ? beta[k] : 0.0);
        EXPECT_LE(std::abs(fb[k] - want_b), half_ulp * std::abs(want_b)) << c;
      }
    }
}

}  // namespace
}  // namespace meshtrain::cpu::testing
