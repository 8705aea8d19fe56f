// Fused cross-entropy against a double log-softmax + NLL reference, with ignored rows and
// vocabulary sizes that are not multiples of the vector width. Row sums of up to ~1000 exps in
// float are good to ~1e-6 relative, hence 1e-5. Label smoothing against a hand-computed value and
// finite differences of a smoothed double reference.
#include "meshtrain/tensor/cpu/cross_entropy.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

constexpr int32_t kIgnore = -100;

// Per-row losses (0 for ignored rows); the mean goes to *mean. With eps > 0, PyTorch's label
// smoothing: (1 - eps) * nll + eps * mean over classes of -log p.
DVec ref_losses(const DVec& x, const std::vector<int32_t>& t, int64_t N, int64_t V, double* mean,
                double eps = 0.0) {
  DVec out(N, 0.0);
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == kIgnore) continue;
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[n * V + v]);
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[n * V + v] - m);
    const double lse = m + std::log(s);
    double smooth = 0.0;
    for (int64_t v = 0; v < V; ++v) smooth += (lse - x[n * V + v]) / static_cast<double>(V);
    out[n] = (1.0 - eps) * (lse - x[n * V + t[n]]) + eps * smooth;
    sum += out[n];
    ++count;
  }
  *mean = count ? sum / count : NAN;
  return out;
}

std::vector<int32_t> random_targets(int64_t N, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(N);
  for (auto& x : t) x = static_cast<int32_t>(gen() % V);
  for (int64_t n = 0; n < N; n += 3) t[n] = kIgnore;  // every third row ignored
  return t;
}

TEST(CrossEntropy, ForwardMatchesReference) {
  const int64_t shapes[][2] = {{1, 1}, {4, 7}, {19, 65}, {8, 1001}, {3, 50257}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], V = s[1];
    const Vec x = random_vec(N * V, 1, -6.0f, 6.0f);
    std::vector<int32_t> t = random_targets(N, V, 2);
    if (N == 1) t[0] = 0;
    Vec losses(N), lse(N);
    const float mean =
        cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), N, V, kIgnore);
    double rmean = 0.0;
    expect_close(losses, ref_losses(to_double(x), t, N, V, &rmean), 1e-5, 1e-6, "losses");
    EXPECT_NEAR(mean, rmean, 1e-5 * std::abs(rmean) + 1e-6);
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesOfTheMean) {
  const int64_t N = 7, V = 23;
  const Vec x = random_vec(N * V, 3, -3.0f, 3.0f), d0 = random_vec(N * V, 4);
  const std::vector<int32_t> t = random_targets(N, V, 5);
  Vec losses(N), lse(N), dx = d0;
  cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), N, V, kIgnore);
  const float dloss = 1.7f;
  cross_entropy_backward(dx.data(), x.data(), lse.data(), t.data(), dloss, N, V, kIgnore);
  const DVec g = numeric_grad(
      [&](const DVec& v) {
        double mean = 0.0;
        ref_losses(v, t, N, V, &mean);
        return DVec{mean};
      },
      to_double(x), DVec{dloss});
  // Written, not accumulated: the random initial contents must not show through.
  expect_close(dx, g, 1e-4, 1e-5, "dlogits");
  for (int64_t n = 0; n < N; n += 3) {  // ignored rows get exactly zero
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dx[n * V + v], 0.0f);
  }
}

TEST(CrossEntropy, AllIgnoredGivesNanAndNoGradient) {
  const int64_t N = 3, V = 5;
  const Vec x = random_vec(N * V, 6);
  const std::vector<int32_t> t(N, kIgnore);
  Vec losses(N), lse(N), dx(N * V, 3.0f);
  EXPECT_TRUE(std::isnan(
      cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), N, V, kIgnore)));
  cross_entropy_backward(dx.data(), x.data(), lse.data(), t.data(), 1.0f, N, V, kIgnore);
  for (float g : dx) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropy, RejectsOutOfRangeTargets) {
  const Vec x(2 * 4, 0.0f);
  Vec losses(2), lse(2);
  const std::vector<int32_t> t{1, 4};
  EXPECT_THROW(cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), 2, 4, kIgnore),
               Error);
}

TEST(CrossEntropy, LabelSmoothingMatchesAHandComputedValue) {
  // logits {1, 2, 3}, target 0, eps 0.1: lse = log(e + e^2 + e^3) = 3.40760596444438, and
  // 0.9 * (lse - 1) + 0.1 * (lse - (1 + 2 + 3) / 3) = lse - 1.1.
  const Vec x{1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> t{0};
  Vec losses(1), lse(1);
  const float mean =
      cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), 1, 3, kIgnore, 0.1f);
  EXPECT_NEAR(mean, 2.30760596444438, 1e-6);
  EXPECT_NEAR(lse[0], 3.40760596444438, 1e-6);
}

TEST(CrossEntropy, LabelSmoothingForwardAndBackwardMatchReference) {
  const int64_t N = 7, V = 23;
  const float eps = 0.1f;
  const Vec x = random_vec(N * V, 8, -3.0f, 3.0f), d0 = random_vec(N * V, 9);
  const std::vector<int32_t> t = random_targets(N, V, 10);
  Vec losses(N), lse(N), dx = d0;
  const float mean =
      cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), N, V, kIgnore, eps);
  double rmean = 0.0;
  expect_close(losses, ref_losses(to_double(x), t, N, V, &rmean, eps), 1e-5, 1e-6, "losses");
  EXPECT_NEAR(mean, rmean, 1e-5 * std::abs(rmean) + 1e-6);
  const float dloss = 1.3f;
  cross_entropy_backward(dx.data(), x.data(), lse.data(), t.data(), dloss, N, V, kIgnore, eps);
  const DVec g = numeric_grad(
      [&](const DVec& v) {
        double m = 0.0;
        ref_losses(v, t, N, V, &m, eps);
        return DVec{m};
      },
      to_double(x), DVec{dloss});
  expect_close(dx, g, 1e-4, 1e-5, "dlogits");
  for (int64_t n = 0; n < N; n += 3) {  // ignored rows still get exactly zero
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dx[n * V + v], 0.0f);
  }
}

TEST(CrossEntropy, RejectsLabelSmoothingOutsideZeroToOne) {
  const Vec x(4, 0.0f);
  Vec losses(1), lse(1), dx(4);
  const std::vector<int32_t> t{1};
  for (float eps : {-0.1f, 1.0f}) {
    EXPECT_THROW(
        cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), 1, 4, kIgnore, eps),
        Error);
    EXPECT_THROW(
        cross_entropy_backward(dx.data(), x.data(), lse.data(), t.data(), 1.0f, 1, 4, kIgnore, eps),
        Error);
  }
}

TEST(CrossEntropy, ThreadCountDoesNotChangeBits) {
  const int64_t N = 64, V = 1031;
  const Vec x = random_vec(N * V, 7, -5.0f, 5.0f);
  const std::vector<int32_t> t = random_targets(N, V, 8);
  expect_thread_independent([&] {
    Vec losses(N), lse(N), dx(N * V, 0.0f);
    const float mean =
        cross_entropy_forward(losses.data(), lse.data(), x.data(), t.data(), N, V, kIgnore);
    cross_entropy_backward(dx.data(), x.data(), lse.data(), t.data(), 1.0f, N, V, kIgnore);
    return std::vector<Vec>{losses, lse, dx, Vec{mean}};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
