// deploy/prometheus: the rules load (promtool check rules) and every alert fires on the
// synthetic series that should raise it and stays silent before (promtool test rules).
#include <gtest/gtest.h>

#include <string>

#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

using meshtrain::testing::run_command;

const std::string kDir = std::string(MESHTRAIN_SOURCE_DIR) + "/deploy/prometheus";

TEST(PrometheusRules, CheckAndUnitTestsPass) {
  MT_SKIP_UNLESS("prometheus", run_command("command -v promtool").status == 0,
                 "promtool (Debian's prometheus) is not installed");
  auto r = run_command("cd " + kDir + " && promtool check rules meshtrain-rules.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS: 28 rules found"), std::string::npos) << r.output;
  r = run_command("cd " + kDir + " && promtool test rules meshtrain-rules.test.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS"), std::string::npos) << r.output;
}

}  // namespace
