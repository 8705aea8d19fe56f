// The in-memory classification set, its sampler-driven batches and the generated spirals.
#include "meshtrain/data/classification_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "meshtrain/data/spirals.h"
#include "meshtrain/util/error.h"

namespace meshtrain::data {
namespace {

TEST(ClassificationSet, BatchesHoldTheRowsAndLabelsAsked) {
  const ClassificationSet set({0, 1, 10, 11, 20, 21}, {0, 1, 2}, 2, 3);
  const auto [x, y] = set.get_batch({2, 0});
  EXPECT_EQ(x.shape(), (Shape{2, 2}));
  EXPECT_EQ(x.to_vector(), (std::vector<float>{20, 21, 0, 1}));
  EXPECT_EQ(y.dtype(), DType::i32);
  EXPECT_EQ(y.data<int32_t>()[0], 2);
  EXPECT_EQ(y.data<int32_t>()[1], 0);
  const auto [sx, sy] = set.slice(1, 3);
  EXPECT_EQ(sx.to_vector(), (std::vector<float>{10, 11, 20, 21}));
}

TEST(ClassificationSet, RefusesInconsistentData) {
  EXPECT_THROW(ClassificationSet({0, 1, 2}, {0, 1}, 2, 2), ValueError);  // 3 values, 2 rows
  EXPECT_THROW(ClassificationSet({0, 1}, {2}, 2, 2), ValueError);        // label out of range
  EXPECT_THROW(ClassificationSet({0, 1}, {0}, 2, 1), ValueError);        // one class
  EXPECT_THROW(ClassificationSet({}, {}, 2, 2), ValueError);             // empty
}

TEST(Spirals, AreTheSameForASeedAndBalanced) {
  const ClassificationSet a = make_spirals(301, 3, 7), b = make_spirals(301, 3, 7);
  const ClassificationSet c = make_spirals(301, 3, 8);
  EXPECT_EQ(a.labels(), b.labels());
  EXPECT_EQ(a.slice(0, 301).first.to_vector(), b.slice(0, 301).first.to_vector());
  EXPECT_NE(a.slice(0, 301).first.to_vector(), c.slice(0, 301).first.to_vector());
  std::vector<int> count(3);
  for (int32_t y : a.labels()) ++count[static_cast<size_t>(y)];
  EXPECT_EQ(count, (std::vector<int>{101, 100, 100}));
  // Shuffled: the first rows are not one arm.
  const std::set<int32_t> first(a.labels().begin(), a.labels().begin() + 12);
  EXPECT_EQ(first.size(), 3u);
  // Inside the unit disc, as the radius runs over (0, 1].
  const std::vector<float> x = a.slice(0, 301).first.to_vector();
  for (size_t i = 0; i < x.size(); i += 2) EXPECT_LE(std::hypot(x[i], x[i + 1]), 1.0f + 1e-6f);
  EXPECT_THROW(make_spirals(10, 1, 0), ValueError);
}

// Two replicas read disjoint halves of each epoch; a saved position restores the same batches.
TEST(ClassificationBatches, ReplicasSplitTheSetAndPositionsRestore) {
  auto set = std::make_shared<const ClassificationSet>(make_spirals(64, 2, 3));
  SamplerOptions so;
  so.seed = 5;
  so.num_replicas = 2;
  std::vector<float> seen;
  for (int rank = 0; rank < 2; ++rank) {
    so.rank = rank;
    ClassificationBatches batches(set, so, 8);
    for (int i = 0; i < 4; ++i) {
      const std::vector<float> x = batches.next().first.to_vector();
      seen.insert(seen.end(), x.begin(), x.end());
    }
  }
  std::vector<float> all = set->slice(0, 64).first.to_vector();
  std::sort(all.begin(), all.end());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, all);

  so.rank = 0;
  ClassificationBatches a(set, so, 8);
  a.next();
  const SamplerState at = a.state();
  const std::vector<float> want = a.next().first.to_vector();
  ClassificationBatches b(set, so, 8);
  b.set_state(at);
  EXPECT_EQ(b.next().first.to_vector(), want);
  EXPECT_THROW(ClassificationBatches(set, so, 0), ValueError);
}

}  // namespace
}  // namespace meshtrain::data
