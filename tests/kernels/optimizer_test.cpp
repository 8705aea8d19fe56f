// AdamW and SGD steps against hand-computed values and against double re-statements of the
// torch.optim update rules over several steps. The float kernels round each intermediate, so a
// few ulp (1e-6 relative) of drift per step is the budget.
#include "meshtrain/tensor/cpu/adamw.h"
#include "meshtrain/tensor/cpu/sgd.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

TEST(AdamW, FirstStepByHand) {
  // decay: 1 * (1 - 0.1 * 0.01) = 0.999; m = 0.05; v = 0.00025; bias1 = 0.1, bias2 = 0.001;
  // step = 0.1 / 0.1 = 1; denom = sqrt(0.00025) / sqrt(0.001) + 1e-8 = 0.5 (+1e-8);
  // param = 0.999 - 0.05 / 0.5 = 0.899.
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adamw_step(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
  // beta1 = 0.9f and beta2 = 0.999f are not exact, so 1 - beta is off by up to ~1e-5 relative.
  EXPECT_NEAR(m, 0.05f, 0.05 * 1e-5);
  EXPECT_NEAR(v, 0.00025f, 0.00025 * 2e-5);
  EXPECT_NEAR(p, 0.899f, 1e-6);
}

TEST(AdamW, SeveralStepsMatchTorchRule) {
  const int64_t n = 1001;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Vec p = random_vec(n, 1), m(n, 0.0f), v(n, 0.0f);
  DVec rp = to_double(p), rm(n, 0.0), rv(n, 0.0);
  for (int64_t t = 1; t <= 5; ++t) {
    const Vec g = random_vec(n, 10 + t);
    adamw_step(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
    for (int64_t i = 0; i < n; ++i) {
      rp[i] *= 1.0 - lr * wd;
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * g[i] * g[i];
      const double denom = std::sqrt(rv[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      rp[i] -= lr / (1 - std::pow(b1, t)) * rm[i] / denom;
    }
  }
  expect_close(p, rp, 1e-6, 1e-7, "param");
  expect_close(m, rm, 1e-6, 1e-7, "m");
  expect_close(v, rv, 1e-5, 1e-7, "v");
  EXPECT_THROW(adamw_step(p.data(), p.data(), m.data(), v.data(), n, 0.1f, 0.9f, 0.9f, 0.f, 0.f, 0),
               Error);
}

TEST(Sgd, MomentumStepsByHand) {
  // Step 1: d = 0.5 + 0.1 * 1 = 0.6; buf = d = 0.6; p = 1 - 0.1 * 0.6 = 0.94.
  // Step 2: d = 0.5 + 0.1 * 0.94 = 0.594; buf = 0.9 * 0.6 + 0.594 = 1.134; p = 0.94 - 0.1134.
  float p = 1.0f, g = 0.5f, buf = 12345.0f;  // the first step ignores the buffer's contents
  sgd_step(&p, &g, &buf, 1, 0.1f, 0.9f, 0.0f, 0.1f, false, true);
  EXPECT_NEAR(buf, 0.6f, 1e-7);
  EXPECT_NEAR(p, 0.94f, 1e-7);
  sgd_step(&p, &g, &buf, 1, 0.1f, 0.9f, 0.0f, 0.1f, false, false);
  EXPECT_NEAR(buf, 1.134f, 1e-6);
  EXPECT_NEAR(p, 0.8266f, 1e-6);
  // Nesterov, first step: d = 0.5; buf = 0.5; d = 0.5 + 0.9 * 0.5 = 0.95; p = 1 - 0.095.
  float q = 1.0f, qb = 0.0f;
  sgd_step(&q, &g, &qb, 1, 0.1f, 0.9f, 0.0f, 0.0f, true, true);
  EXPECT_NEAR(q, 0.905f, 1e-7);
}

TEST(Sgd, SeveralStepsMatchTorchRule) {
  const int64_t n = 517;
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case c :
       {Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.1, 1e-2, false}, Case{0.8, 0.0, 5e-4, true}}) {
    const double lr = 0.05;
    Vec p = random_vec(n, 2), buf(n, 0.0f);
    DVec rp = to_double(p), rb(n, 0.0);
    for (int step = 0; step < 4; ++step) {
      const Vec g = random_vec(n, 20 + step);
      sgd_step(p.data(), g.data(), c.momentum != 0.0 ? buf.data() : nullptr, n, lr, c.momentum,
               c.dampening, c.wd, c.nesterov, step == 0);
      for (int64_t i = 0; i < n; ++i) {
        double d = g[i] + c.wd * rp[i];
        if (c.momentum != 0.0) {
          rb[i] = step == 0 ? d : c.momentum * rb[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * rb[i] : rb[i];
        }
        rp[i] -= lr * d;
      }
    }
    expect_close(p, rp, 1e-6, 1e-7, "param");
    if (c.momentum != 0.0) expect_close(buf, rb, 1e-6, 1e-7, "momentum buffer");
  }
}

TEST(Optimizers, ThreadCountDoesNotChangeBits) {
  const int64_t n = 200003;
  const Vec p0 = random_vec(n, 3), g = random_vec(n, 4);
  expect_thread_independent([&] {
    Vec p = p0, m(n, 0.0f), v(n, 0.0f), q = p0, buf(n, 0.0f);
    for (int t = 1; t <= 2; ++t) {
      adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
      sgd_step(q.data(), g.data(), buf.data(), n, 0.1f, 0.9f, 0.0f, 1e-4f, true, t == 1);
    }
    return std::vector<Vec>{p, m, v, q, buf};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
