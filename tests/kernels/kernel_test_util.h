// Helpers shared by the kernel tests: seeded random inputs, tolerance comparisons against double
// references, central finite differences in double, and runs at several OpenMP thread counts.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace meshtrain::cpu::testing {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

inline Vec random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline DVec to_double(const Vec& v) {
  return DVec(v.begin(), v.end());
}

// Asserts |got - want| <= atol + rtol * |want| elementwise, with atol scaled by the largest
// |want| so that tiny entries of a large-valued array are judged on the array's scale.
inline void expect_close(const Vec& got, const DVec& want, double rtol, double atol_rel,
                         const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  const double atol = atol_rel * std::max(scale, 1e-30);
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (err "
                      << err << ", scale " << scale << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// d/dx_i of sum_j w_j * f(x)_j by central differences in double. f is a double reference forward.
inline DVec numeric_grad(const std::function<DVec(const DVec&)>& f, DVec x, const DVec& w,
                         double h = 1e-5) {
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const DVec up = f(x);
    x[i] = keep - h;
    const DVec down = f(x);
    x[i] = keep;
    double s = 0.0;
    for (size_t j = 0; j < up.size(); ++j) s += w[j] * (up[j] - down[j]);
    g[i] = s / (2.0 * h);
  }
  return g;
}

// Adds `base` (the gradient buffer's initial contents) to a reference gradient, for checking that
// kernels accumulate.
inline DVec plus(const Vec& base, const DVec& g) {
  DVec out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = base[i] + g[i];
  return out;
}

// Runs fn at 1 and at 2 OpenMP threads and expects the produced vectors to be bitwise equal.
inline void expect_thread_independent(const std::function<std::vector<Vec>()>& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Vec> one = fn();
  omp_set_num_threads(2);
  const std::vector<Vec> two = fn();
  omp_set_num_threads(3);
  const std::vector<Vec> three = fn();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  for (size_t k = 0; k < one.size(); ++k) {
    ASSERT_EQ(one[k].size(), two[k].size());
    EXPECT_EQ(0, std::memcmp(one[k].data(), two[k].data(), one[k].size() * sizeof(float)))
        << "output " << k << " differs between 1 and 2 threads";
    EXPECT_EQ(0, std::memcmp(one[k].data(), three[k].data(), one[k].size() * sizeof(float)))
        << "output " << k << " differs between 1 and 3 threads";
  }
}

}  // namespace meshtrain::cpu::testing
