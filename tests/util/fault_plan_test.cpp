// The test fault plan: parsed once from the MESHTRAIN_TEST_* variables, each fault firing where
// and when the tests that set it expect, a malformed value one line naming the variable.
#include "meshtrain/util/fault_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

FaultPlan plan_of(std::map<std::string, std::string> vars) {
  return FaultPlan::parse([vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(FaultPlan, NoVariablesNoFaults) {
  const FaultPlan p = plan_of({});
  for (int64_t step = 0; step < 50; ++step) {
    EXPECT_FALSE(p.crash_now(step, 1, 2));
    EXPECT_FALSE(p.nan_now(step, 1, 2, 0));
    EXPECT_EQ(p.loss_scale_now(step, 1, 2), 1.0f);
    EXPECT_FALSE(p.ckpt_stall_now(step));
  }
  EXPECT_EQ(p.ckpt_snapshot_delay.count(), 0);
}

TEST(FaultPlan, CrashFiresOnRankOneOfTheFirstAttemptOnly) {
  const FaultPlan p = plan_of({{"MESHTRAIN_TEST_CRASH_AT_STEP", "3"}});
  EXPECT_FALSE(p.crash_now(2, 1, 2));
  EXPECT_FALSE(p.crash_now(3, 0, 2));
  EXPECT_TRUE(p.crash_now(3, 1, 2));
  EXPECT_TRUE(p.crash_now(3, 0, 1));
  const FaultPlan again =
      plan_of({{"MESHTRAIN_TEST_CRASH_AT_STEP", "3"}, {"TORCHELASTIC_RESTART_COUNT", "1"}});
  EXPECT_FALSE(again.crash_now(3, 1, 2));
}

TEST(FaultPlan, NanStepsOnTheLastRankBeforeTheFirstRollbackUnlessAlways) {
  const FaultPlan p = plan_of({{"MESHTRAIN_TEST_NAN_STEPS", "7-9"}});
  EXPECT_FALSE(p.nan_now(6, 1, 2, 0));
  EXPECT_TRUE(p.nan_now(7, 1, 2, 0));
  EXPECT_TRUE(p.nan_now(9, 1, 2, 0));
  EXPECT_FALSE(p.nan_now(10, 1, 2, 0));
  EXPECT_FALSE(p.nan_now(8, 0, 2, 0));
  EXPECT_FALSE(p.nan_now(8, 1, 2, 1));
  const FaultPlan always = plan_of({{"MESHTRAIN_TEST_NAN_STEPS", "7-20,always"}});
  EXPECT_TRUE(always.nan_now(8, 1, 2, 3));
  const FaultPlan one = plan_of({{"MESHTRAIN_TEST_NAN_STEPS", "5"}});
  EXPECT_TRUE(one.nan_now(5, 0, 1, 0));
  EXPECT_FALSE(one.nan_now(6, 0, 1, 0));
}

TEST(FaultPlan, SpikeStallAndSnapshotDelay) {
  const FaultPlan p = plan_of({{"MESHTRAIN_TEST_SPIKE_STEP", "20"},
                               {"MESHTRAIN_TEST_CKPT_STALL_AT_STEP", "10"},
                               {"MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS", "400"}});
  EXPECT_EQ(p.loss_scale_now(20, 1, 2), 1000.0f);
  EXPECT_EQ(p.loss_scale_now(20, 0, 2), 1.0f);
  EXPECT_EQ(p.loss_scale_now(19, 1, 2), 1.0f);
  EXPECT_TRUE(p.ckpt_stall_now(10));
  EXPECT_FALSE(p.ckpt_stall_now(20));
  EXPECT_EQ(p.ckpt_snapshot_delay.count(), 400);
  const FaultPlan restarted =
      plan_of({{"MESHTRAIN_TEST_CKPT_STALL_AT_STEP", "10"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_FALSE(restarted.ckpt_stall_now(10));
}

TEST(FaultPlan, SlowdownOfOneRankOrOfEveryRankThatSeesIt) {
  const FaultPlan one = plan_of({{"MESHTRAIN_TEST_SLOWDOWN", "3@1"}});
  EXPECT_DOUBLE_EQ(one.slowdown_after(0.5, 1).count(), 1.0);
  EXPECT_DOUBLE_EQ(one.slowdown_after(0.5, 0).count(), 0.0);
  const FaultPlan every = plan_of({{"MESHTRAIN_TEST_SLOWDOWN", "2"}});
  EXPECT_DOUBLE_EQ(every.slowdown_after(0.25, 0).count(), 0.25);
  EXPECT_DOUBLE_EQ(every.slowdown_after(0.25, 7).count(), 0.25);
  EXPECT_DOUBLE_EQ(plan_of({}).slowdown_after(0.25, 0).count(), 0.0);
}

TEST(FaultPlan, PassingStallsHitAboutTheGivenShareOfStepsTheSameEveryRun) {
  const FaultPlan p = plan_of({{"MESHTRAIN_TEST_SLOWDOWN", "5~0.25"}});
  EXPECT_DOUBLE_EQ(p.slowdown_probability, 0.25);
  int stalled[2] = {0, 0}, both = 0;
  for (int64_t step = 1; step <= 4000; ++step) {
    const bool a = p.slowdown_after(0.5, 0, step).count() > 0;
    const bool b = p.slowdown_after(0.5, 1, step).count() > 0;
    if (a) {
      EXPECT_DOUBLE_EQ(p.slowdown_after(0.5, 0, step).count(), 2.0);
    }
    stalled[0] += a;
    stalled[1] += b;
    both += a && b;
    EXPECT_EQ(a, p.slowdown_after(0.5, 0, step).count() > 0);  // a fixed draw
  }
  // A quarter of 4000 steps each (binomial sd about 27), independently across ranks.
  EXPECT_NEAR(stalled[0], 1000, 120);
  EXPECT_NEAR(stalled[1], 1000, 120);
  EXPECT_NEAR(both, 250, 60);
  const FaultPlan one = plan_of({{"MESHTRAIN_TEST_SLOWDOWN", "3@1~0.5"}});
  EXPECT_EQ(*one.slowdown_rank, 1);
  EXPECT_DOUBLE_EQ(one.slowdown, 3.0);
  for (int64_t step = 1; step <= 50; ++step)
    EXPECT_EQ(one.slowdown_after(1.0, 0, step).count(), 0.0);
}

TEST(FaultPlan, AMalformedValueNamesTheVariable) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"MESHTRAIN_TEST_CRASH_AT_STEP", "three"},
           {"MESHTRAIN_TEST_NAN_STEPS", "9-7"},
           {"MESHTRAIN_TEST_NAN_STEPS", "7-"},
           {"MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS", "-5"},
           {"MESHTRAIN_TEST_SLOWDOWN", "0.5"},
           {"MESHTRAIN_TEST_SLOWDOWN", "2@x"},
           {"MESHTRAIN_TEST_SLOWDOWN", "fast"},
           {"MESHTRAIN_TEST_SLOWDOWN", "2~0"},
           {"MESHTRAIN_TEST_SLOWDOWN", "2~1.5"},
           {"MESHTRAIN_TEST_SLOWDOWN", "2@1~x"}}) {
    try {
      plan_of({{name, value}});
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(name + "='" + value + "'"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace meshtrain
