// One comparison of two step gates (tensor/cpu/step_gate.h) for the tests of the rule and of its
// cuda kernel: every field equal, a NaN loss or norm matching any NaN (the device writes its
// canonical NaN, the host keeps the input's).
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/tensor/cpu/step_gate.h"

namespace meshtrain::test {

inline void expect_same_gate(const cpu::StepGate& got, const cpu::StepGate& want) {
  if (std::isnan(want.norm))
    EXPECT_TRUE(std::isnan(got.norm));
  else
    EXPECT_EQ(got.norm, want.norm);
  if (std::isnan(want.loss))
    EXPECT_TRUE(std::isnan(got.loss));
  else
    EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.coef, want.coef);
  EXPECT_EQ(got.overflow, want.overflow);
  EXPECT_EQ(got.skip, want.skip);
}

}  // namespace meshtrain::test
