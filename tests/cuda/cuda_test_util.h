// Shared by the device tests: the skip that names why there is no device, random inputs, and a
// comparison that reports the worst element instead of the first.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/tensor/tensor.h"
#include "tests/support/capability.h"

namespace meshtrain::test {

// Skips the current test, with the reason, when this process has no CUDA device.
#define MT_REQUIRE_CUDA_DEVICE()                                \
  MT_SKIP_UNLESS("cuda", ::meshtrain::cuda::device_count() > 0, \
                 ::meshtrain::cuda::unavailable_reason())

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// |got - want| <= atol + rtol * |want| everywhere (NaN only where want is NaN).
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, double rtol,
                                            double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  double worst = 0.0;
  size_t worst_i = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) || std::isnan(got[i])) {
      if (std::isnan(want[i]) != std::isnan(got[i])) {
        ++bad;
        worst_i = i;
        worst = INFINITY;
      }
      continue;
    }
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double excess = err - (atol + rtol * std::abs(static_cast<double>(want[i])));
    if (excess > 0) {
      ++bad;
      if (err > worst) {
        worst = err;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements out of tolerance (rtol " << rtol << ", atol "
         << atol << "); worst at " << worst_i << ": got " << got[worst_i] << ", want "
         << want[worst_i];
}

}  // namespace meshtrain::test
