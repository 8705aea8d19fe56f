// Finite-difference gradient checks for autograd ops. Kernels are f32, so central differences
// use a step of 5e-3 (truncation error ~eps^2 = 2.5e-5 relative) and a tolerance of
// 2e-3 + 2e-2 * |numeric| (f32 round-off of the loss, ~1e-7 |loss| / eps, stays far below it).
// The output is projected onto fixed random weights so that every output element matters.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::testing {

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double project(const Tensor& out, const Tensor& w) {
  auto o = out.to_vector(), vw = w.to_vector();
  double acc = 0;
  for (size_t i = 0; i < o.size(); ++i) acc += static_cast<double>(o[i]) * vw[i];
  return acc;
}

inline void gradcheck(const GradFn& f, std::vector<Tensor> inputs, const std::string& what,
                      double eps = 5e-3, double atol = 2e-3, double rtol = 2e-2) {
  Generator g(99);
  for (Tensor& t : inputs)
    if (t.dtype() == DType::f32) t.set_requires_grad(true);
  Tensor out = f(inputs);
  Tensor w = randn(out.shape(), g);
  Tensor loss = autograd::sum_all(autograd::mul(out, w));
  autograd::backward(loss);
  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (x.dtype() != DType::f32) continue;
    ASSERT_TRUE(x.grad().defined()) << what << ": input " << k << " got no gradient";
    auto analytic = x.grad().to_vector();
    float* p = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float orig = p[i];
      p[i] = orig + static_cast<float>(eps);
      const double up = project(f(inputs), w);
      p[i] = orig - static_cast<float>(eps);
      const double down = project(f(inputs), w);
      p[i] = orig;
      const double numeric = (up - down) / (2 * eps);
      ASSERT_NEAR(analytic[static_cast<size_t>(i)], numeric, atol + rtol * std::fabs(numeric))
          << what << ": input " << k << " element " << i;
    }
  }
}

inline Tensor rnd(const Shape& s, uint64_t seed, float scale = 1.f, float shift = 0.f) {
  Generator g(seed);
  Tensor t = randn(s, g);
  return ops::affine(t, scale, shift);
}

}  // namespace meshtrain::testing
