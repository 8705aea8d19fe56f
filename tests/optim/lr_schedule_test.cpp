// Learning-rate schedules against values computed by hand, and the batch scaling rules.
#include "meshtrain/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "meshtrain/util/error.h"

namespace meshtrain::optim {
namespace {

TEST(LrSchedule, ConstantWithoutWarmup) {
  const LrSchedule s{.lr = 3e-4};
  EXPECT_DOUBLE_EQ(s.at(0), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(100000), 3e-4);
}

// Values from PyTorch's OneCycleLR.get_lr (anneal_strategy "cos", three_phase False) evaluated
// in double: phase ends at pct_start * total - 1 and total - 1, _annealing_cos between them.
TEST(LrSchedule, OneCycleMatchesPyTorchFormula) {
  const LrSchedule s{.lr = 0.1, .total_steps = 100, .decay = LrDecay::one_cycle};
  s.validate();
  EXPECT_NEAR(s.at(0), 0.0040000000000000036, 1e-15);  // lr / div_factor
  EXPECT_NEAR(s.at(10), 0.029516394846410082, 1e-15);
  EXPECT_NEAR(s.at(29), 0.1, 1e-15);  // the peak, step pct_start * total - 1
  EXPECT_NEAR(s.at(30), 0.09994965352845243, 1e-15);
  EXPECT_NEAR(s.at(50), 0.0793893450575732, 1e-15);
  EXPECT_NEAR(s.at(99), 4e-07, 1e-15);   // lr / div_factor / final_div_factor
  EXPECT_NEAR(s.at(500), 4e-07, 1e-15);  // past the end: stays at the floor
  // A peak between two steps (pct_start * total - 1 = 1.5).
  const LrSchedule t{.lr = 1.0, .total_steps = 5, .decay = LrDecay::one_cycle, .pct_start = 0.5};
  const double expected[] = {0.040000000000000036, 0.7599999999999999, 0.904508879153485,
                             0.3454941208465151, 4e-06};
  for (int64_t i = 0; i < 5; ++i) EXPECT_NEAR(t.at(i), expected[i], 1e-14) << "step " << i;
}

TEST(LrSchedule, OneCycleRejectsBadSettings) {
  EXPECT_THROW(
      (LrSchedule{.lr = 0.1, .total_steps = 100, .decay = LrDecay::one_cycle, .pct_start = 1.0}
           .validate()),
      ValueError);
  EXPECT_THROW((LrSchedule{.lr = 0.1, .total_steps = 1, .decay = LrDecay::one_cycle}.validate()),
               ValueError);
  EXPECT_EQ(parse_lr_decay("one_cycle"), LrDecay::one_cycle);
  EXPECT_EQ(lr_decay_name(LrDecay::one_cycle), "one_cycle");
}

TEST(LrSchedule, ConstantWithWarmup) {
  const LrSchedule s{.lr = 1.0, .warmup_steps = 4};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);
}

TEST(LrSchedule, WarmupThenCosine) {
  const LrSchedule s{
      .lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 10, .total_steps = 110, .decay = LrDecay::cosine};
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(0), 6e-5);       // 6e-4 * 1 / 10
  EXPECT_DOUBLE_EQ(s.at(4), 3e-4);       // 6e-4 * 5 / 10
  EXPECT_DOUBLE_EQ(s.at(10), 6e-4);      // start of the decay: cos(0) = 1
  EXPECT_NEAR(s.at(60), 3.3e-4, 1e-15);  // half way: (6e-4 + 6e-5) / 2
  // A quarter of the way: min + 0.5 * (1 + cos(pi / 4)) * (max - min).
  EXPECT_NEAR(s.at(35), 6e-5 + 0.5 * (1 + std::sqrt(0.5)) * 5.4e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 6e-5);
  EXPECT_DOUBLE_EQ(s.at(1000), 6e-5);
  // Monotone non-increasing after warm-up.
  for (int64_t t = 10; t < 120; ++t) EXPECT_LE(s.at(t + 1), s.at(t)) << t;
}

TEST(LrSchedule, LinearDecay) {
  const LrSchedule s{.lr = 1.0, .min_lr = 0.0, .total_steps = 4, .decay = LrDecay::linear};
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.at(1), 0.75);
  EXPECT_DOUBLE_EQ(s.at(3), 0.25);
  EXPECT_DOUBLE_EQ(s.at(4), 0.0);
}

TEST(LrSchedule, ValidateAndParse) {
  EXPECT_THROW((LrSchedule{.lr = -1.0}.validate()), ValueError);
  EXPECT_THROW(
      (LrSchedule{.lr = 1.0, .warmup_steps = 10, .total_steps = 5, .decay = LrDecay::cosine}
           .validate()),
      ValueError);
  EXPECT_EQ(parse_lr_decay("cosine"), LrDecay::cosine);
  EXPECT_EQ(parse_lr_decay("constant"), LrDecay::constant);
  EXPECT_EQ(lr_decay_name(parse_lr_decay("linear")), "linear");
  EXPECT_THROW(parse_lr_decay("exp"), ValueError);
}

TEST(LrScaling, LinearAndSqrtRules) {
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 1024, 256), 0.4);
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 128, 256), 0.05);
  EXPECT_DOUBLE_EQ(sqrt_scaled_lr(1e-3, 1024, 256), 2e-3);
  EXPECT_DOUBLE_EQ(sqrt_scaled_lr(1e-3, 64, 256), 5e-4);
  EXPECT_THROW(linear_scaled_lr(0.1, 0, 256), ValueError);
  EXPECT_THROW(sqrt_scaled_lr(0.1, 8, -1), ValueError);
}

}  // namespace
}  // namespace meshtrain::optim
