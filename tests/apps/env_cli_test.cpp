// `meshtrain env` and the unknown-variable warning, through the built programs.
#include <gtest/gtest.h>

#include <string>

#include "meshtrain/util/env_registry.h"
#include "tests/support/run_command.h"

namespace {

using meshtrain::testing::run_command;

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kMeshtrain = kBin + "/meshtrain";
const std::string kMeshrun = kBin + "/meshrun";
// Put together at run time so that the registry's scan of the tree does not take it for a name.
const std::string kMisspelt = std::string("MESHTRAIN_") + "LOG_LEVL";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(EnvCli, ListsEveryVariableWithItsCurrentValue) {
  auto r = run_command("env MESHTRAIN_LOG_LEVEL=warn MESHTRAIN_TOKEN=hidden-token-42 " +
                       kMeshtrain + " env --all");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const auto& s : meshtrain::env_settings())
    EXPECT_NE(r.output.find(std::string(s.name) + " = "), std::string::npos) << s.name;
  EXPECT_NE(r.output.find("MESHTRAIN_LOG_LEVEL = 'warn'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MESHTRAIN_TOKEN = (set)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("hidden-token-42"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "unknown environment variable"), 0u) << r.output;

  auto plain = run_command(kMeshtrain + " env");
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_EQ(plain.output.find("MESHTRAIN_TEST_REQUIRE"), std::string::npos) << plain.output;
  auto help = run_command(kMeshtrain + " env --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--all"), std::string::npos) << help.output;
}

TEST(EnvCli, AMisspeltVariableIsNamedOnceWithTheClosestKnownName) {
  auto r = run_command("env " + kMisspelt + "=debug " + kMeshtrain + " env");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "unknown environment variable"), 1u) << r.output;
  EXPECT_NE(r.output.find("meshtrain: warning: unknown environment variable " + kMisspelt +
                          " (did you mean MESHTRAIN_LOG_LEVEL?"),
            std::string::npos)
      << r.output;
}

TEST(EnvCli, MeshrunWarnsForTheNodeAndItsWorkersStayQuiet) {
  auto r = run_command("env " + kMisspelt + "=debug " + kMeshrun + " --nproc-per-node 2 -- " +
                       kMeshtrain + " env");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "unknown environment variable"), 1u) << r.output;
  EXPECT_NE(r.output.find("meshrun: warning: unknown environment variable " + kMisspelt),
            std::string::npos)
      << r.output;
}

}  // namespace
