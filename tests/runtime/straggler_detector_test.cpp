// The straggler detector's arithmetic: the factor against the median of the others, the run of
// consecutive slow steps, the fresh count after one normal step, and the same verdict from the
// same times wherever it is computed.
#include "meshtrain/runtime/straggler_detector.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace meshtrain::runtime {
namespace {

TEST(StragglerDetector, MedianOfTheOthersLeavesTheUnitOut) {
  const std::vector<double> t = {1.0, 9.0, 2.0, 3.0};
  EXPECT_DOUBLE_EQ(median_of_others(t, 1), 2.0);  // of 1, 2, 3
  EXPECT_DOUBLE_EQ(median_of_others(t, 0), 3.0);  // of 9, 2, 3
  const std::vector<double> three = {1.0, 5.0, 2.0};
  EXPECT_DOUBLE_EQ(median_of_others(three, 1), 1.5);  // of 1 and 2: their mean
  EXPECT_DOUBLE_EQ(median_of_others(std::vector<double>{4.0}, 0), 0.0);
}

TEST(StragglerDetector, NamesAUnitAboveTheFactorForTheSetNumberOfSteps) {
  StragglerDetector d(2.0, 3);
  const std::vector<double> slow = {1.0, 3.0, 1.1};
  EXPECT_FALSE(d.observe(slow));
  EXPECT_FALSE(d.observe(slow));
  EXPECT_EQ(d.streak(1), 2);
  const auto v = d.observe(slow);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->unit, 1);
  EXPECT_NEAR(v->factor, 3.0 / 1.05, 1e-12);
  // Named once: the next slow steps name nobody new.
  EXPECT_FALSE(d.observe(slow));
  EXPECT_EQ(d.streak(0), 0);
  EXPECT_EQ(d.streak(2), 0);
}

TEST(StragglerDetector, AtOrBelowTheFactorIsNotSlow) {
  StragglerDetector d(2.0, 1);
  EXPECT_FALSE(d.observe(std::vector<double>{1.0, 2.0}));  // exactly 2x: not above
  EXPECT_FALSE(d.observe(std::vector<double>{1.0, 1.9}));
  EXPECT_TRUE(d.observe(std::vector<double>{1.0, 2.01}));
}

TEST(StragglerDetector, ANormalStepStartsTheCountOver) {
  StragglerDetector d(2.0, 3);
  const std::vector<double> slow = {1.0, 1.0, 4.0}, normal = {1.0, 1.0, 1.2};
  EXPECT_FALSE(d.observe(slow));
  EXPECT_FALSE(d.observe(slow));
  EXPECT_FALSE(d.observe(normal));
  EXPECT_EQ(d.streak(2), 0);
  EXPECT_FALSE(d.observe(slow));
  EXPECT_FALSE(d.observe(slow));
  const auto v = d.observe(slow);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->unit, 2);
  EXPECT_NEAR(v->factor, 4.0, 1e-12);
}

TEST(StragglerDetector, OffOrAloneNamesNobody) {
  StragglerDetector off(0.0, 1);
  EXPECT_FALSE(off.observe(std::vector<double>{1.0, 100.0}));
  StragglerDetector alone(2.0, 1);
  EXPECT_FALSE(alone.observe(std::vector<double>{100.0}));
  // Times too short for the clock are no evidence against anyone.
  StragglerDetector zeros(2.0, 1);
  EXPECT_FALSE(zeros.observe(std::vector<double>{0.0, 0.0, 0.001}));
}

TEST(StragglerDetector, TwoCompletingTogetherNameTheSlowerFirst) {
  StragglerDetector d(2.0, 2);
  const std::vector<double> t = {1.0, 1.0, 1.0, 5.0, 7.0};
  EXPECT_FALSE(d.observe(t));
  const auto first = d.observe(t);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->unit, 4);
  const auto second = d.observe(t);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->unit, 3);
}

// Every rank runs its own detector on the gathered times: the same times give the same
// verdicts at the same steps, whatever happened before on other detectors.
TEST(StragglerDetector, IdenticalInputsGiveIdenticalDecisions) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  std::vector<std::vector<double>> steps;
  for (int s = 0; s < 200; ++s) {
    std::vector<double> t;
    for (int u = 0; u < 4; ++u) t.push_back(noise(gen) * (u == 2 && s >= 60 && s % 37 ? 3.0 : 1.0));
    steps.push_back(t);
  }
  std::vector<StragglerDetector> ranks(8, StragglerDetector(2.0, 20));
  std::vector<std::vector<std::pair<int, int>>> named(ranks.size());
  for (int s = 0; s < static_cast<int>(steps.size()); ++s)
    for (size_t r = 0; r < ranks.size(); ++r)
      if (const auto v = ranks[r].observe(steps[static_cast<size_t>(s)]))
        named[r].emplace_back(s, v->unit);
  ASSERT_EQ(named[0].size(), 1u);
  EXPECT_EQ(named[0][0].second, 2);
  // Slow from step 60 with normal steps at 74 (= 2 x 37) and 111: the first run of 20 slow
  // steps after 74 ends at step 94.
  EXPECT_EQ(named[0][0].first, 94);
  for (size_t r = 1; r < ranks.size(); ++r) EXPECT_EQ(named[r], named[0]) << "rank " << r;
}

}  // namespace
}  // namespace meshtrain::runtime
