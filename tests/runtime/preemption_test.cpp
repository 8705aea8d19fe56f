// The preemption guard in-process: a SIGTERM/SIGINT is recorded instead of ending the process,
// the previous handlers come back when the guard goes, and the restart test hook fires only
// where it is documented to.
#include "meshtrain/runtime/preemption.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <memory>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

TEST(Preemption, SignalsAreRecordedNotFatal) {
  {
    PreemptionGuard guard;
    EXPECT_EQ(PreemptionGuard::requested(), 0);
    ::raise(SIGTERM);
    EXPECT_EQ(PreemptionGuard::requested(), SIGTERM);
    ::raise(SIGINT);
    EXPECT_EQ(PreemptionGuard::requested(), SIGINT);
    EXPECT_NE(preemption_message(7, true).find("preempted by SIGINT at step 7"), std::string::npos);
    PreemptionGuard::reset();
    EXPECT_EQ(PreemptionGuard::requested(), 0);
  }
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL) << "the previous handler is restored";
}

TEST(Preemption, OverlappingGuardsKeepTheHandlerUntilTheLastGoes) {
  auto outer = std::make_unique<PreemptionGuard>();
  { PreemptionGuard inner; }
  ::raise(SIGTERM);  // still handled: the outer guard is alive
  EXPECT_EQ(PreemptionGuard::requested(), SIGTERM);
  PreemptionGuard::reset();
  outer.reset();
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(Preemption, CrashHookFiresOnRankOneOfTheFirstAttemptOnly) {
  auto plan_of = [](std::optional<std::string> restart) {
    return FaultPlan::parse([restart](const std::string& name) -> std::optional<std::string> {
      if (name == "MESHTRAIN_TEST_CRASH_AT_STEP") return "3";
      if (name == "TORCHELASTIC_RESTART_COUNT") return restart;
      return std::nullopt;
    });
  };
  const FaultPlan first = plan_of(std::nullopt);
  EXPECT_NO_THROW(maybe_crash_for_test(2, 1, 2, first));
  EXPECT_NO_THROW(maybe_crash_for_test(3, 0, 2, first));
  EXPECT_THROW(maybe_crash_for_test(3, 1, 2, first), Error);
  EXPECT_THROW(maybe_crash_for_test(3, 0, 1, first), Error);
  EXPECT_NO_THROW(maybe_crash_for_test(3, 1, 2, plan_of("1")));
}

}  // namespace
}  // namespace meshtrain::runtime
