// The loss scaler's rules: grow by growth_factor after growth_interval finite steps in a row,
// back off by backoff_factor and restart the count on a non-finite step, never grow past f32's
// range; unscale divides exactly (power-of-two scales) and finds inf and NaN anywhere; the
// state round-trips and bad options or states are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "meshtrain/optim/loss_scaler.h"

namespace meshtrain::optim {
namespace {

TEST(LossScaler, DefaultsAreTorchs) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
}

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnOverflow) {
  LossScaler s({.init_scale = 1024, .growth_interval = 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().growth_tracker, 2);
  s.update(false);  // third finite step in a row
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.update(false);
  s.update(false);
  s.update(true);  // an overflow restarts the count
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0f);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 512.0f);
}

TEST(LossScaler, NeverGrowsPastF32) {
  LossScaler s({.init_scale = 2e38, .growth_interval = 1});
  s.update(false);
  EXPECT_EQ(s.scale(), 2e38f);
  EXPECT_TRUE(std::isfinite(s.scale()));
}

TEST(LossScaler, UnscaleDividesExactlyAndFindsNonFiniteGradients) {
  Tensor a = Tensor::from_vector(std::vector<float>{3.0f, -0.125f, 1e-30f}, {3});
  Tensor b = Tensor::zeros({40000});  // large enough for the threaded loop
  Tensor c = Tensor::ones({2});       // no gradient: ignored
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  c.set_requires_grad(true);
  NamedParams params{{"a", a}, {"b", b}, {"c", c}};
  LossScaler s({.init_scale = 1024});
  a.set_grad(Tensor::from_vector(std::vector<float>{3072.0f, -128.0f, 1024e-30f}, {3}));
  b.set_grad(Tensor::full({40000}, 2048.0));
  EXPECT_FALSE(s.unscale(params));
  const auto ga = a.grad().to_vector();
  EXPECT_EQ(ga[0], 3.0f);
  EXPECT_EQ(ga[1], -0.125f);
  EXPECT_EQ(ga[2], 1024e-30f / 1024.0f);
  EXPECT_EQ(b.grad().to_vector()[39999], 2.0f);

  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::nanf("")}) {
    b.set_grad(Tensor::ones({40000}));
    b.grad().data<float>()[31337] = bad;
    EXPECT_TRUE(s.unscale(params)) << bad;
  }
}

TEST(LossScaler, StateRoundTripsAndBadValuesAreRefused) {
  LossScaler a({.init_scale = 8, .growth_interval = 5});
  a.update(false);
  a.update(true);
  a.update(false);
  LossScaler b({.init_scale = 8, .growth_interval = 5});
  b.load_state(a.state());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().growth_tracker, 1);
  EXPECT_THROW((b.load_state({0.0, 0})), ValueError);
  EXPECT_THROW((b.load_state({std::numeric_limits<double>::infinity(), 0})), ValueError);
  EXPECT_THROW((b.load_state({4.0, -1})), ValueError);
  EXPECT_THROW(LossScaler({.init_scale = -1}), ValueError);
  EXPECT_THROW(LossScaler({.growth_factor = 1.0}), ValueError);
  EXPECT_THROW(LossScaler({.backoff_factor = 1.0}), ValueError);
  EXPECT_THROW(LossScaler({.growth_interval = 0}), ValueError);
}

}  // namespace
}  // namespace meshtrain::optim
