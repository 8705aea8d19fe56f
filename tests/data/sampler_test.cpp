// Sampler: seeded permutations, resumable positions, and the distributed split.
#include "meshtrain/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/data/data_loader.h"
#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i) {
    if (v[static_cast<size_t>(i)] != i) return false;
  }
  return static_cast<int64_t>(v.size()) == n;
}

TEST(Sampler, SameSeedSameOrderDifferentSeedDifferent) {
  SamplerOptions o{.num_windows = 1000, .seed = 42};
  Sampler a(o), b(o);
  o.seed = 43;
  Sampler c(o);
  std::vector<int64_t> xa = a.next(2500), xb = b.next(2500), xc = c.next(2500);
  EXPECT_EQ(xa, xb);
  EXPECT_NE(xa, xc);
  // Each epoch is a permutation, and consecutive epochs differ.
  std::vector<int64_t> e0(xa.begin(), xa.begin() + 1000), e1(xa.begin() + 1000, xa.begin() + 2000);
  EXPECT_TRUE(is_permutation_of_range(e0, 1000));
  EXPECT_TRUE(is_permutation_of_range(e1, 1000));
  EXPECT_NE(e0, e1);
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(e0, identity);
  EXPECT_EQ(e0, a.epoch_indices(0));
}

TEST(Sampler, SequentialMode) {
  Sampler s(SamplerOptions{.num_windows = 5, .seed = 1, .shuffle = false});
  EXPECT_EQ(s.next(7), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1}));
  s.reset();
  EXPECT_EQ(s.next(2), (std::vector<int64_t>{0, 1}));
}

TEST(Sampler, PositionSaveRestoreContinuesSequence) {
  SamplerOptions o{.num_windows = 37, .seed = 7};
  Sampler reference(o);
  std::vector<int64_t> full = reference.next(200);

  Sampler first(o);
  std::vector<int64_t> head = first.next(83);
  nlohmann::json saved = first.state().to_json();
  EXPECT_EQ(saved["epoch"], 2);

  Sampler resumed(o);
  resumed.set_state(SamplerState::from_json(nlohmann::json::parse(saved.dump())));
  std::vector<int64_t> tail = resumed.next(117);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, full);

  // At an exact epoch end the state reads as the start of the next epoch.
  Sampler at_end(o);
  at_end.next(37);
  EXPECT_EQ(at_end.state(), (SamplerState{1, 0}));

  EXPECT_THROW(SamplerState::from_json(nlohmann::json{{"epoch", "x"}}), ValueError);
  // Past this world's epoch (a larger world's padded tail): the next epoch begins.
  resumed.set_state({0, 38});
  EXPECT_EQ(resumed.state(), (SamplerState{1, 0}));
  EXPECT_THROW(resumed.set_state({0, 80}), ValueError);
  EXPECT_THROW(resumed.set_state({-1, 0}), ValueError);
}

TEST(Sampler, DistributedUnionIsWholeDatasetOnce) {
  for (int64_t n : {12, 13, 100, 101}) {
    for (int64_t r : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        std::map<int64_t, int> count;
        int64_t per_rank = -1;
        for (int64_t rank = 0; rank < r; ++rank) {
          Sampler s(SamplerOptions{.num_windows = n,
                                   .seed = 99,
                                   .num_replicas = r,
                                   .rank = rank,
                                   .drop_last = drop_last});
          std::vector<int64_t> mine = s.epoch_indices(3);
          if (per_rank < 0) per_rank = static_cast<int64_t>(mine.size());
          EXPECT_EQ(static_cast<int64_t>(mine.size()), per_rank) << "ranks must be balanced";
          for (int64_t i : mine) ++count[i];
        }
        if (n % r == 0) {
          ASSERT_EQ(static_cast<int64_t>(count.size()), n) << n << " " << r;
          for (auto& [i, c] : count) EXPECT_EQ(c, 1) << "window " << i;
        } else if (drop_last) {
          EXPECT_EQ(static_cast<int64_t>(count.size()), n / r * r);
          for (auto& [i, c] : count) EXPECT_EQ(c, 1);
        } else {
          // Padded: every window at least once, n % r ... r - 1 duplicates in total.
          EXPECT_EQ(static_cast<int64_t>(count.size()), n);
          int dup = 0;
          for (auto& [i, c] : count) dup += c - 1;
          EXPECT_EQ(dup, r - n % r);
        }
      }
    }
  }
}

TEST(Sampler, DistributedPositionCarriesAcrossWorldSizes) {
  // Two ranks consume 10 each (global offset 20); four ranks resume at 5 each.
  const int64_t n = 64;
  SamplerOptions o{.num_windows = n, .seed = 5, .num_replicas = 2};
  Sampler r0(o);
  r0.next(10);
  SamplerState st = r0.state();
  EXPECT_EQ(st.offset, 20);
  std::set<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    o.rank = rank;
    Sampler s(o);
    for (int64_t i : s.next(10)) seen.insert(i);
  }
  std::set<int64_t> rest;
  for (int64_t rank = 0; rank < 4; ++rank) {
    Sampler s(SamplerOptions{.num_windows = n, .seed = 5, .num_replicas = 4, .rank = rank});
    s.set_state(st);
    for (int64_t i : s.next(11)) rest.insert(i);
  }
  EXPECT_EQ(seen.size() + rest.size(), static_cast<size_t>(n));
  for (int64_t i : rest) EXPECT_EQ(seen.count(i), 0u) << i;
  EXPECT_THROW(Sampler(SamplerOptions{.num_windows = 8, .num_replicas = 2, .rank = 2}), ValueError);
}

// A three-rank job stops at global offset 21; two ranks continue the same global stream from
// there (21 is odd, so the ranks' own lists are out of step), across the end of the epoch.
TEST(Sampler, ResumeAtAnOffsetNotDivisibleByTheNewWorld) {
  const int64_t n = 100;
  SamplerOptions three{.num_windows = n, .seed = 11, .num_replicas = 3};
  Sampler first(three);
  first.next(7);
  const SamplerState st = first.state();
  ASSERT_EQ(st, (SamplerState{0, 21}));
  const std::vector<int64_t> e0 = epoch_permutation(n, 11, 0, true);
  const std::vector<int64_t> e1 = epoch_permutation(n, 11, 1, true);
  auto stream = [&](int64_t p) { return p < n ? e0[p] : e1[p - n]; };
  for (int64_t rank = 0; rank < 2; ++rank) {
    Sampler s(SamplerOptions{.num_windows = n, .seed = 11, .num_replicas = 2, .rank = rank});
    s.set_state(st);
    const std::vector<int64_t> got = s.next(45);
    for (int64_t k = 0; k < 45; ++k)
      ASSERT_EQ(got[k], stream(21 + rank + 2 * k)) << "rank " << rank << " sample " << k;
    EXPECT_EQ(s.state(), (SamplerState{1, 11}));
  }
}

// The epoch of each window, also for a rank that runs ahead into the next epoch after a resume
// at an offset its world does not divide.
TEST(Sampler, NextReportsTheEpochOfEachWindow) {
  const int64_t n = 100;
  for (int64_t rank = 0; rank < 2; ++rank) {
    const SamplerOptions o{.num_windows = n, .seed = 11, .num_replicas = 2, .rank = rank};
    Sampler with(o), without(o);
    with.set_state({0, 21});
    without.set_state({0, 21});
    std::vector<int64_t> epochs{7, 7};  // replaced, not appended to
    const std::vector<int64_t> got = with.next(45, epochs);
    EXPECT_EQ(got, without.next(45));
    ASSERT_EQ(epochs.size(), 45u);
    for (int64_t k = 0; k < 45; ++k)
      EXPECT_EQ(epochs[static_cast<size_t>(k)], 21 + rank + 2 * k >= n ? 1 : 0) << k;
    EXPECT_EQ(with.state(), without.state());
  }
}

// Shards of 7, 3, 12, 1, 9, 5 and 8 windows.
std::vector<int64_t> uneven_shard_ends() {
  std::vector<int64_t> ends;
  int64_t total = 0;
  for (const int64_t w : {7, 3, 12, 1, 9, 5, 8}) ends.push_back(total += w);
  return ends;
}

int64_t shard_of(const std::vector<int64_t>& ends, int64_t window) {
  return std::upper_bound(ends.begin(), ends.end(), window) - ends.begin();
}

TEST(Sampler, ShardBlocksVisitABlocksShardsTogetherAndEveryWindowOnce) {
  const std::vector<int64_t> ends = uneven_shard_ends();
  for (const int64_t block : {1, 2, 3, 7}) {
    SamplerOptions o{.num_windows = ends.back(), .seed = 5};
    o.shard_ends = ends;
    o.shard_block = block;
    std::set<std::vector<int64_t>> orders;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const std::vector<int64_t> order = epoch_order(o, epoch);
      ASSERT_TRUE(is_permutation_of_range(order, ends.back())) << block;
      orders.insert(order);
      // Walking the order, a block's shards are all entered before any shard of the next block,
      // and a shard once left is never visited again.
      std::vector<int64_t> shard_seq;
      for (const int64_t w : order) {
        const int64_t s = shard_of(ends, w);
        if (shard_seq.empty() || shard_seq.back() != s) shard_seq.push_back(s);
      }
      std::vector<int64_t> distinct;
      std::map<int64_t, size_t> first_pos, last_pos;
      for (size_t i = 0; i < order.size(); ++i) {
        const int64_t s = shard_of(ends, order[i]);
        if (!first_pos.count(s)) {
          first_pos[s] = i;
          distinct.push_back(s);
        }
        last_pos[s] = i;
      }
      ASSERT_EQ(distinct.size(), ends.size());
      // Shards of block k (by order of first visit) all end before block k + 1's first begins.
      for (size_t k = 0; k + static_cast<size_t>(block) < distinct.size();
           k += static_cast<size_t>(block)) {
        size_t block_last = 0;
        for (size_t i = k; i < k + static_cast<size_t>(block); ++i)
          block_last = std::max(block_last, last_pos[distinct[i]]);
        for (size_t i = k + static_cast<size_t>(block);
             i < std::min(distinct.size(), k + 2 * static_cast<size_t>(block)); ++i)
          EXPECT_LT(block_last, first_pos[distinct[i]]) << "block " << block << " epoch " << epoch;
      }
      if (block == 1) {
        EXPECT_EQ(shard_seq.size(), ends.size());  // one visit per shard
      }
    }
    EXPECT_EQ(orders.size(), 3u) << "each epoch has an order of its own, block " << block;
  }
  // The same options give the same order; another seed another.
  SamplerOptions o{.num_windows = ends.back(), .seed = 5};
  o.shard_ends = ends;
  o.shard_block = 2;
  SamplerOptions other = o;
  other.seed = 6;
  EXPECT_EQ(epoch_order(o, 1), epoch_order(o, 1));
  EXPECT_NE(epoch_order(o, 1), epoch_order(other, 1));
  // Without blocks the order is the plain permutation, shards or not.
  o.shard_block = 0;
  EXPECT_EQ(epoch_order(o, 1), epoch_permutation(ends.back(), 5, 1, true));
}

TEST(Sampler, UpcomingShardsAreTheBlockBeingReadThenTheNextOnesAcrossTheEpoch) {
  const std::vector<int64_t> ends = uneven_shard_ends();
  for (const int64_t replicas : {1, 3}) {
    SamplerOptions o{.num_windows = ends.back(), .seed = 9, .num_replicas = replicas};
    o.shard_ends = ends;
    o.shard_block = 2;
    std::vector<Sampler> ranks;
    for (int64_t r = 0; r < replicas; ++r) {
      o.rank = r;
      ranks.emplace_back(o);
    }
    for (int step = 0; step < 60; ++step) {
      for (Sampler& s : ranks) {
        const std::vector<int64_t> upcoming = s.upcoming_shards(2);
        const std::vector<int64_t> next = s.next(1);
        // The window read next lies in one of the block's shards, listed first.
        const int64_t shard = shard_of(ends, next[0]);
        const auto at = std::find(upcoming.begin(), upcoming.end(), shard);
        ASSERT_NE(at, upcoming.end()) << "step " << step;
        EXPECT_LT(at - upcoming.begin(), 2) << "step " << step;
        // A block (2 shards, or 1 at the end of the epoch's odd count) and 2 more, all distinct.
        EXPECT_GE(upcoming.size(), 3u);
        EXPECT_LE(upcoming.size(), 4u);
        EXPECT_EQ(std::set<int64_t>(upcoming.begin(), upcoming.end()).size(), upcoming.size());
      }
    }
  }
  // Sequential order reads one shard at a time; a shuffle of all windows needs all of them.
  SamplerOptions seq{.num_windows = ends.back(), .shuffle = false};
  seq.shard_ends = ends;
  Sampler s(seq);
  s.next(8);  // into shard 1
  EXPECT_EQ(s.upcoming_shards(1), (std::vector<int64_t>{1, 2}));
  SamplerOptions all{.num_windows = ends.back(), .seed = 1};
  all.shard_ends = ends;
  EXPECT_EQ(Sampler(all).upcoming_shards(0).size(), ends.size());
  SamplerOptions none{.num_windows = 10};
  EXPECT_TRUE(Sampler(none).upcoming_shards(3).empty());
}

TEST(Sampler, ShardBlocksResumeFromASavedPositionAtAnyWorldSize) {
  const std::vector<int64_t> ends = uneven_shard_ends();
  SamplerOptions o{.num_windows = ends.back(), .seed = 21, .num_replicas = 2};
  o.shard_ends = ends;
  o.shard_block = 3;
  // The global stream two ranks read, and the same stream resumed from a saved position: at the
  // same world size across the epoch's end, and at three ranks within the epoch (a world size
  // pads an epoch to its own multiple, so streams of different sizes part at its end).
  auto stream = [&](int64_t replicas, SamplerState from, int64_t steps) {
    std::vector<int64_t> out;
    std::vector<Sampler> ranks;
    for (int64_t r = 0; r < replicas; ++r) {
      SamplerOptions ro = o;
      ro.num_replicas = replicas;
      ro.rank = r;
      ranks.emplace_back(ro);
      ranks.back().set_state(from);
    }
    for (int64_t k = 0; k < steps; ++k)
      for (Sampler& s : ranks) out.push_back(s.next(1)[0]);
    return std::make_pair(out, ranks[0].state());
  };
  const auto [whole, end] = stream(2, {}, 45);  // 90 positions: into the second epoch
  const auto [first, mid] = stream(2, {}, 21);
  const auto [rest, end2] = stream(2, mid, 24);
  std::vector<int64_t> joined = first;
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(end2, end);
  const auto [head, at20] = stream(2, {}, 10);   // positions 0-19
  const auto [tail, at44] = stream(3, at20, 8);  // positions 20-43 at three ranks
  std::vector<int64_t> across = head;
  across.insert(across.end(), tail.begin(), tail.end());
  EXPECT_EQ(across, std::vector<int64_t>(whole.begin(), whole.begin() + 44));
  EXPECT_EQ(at44, (SamplerState{0, 44}));
}

TEST(DataLoader, BatchesFollowSampler) {
  meshtrain::testing::TempDir dir;
  std::vector<int32_t> tokens(400);
  for (int i = 0; i < 400; ++i) tokens[i] = i % 250;
  write_token_shard(dir.file("train_000000.bin"), tokens);
  auto ds =
      std::make_shared<TokenDataset>(TokenDataset::from_dir(dir.path().string(), "train", 10));
  DataLoader loader(ds, SamplerOptions{.seed = 3}, 4);
  Sampler mirror(SamplerOptions{.num_windows = ds->num_windows(), .seed = 3});
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = loader.next();
    std::vector<int64_t> idx = mirror.next(4);
    ASSERT_EQ(x.shape(), (Shape{4, 10}));
    for (int b = 0; b < 4; ++b) EXPECT_EQ(x.data<int32_t>()[b * 10], tokens[idx[b] * 10]);
  }
  EXPECT_EQ(loader.state(), mirror.state());
}

}  // namespace
}  // namespace meshtrain::data
