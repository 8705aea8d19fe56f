// MT_SKIP_UNLESS skips by default and fails when MESHTRAIN_TEST_REQUIRE names the capability.
#include "tests/support/capability.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <vector>

namespace meshtrain::testing {
namespace {

// Sets MESHTRAIN_TEST_REQUIRE for one scope and puts the old value back.
class ScopedRequire {
 public:
  explicit ScopedRequire(const char* value) {
    const std::string name(kRequireVariable);
    if (const char* old = std::getenv(name.c_str())) old_ = old;
    ::setenv(name.c_str(), value, 1);
  }
  ~ScopedRequire() {
    const std::string name(kRequireVariable);
    if (old_) {
      ::setenv(name.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ScopedRequire(const ScopedRequire&) = delete;
  ScopedRequire& operator=(const ScopedRequire&) = delete;

 private:
  std::optional<std::string> old_;
};

void torch_missing() {
  MT_SKIP_UNLESS("torch", false,
                 "python3 "
                     << "cannot import torch");
}
void torch_present() {
  MT_SKIP_UNLESS("torch", true, "never said");
}

// What one call reported: the part results it produced, in order.
std::vector<::testing::TestPartResult> results_of(void (*fn)()) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    fn();
  }
  std::vector<::testing::TestPartResult> v;
  for (int i = 0; i < results.size(); ++i) v.push_back(results.GetTestPartResult(i));
  return v;
}

TEST(Capability, RequireListIsCommaSeparatedWithBlanksIgnored) {
  EXPECT_EQ(parse_required(" netns, torch,,prometheus ,"),
            (std::vector<std::string>{"netns", "torch", "prometheus"}));
  EXPECT_TRUE(parse_required("").empty());
  EXPECT_TRUE(requires_capability("netns,torch", "torch"));
  EXPECT_FALSE(requires_capability("netns,torchx", "torch"));
  EXPECT_EQ(unknown_capabilities("netns,tourch,etcd,gpu"), "tourch, gpu");
  EXPECT_EQ(unknown_capabilities("netns,torch"), "");
}

TEST(Capability, MissingCapabilitySkipsWithItsReason) {
  ScopedRequire require("netns,prometheus");
  const auto r = results_of(torch_missing);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].skipped());
  EXPECT_NE(std::string(r[0].message()).find("python3 cannot import torch"), std::string::npos)
      << r[0].message();
}

TEST(Capability, RequiredCapabilityThatIsMissingFails) {
  ScopedRequire require("netns, torch");
  const auto r = results_of(torch_missing);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].fatally_failed());
  const std::string m = r[0].message();
  EXPECT_NE(m.find("capability 'torch' is required (MESHTRAIN_TEST_REQUIRE)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("python3 cannot import torch"), std::string::npos) << m;
}

TEST(Capability, PresentCapabilityNeitherSkipsNorFails) {
  ScopedRequire require("torch");
  EXPECT_TRUE(results_of(torch_present).empty());
}

TEST(Capability, UnknownNameInTheSwitchFailsASkip) {
  ScopedRequire require("tourch");
  const auto r = results_of(torch_missing);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].fatally_failed());
  EXPECT_NE(std::string(r[0].message()).find("unknown capabilities: tourch"), std::string::npos)
      << r[0].message();
}

// A typo in the switch of this run (CI's) would quietly turn a requirement off: it fails here.
TEST(Capability, EveryNameInThisRunsSwitchIsKnown) {
  EXPECT_EQ(unknown_capabilities(required_value()), "")
      << kRequireVariable << " names capabilities no test knows; known: " << known_capabilities();
}

}  // namespace
}  // namespace meshtrain::testing
