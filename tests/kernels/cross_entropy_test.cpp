// Fused cross-entropy against a double log-softmax + NLL reference, with ignored rows and
// vocabulary sizes that are not multiples of the vector width. Row sums of up to ~1000 exps in
// float are good to ~1e-6 relative, hence 1e-5.
#include "meshtrain/tensor/cpu/cross_entropy.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

constexpr int32_t kIgnore = -100;

// Per-row losses (0 for ignored rows); the mean goes to *mean.
DVec ref_losses(const DVec& x, const std::vector<int32_t>& t, int64_t N, int64_t V, double* mean) {
  DVec out(N, 0.0);
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == kIgnore) continue;
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[n * V + v]);
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[n * V + v] - m);
    out[n] = m + std::log(s) - x[n * V + t[n]];
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
