// The spike detector on its own: a value far above the recent window is a spike, ordinary noise
// and improvements are not, nothing is judged before the window has enough steps, and skipped
// steps stay out of the window.
#include "meshtrain/runtime/spike_detector.h"

#include <gtest/gtest.h>

#include <limits>

namespace meshtrain::runtime {
namespace {

TEST(SpikeDetector, FlagsOnlyValuesFarAboveTheRecentWindow) {
  SpikeDetector d(4.0, 20);
  std::string why;
  for (int i = 0; i < 9; ++i) d.accept(3.0 + 0.01 * (i % 3), 1.0 + 0.02 * (i % 2));
  // Nine samples: too few to judge anything.
  EXPECT_FALSE(d.is_spike(300.0, 1.0, &why));
  d.accept(3.01, 1.01);
  EXPECT_FALSE(d.is_spike(3.02, 1.01, &why));  // noise
  EXPECT_FALSE(d.is_spike(1.0, 0.5, &why));    // better, not a spike
  EXPECT_TRUE(d.is_spike(30.0, 1.0, &why));
  EXPECT_NE(why.find("loss z="), std::string::npos) << why;
  EXPECT_EQ(why.find("gradient norm"), std::string::npos) << why;
  EXPECT_TRUE(d.is_spike(3.0, 50.0, &why));
  EXPECT_EQ(why.rfind("gradient norm z=", 0), 0u) << why;
}

TEST(SpikeDetector, OffMeansNeverAndTheWindowSlides) {
  SpikeDetector off(0.0, 20);
  for (int i = 0; i < 30; ++i) off.accept(1.0, 1.0);
  EXPECT_FALSE(off.is_spike(1e9, 1e9, nullptr));
  SpikeDetector d(4.0, 10);
  for (int i = 0; i < 10; ++i) d.accept(10.0 + 0.1 * (i % 2), 1.0 + 0.1 * (i % 2));
  EXPECT_TRUE(d.is_spike(1.05 * 10 + 2, 1.0, nullptr));
  // Ten steps at a new, higher level push the old ones out: that level is ordinary now.
  for (int i = 0; i < 10; ++i) d.accept(12.0 + 0.1 * (i % 2), 1.0 + 0.1 * (i % 2));
  EXPECT_FALSE(d.is_spike(12.1, 1.05, nullptr));
  // Non-finite values never enter the window.
  d.accept(std::numeric_limits<double>::infinity(), 1.0);
  EXPECT_FALSE(d.is_spike(12.1, 1.05, nullptr));
}

}  // namespace
}  // namespace meshtrain::runtime
