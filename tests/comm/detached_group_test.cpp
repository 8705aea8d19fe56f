// DetachedGroup: the place of a rank among ranks that never meet; every operation fails in one
// line naming itself and the ranks.
#include "meshtrain/comm/detached_group.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshtrain/util/error.h"

namespace {

using meshtrain::comm::DetachedGroup;

TEST(DetachedGroup, KeepsRankAndSizeAndRefusesEveryOperationNamingIt) {
  DetachedGroup detached(2, 3, "asynchronous parameter-server workers");
  meshtrain::comm::ProcessGroup& g = detached;
  EXPECT_EQ(g.rank(), 2);
  EXPECT_EQ(g.size(), 3);
  EXPECT_TRUE(g.detached());
  float x[3] = {};
  const auto refused = [](const auto& op, const std::string& name) {
    try {
      op();
      ADD_FAILURE() << name << " did not fail";
    } catch (const meshtrain::CommError& e) {
      EXPECT_EQ(std::string(e.what()), name +
                                           " among asynchronous parameter-server workers: they "
                                           "never meet (rank 2 of 3)");
    }
  };
  refused([&] { g.all_reduce(x, 1, meshtrain::DType::f32); }, "all_reduce");
  refused([&] { g.broadcast(x, 1, meshtrain::DType::f32); }, "broadcast");
  refused([&] { g.all_gather(x, x, 1, meshtrain::DType::f32); }, "all_gather");
  refused([&] { g.barrier(); }, "barrier");
  refused([&] { g.send(x, 1, meshtrain::DType::f32, 0, 1); }, "send");
  refused([&] { g.split({0, 1}); }, "split");
  EXPECT_FALSE(g.aborted());
}

TEST(DetachedGroup, AJobsGroupsMeet) {
  EXPECT_THROW(DetachedGroup(3, 3, "x"), meshtrain::Error);
}

}  // namespace
