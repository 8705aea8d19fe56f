// Splitting cores between a node's workers (meshrun --bind-cores-to-rank).
#include "meshtrain/runtime/core_binding.h"

#include <gtest/gtest.h>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

TEST(CoreBinding, ParsesAndFormatsCoreLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5,1,3-4,1"), (std::vector<int>{1, 3, 4, 5}));  // sorted, unique
  EXPECT_EQ(parse_cpu_list("7"), (std::vector<int>{7}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({4}), "4");
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"", "a", "1-", "-1", "3-1", "1,,2", "1;2", "99999", "0-2,x"})
    EXPECT_THROW(parse_cpu_list(bad), ValueError) << "'" << bad << "'";
}

TEST(CoreBinding, SplitsIntoEqualContiguousShares) {
  const std::vector<int> cpus = parse_cpu_list("0-6,10");  // 8 cores, not contiguous
  auto shares = split_cpus(cpus, 3);                       // 2 each, 2 left over
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(shares[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(shares[2], (std::vector<int>{4, 5}));
  shares = split_cpus(cpus, 8);
  for (size_t i = 0; i < shares.size(); ++i) EXPECT_EQ(shares[i], (std::vector<int>{cpus[i]}));
  EXPECT_THROW(split_cpus(cpus, 9), ValueError);
  EXPECT_THROW(split_cpus({}, 1), ValueError);
}

TEST(CoreBinding, AllowedCpusAreThisProcessesMask) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_EQ(parse_cpu_list(format_cpu_list(cpus)), cpus);
}

}  // namespace
}  // namespace meshtrain::runtime
