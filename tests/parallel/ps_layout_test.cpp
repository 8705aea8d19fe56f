// The servers' key ranges: contiguous whole parameters, every parameter once, the largest range
// as small as a contiguous split allows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "meshtrain/parallel/param_server/ps_layout.h"

namespace meshtrain::parallel {
namespace {

int64_t largest(const std::vector<int64_t>& sizes, const std::vector<KeyRange>& ranges) {
  int64_t worst = 0;
  for (const KeyRange& r : ranges)
    worst =
        std::max(worst, std::accumulate(sizes.begin() + static_cast<int64_t>(r.begin),
                                        sizes.begin() + static_cast<int64_t>(r.end), int64_t{0}));
  return worst;
}

// The best largest range over every way to cut, by brute force.
int64_t best_largest(const std::vector<int64_t>& sizes, size_t from, int servers) {
  if (servers == 1)
    return std::accumulate(sizes.begin() + static_cast<int64_t>(from), sizes.end(), int64_t{0});
  int64_t best = INT64_MAX, fill = 0;
  for (size_t cut = from; cut <= sizes.size(); ++cut) {
    best = std::min(best, std::max(fill, best_largest(sizes, cut, servers - 1)));
    if (cut < sizes.size()) fill += sizes[cut];
  }
  return best;
}

TEST(PsLayout, RangesCoverEveryParameterOnceInOrderAndAreBalanced) {
  const std::vector<std::vector<int64_t>> models = {
      {10, 10, 10, 10},
      {100, 1, 1, 1, 1},
      {1, 2, 3, 4, 5, 6, 7, 8},
      {33000, 128, 128, 49152, 16384, 128, 65536, 512},
      {5},
      {7, 7}};
  for (const auto& sizes : models) {
    for (int servers = 1; servers <= 4; ++servers) {
      const std::vector<KeyRange> r = balanced_key_ranges(sizes, servers);
      ASSERT_EQ(r.size(), static_cast<size_t>(servers));
      size_t next = 0;
      for (const KeyRange& k : r) {
        EXPECT_EQ(k.begin, next);
        EXPECT_LE(k.begin, k.end);
        next = k.end;
      }
      EXPECT_EQ(next, sizes.size());
      EXPECT_EQ(largest(sizes, r), best_largest(sizes, 0, servers)) << servers;
      // No server idles while another holds two parameters it could have taken.
      if (sizes.size() >= static_cast<size_t>(servers)) {
        for (const KeyRange& k : r) EXPECT_LT(k.begin, k.end);
      }
    }
  }
}

TEST(PsLayout, OffsetsOfParametersAndRanges) {
  const PsLayout l(3, 2, {4, 6, 5, 5});
  EXPECT_EQ(l.total, 20);
  EXPECT_EQ(l.param_offset, (std::vector<int64_t>{0, 4, 10, 15, 20}));
  EXPECT_EQ(l.range_offset(0), 0);
  EXPECT_EQ(l.range_size(0), 10);
  EXPECT_EQ(l.range_offset(1), 10);
  EXPECT_EQ(l.range_size(1), 10);
  EXPECT_EQ(l.server_rank(0), 3);
  EXPECT_EQ(l.server_rank(1), 4);
}

}  // namespace
}  // namespace meshtrain::parallel
