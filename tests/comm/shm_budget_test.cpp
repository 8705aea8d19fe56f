// The host-wide /dev/shm and core budget of the shm groups of one job: the arithmetic (shares,
// the plan walked by splits, the busier of host and group, the fitting), the sizes it gives a
// 2x2x2 mesh against what sizing each group alone gave, and a real 8-rank mesh in a 64 MiB
// /dev/shm that makes all of its groups and runs collectives on every one.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/comm/shm_budget.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/runtime/core_binding.h"
#include "meshtrain/util/error.h"
#include "tests/support/capability.h"
#include "tests/support/small_dev_shm.h"

namespace meshtrain::comm {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

const std::vector<parallel::MeshDim> kMesh222 = {{"pp", 2}, {"dp", 2}, {"tp", 2}};

TEST(ShmBudget, AGroupsShareIsItsWeightOfTheJobsBytes) {
  ShmBudget b;
  EXPECT_EQ(b.share_bytes(), 0u) << "no budget, no share";
  b.job_bytes = 32 * kMiB;
  b.weight = 2;
  b.total_weight = 32;
  EXPECT_EQ(b.share_bytes(), 2 * kMiB);
  // No overflow where job_bytes * weight passes 2^64.
  b.job_bytes = uint64_t{1} << 62;
  b.weight = 64;
  b.total_weight = 128;
  EXPECT_EQ(b.share_bytes(), uint64_t{1} << 61);
}

TEST(ShmBudget, TheFirstGroupTakesHalfOfWhatIsFreeForItselfAndThePlannedGroups) {
  ShmBudget given;
  given.planned_groups = parallel::DeviceMesh::split_sizes(kMesh222);
  const ShmBudget b = root_shm_budget(given, 64 * kMiB, 8);
  EXPECT_EQ(b.job_bytes, 32 * kMiB);
  EXPECT_EQ(b.weight, 8);
  EXPECT_EQ(b.total_weight, 8 + 12 * 2);
  EXPECT_EQ(b.host_ranks, 8);
  EXPECT_EQ(b.share_bytes(), 8 * kMiB);
  // Alone (no plan) it takes all of the half, as a group sized itself before.
  const ShmBudget alone = root_shm_budget(ShmBudget{}, 64 * kMiB, 8);
  EXPECT_EQ(alone.share_bytes(), 32 * kMiB);
}

TEST(ShmBudget, ASplitGetsAShareOnlyWhereThePlanListsAGroupOfItsSize) {
  ShmBudget parent;
  parent.planned_groups = {2, 2, 4};
  parent = root_shm_budget(parent, 64 * kMiB, 8);
  parent.host_cpus = 2;
  const ShmBudget first = split_shm_budget(parent, 0, 2);
  EXPECT_EQ(first.share_bytes(), 32 * kMiB * 2 / 16);
  EXPECT_EQ(first.host_ranks, 8);
  EXPECT_EQ(first.host_cpus, 2);
  EXPECT_TRUE(first.planned_groups.empty()) << "a split plans nothing of its own";
  EXPECT_EQ(split_shm_budget(parent, 2, 4).share_bytes(), 32 * kMiB * 4 / 16);
  // Not what the plan says at that place, or past its end: the group sizes itself alone, but
  // still knows the host's ranks and cores.
  const ShmBudget wrong = split_shm_budget(parent, 1, 4);
  EXPECT_EQ(wrong.job_bytes, 0u);
  EXPECT_EQ(wrong.host_ranks, 8);
  EXPECT_EQ(split_shm_budget(parent, 3, 2).job_bytes, 0u);
  // A parent without a budget (tcp, or /dev/shm could not be asked) gives none.
  EXPECT_EQ(split_shm_budget(ShmBudget{}, 0, 2).job_bytes, 0u);
}

TEST(ShmBudget, WaitersJudgeByTheBusierOfTheHostAndTheGroup) {
  ShmBudget host;
  host.host_ranks = 8;
  host.host_cpus = 2;
  // A tp group of 2 ranks that may use both cores: 8 ranks compete for them.
  ShmCoreShare s = shm_core_share(2, 2, host);
  EXPECT_EQ(s.ranks, 8);
  EXPECT_EQ(s.cpus, 2);
  // Ranks bound to a core each: 8 ranks on 8 cores, a group of 2 on 2 is not oversubscribed.
  host.host_cpus = 8;
  s = shm_core_share(2, 2, host);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.cpus, 2);
  // A group whose own ranks share one core is busier than the host on average.
  s = shm_core_share(2, 1, host);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.cpus, 1);
  // Unknown host: the group's own.
  s = shm_core_share(4, 2, ShmBudget{});
  EXPECT_EQ(s.ranks, 4);
  EXPECT_EQ(s.cpus, 2);
}

TEST(ShmBudget, FittingHalvesTheStagingBuffersThenTheChannelsDownToTheirSmallest) {
  auto bytes = [](size_t chunk, size_t channel) { return 4 * chunk + 4 * channel; };
  ShmSegmentFit f = fit_shm_segment(4 * kMiB, 256 << 10, 256 << 10, 32 << 10, 8 * kMiB, bytes);
  EXPECT_EQ(f.chunk_bytes, 1 * kMiB);  // 4 MiB + 1 MiB fits 8 MiB
  EXPECT_EQ(f.channel_bytes, size_t{256} << 10);
  EXPECT_EQ(f.segment_bytes, 5 * kMiB);
  f = fit_shm_segment(4 * kMiB, 256 << 10, 256 << 10, 32 << 10, kMiB + kMiB / 2, bytes);
  EXPECT_EQ(f.chunk_bytes, size_t{256} << 10);
  EXPECT_EQ(f.channel_bytes, size_t{128} << 10);
  f = fit_shm_segment(4 * kMiB, 256 << 10, 256 << 10, 32 << 10, 1, bytes);
  EXPECT_EQ(f.chunk_bytes, size_t{256} << 10) << "never below the smallest";
  EXPECT_EQ(f.channel_bytes, size_t{32} << 10);
  EXPECT_EQ(f.segment_bytes, bytes(256 << 10, 32 << 10));
}

TEST(ShmBudget, MeshSplitSizesFollowTheOrderTheMeshSplitsIn) {
  EXPECT_EQ(parallel::DeviceMesh::split_sizes(kMesh222), std::vector<int>(12, 2));
  // A combination adds its groups after the single dimensions; one the same as a single
  // dimension, or the whole world, adds none.
  std::vector<int> want(12, 2);
  want.insert(want.end(), {4, 4});
  EXPECT_EQ(parallel::DeviceMesh::split_sizes(kMesh222, {{"tp", "dp"}, {"dp"}, {"pp", "dp", "tp"}}),
            want);
  // Data parallelism alone: the dp group is the world, nothing is split off.
  EXPECT_TRUE(parallel::DeviceMesh::split_sizes({{"pp", 1}, {"dp", 8}, {"tp", 1}}).empty());
  EXPECT_EQ(parallel::DeviceMesh::split_sizes({{"pp", 2}, {"dp", 4}}),
            (std::vector<int>{2, 2, 2, 2, 4, 4}));
}

// One group's segment as ShmProcessGroup sizes it: fitted to `target` from the defaults.
size_t fitted_segment(int ranks, uint64_t target) {
  const size_t min_chunk = std::max<size_t>(256 << 10, 64 * static_cast<size_t>(ranks));
  return fit_shm_segment(4 * kMiB, ranks <= 16 ? 256 << 10 : 64 << 10, min_chunk, 32 << 10, target,
                         [ranks](size_t c, size_t ch) {
                           return ShmProcessGroup::segment_bytes_for(ranks, c, ch);
                         })
      .segment_bytes;
}

// The 2x2x2 mesh's world and 12 groups in a 64 MiB /dev/shm. Sized alone (before the budget),
// each group took half of what the ones before it had left: the world 24 MiB, the first pp group
// 17 MiB, the dp groups their smallest, and the tp groups found too little even for that. With the
// budget each group of 2 gets the same, and all of them fit in half of /dev/shm.
TEST(ShmBudget, ABudgetFitsEveryGroupOfA2x2x2MeshWhereSizingAloneSqueezedTheLast) {
  const uint64_t dev_shm = 64 * kMiB;
  std::vector<int> groups = {8};
  for (int m : parallel::DeviceMesh::split_sizes(kMesh222)) groups.push_back(m);

  uint64_t free_bytes = dev_shm;
  std::vector<uint64_t> before;
  int failed_before = 0, smallest_before = 0;
  for (int m : groups) {
    const size_t seg = fitted_segment(m, free_bytes / 2);
    if (seg > free_bytes) {
      ++failed_before;
      before.push_back(0);
      continue;
    }
    if (seg == ShmProcessGroup::smallest_segment_bytes(m)) ++smallest_before;
    before.push_back(seg);
    free_bytes -= seg;
  }

  ShmBudget plan;
  plan.planned_groups.assign(groups.begin() + 1, groups.end());
  const ShmBudget root = root_shm_budget(plan, dev_shm, 8);
  std::vector<uint64_t> after = {fitted_segment(8, root.share_bytes())};
  for (size_t i = 1; i < groups.size(); ++i)
    after.push_back(
        fitted_segment(groups[i], split_shm_budget(root, i - 1, groups[i]).share_bytes()));

  std::string table;
  for (size_t i = 0; i < groups.size(); ++i)
    table += "group " + std::to_string(i) + " (" + std::to_string(groups[i]) + " ranks): alone " +
             std::to_string(before[i] >> 10) + " KiB, budget " + std::to_string(after[i] >> 10) +
             " KiB\n";
  std::printf("%s", table.c_str());

  EXPECT_GE(failed_before + smallest_before, 1) << "sizing alone squeezed none:\n" << table;
  EXPECT_GT(before[1], 4 * after[1]) << "the first split took far more than its share";
  const uint64_t total = std::accumulate(after.begin(), after.end(), uint64_t{0});
  EXPECT_LE(total, dev_shm / 2) << table;
  for (size_t i = 2; i < after.size(); ++i) EXPECT_EQ(after[i], after[1]) << table;
  EXPECT_GT(after[1], ShmProcessGroup::smallest_segment_bytes(2)) << "shares above the smallest";
}

// Every rank's view of its groups, checked and used: the world and pp, dp and tp groups of a
// 2x2x2 mesh, all of them shm groups that drew from one budget.
int run_mesh_in_budget(bool plan) {
  const int world = 8;
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::seconds(60));
  std::atomic<int> rc{0};
  std::mutex print_mu;
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        ProcessGroupOptions o = testing::test_options("shm");
        if (plan) o.shm_budget.planned_groups = parallel::DeviceMesh::split_sizes(kMesh222);
        ProcessGroupPtr pg = make_process_group("shm", store, r, world, o);
        const parallel::DeviceMesh mesh(pg, kMesh222);
        const auto& root = dynamic_cast<ShmProcessGroup&>(*pg);
        for (const char* dim : {"pp", "dp", "tp"}) {
          const ProcessGroupPtr& g = mesh.group(dim);
          auto& shm = dynamic_cast<ShmProcessGroup&>(*g);
          const ShmBudget& b = shm.shm_budget();
          if (b.job_bytes != root.shm_budget().job_bytes || b.weight != 2 || b.total_weight != 32 ||
              b.host_ranks != 8)
            rc = 4;  // not drawn from the world's budget
          if (shm.segment_bytes() >
              std::max<uint64_t>(b.share_bytes(), ShmProcessGroup::smallest_segment_bytes(2)))
            rc = 5;  // more than its share
          if (g->rank() == 0) {
            std::lock_guard lock(print_mu);
            std::fprintf(stderr, "%s group of rank %d: segment %zu KiB, staging %zu KiB\n", dim, r,
                         shm.segment_bytes() >> 10, shm.staging_bytes() >> 10);
          }
          // More than the staging buffers hold, so that the staged path cycles them.
          const size_t count = (size_t{3} << 20) / sizeof(float);
          std::vector<float> v(count);
          for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(r + (i % 5));
          g->all_reduce(v.data(), count, DType::f32)->wait();
          float want_base = 0;
          for (int q : mesh.group_ranks({dim})) want_base += static_cast<float>(q);
          for (size_t i = 0; i < count; ++i)
            if (v[i] != want_base + 2.0f * static_cast<float>(i % 5)) rc = 6;
          std::vector<float> mine(4096, static_cast<float>(r)), all(8192);
          g->all_gather(mine.data(), all.data(), mine.size(), DType::f32)->wait();
          const std::vector<int> members = mesh.group_ranks({dim});
          for (size_t i = 0; i < all.size(); ++i)
            if (all[i] != static_cast<float>(members[i / mine.size()])) rc = 7;
        }
        std::vector<float> x(1 << 16, 1.0f);
        pg->all_reduce(x.data(), x.size(), DType::f32)->wait();
        if (x.back() != 8.0f) rc = 8;
      } catch (const std::exception& e) {
        std::lock_guard lock(print_mu);
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 9;
      }
    });
  }
  for (auto& t : ranks) t.join();
  return rc.load();
}

// A container's default 64 MiB /dev/shm: an 8-rank 2x2x2 mesh makes its world and 12 groups
// from one budget and runs collectives on all of them. Sized alone, the tp groups found too
// little room (ShmBudget.ABudgetFitsEveryGroupOf... shows the sizes).
TEST(ShmBudgetMesh, AnEightRankMeshMakesEveryGroupInA64MiBDevShm) {
  MT_SKIP_UNLESS("mountns", ::geteuid() == 0, "needs root to mount a small /dev/shm");
  const int rc =
      ::meshtrain::testing::with_small_dev_shm("64m", [] { return run_mesh_in_budget(true); });
  MT_SKIP_UNLESS("mountns", rc != 3,
                 "cannot make a mount namespace with a small /dev/shm here (reason above)");
  EXPECT_EQ(rc, 0) << "4: a group not drawn from the world's budget, 5: a segment over its "
                      "share, 6: wrong all-reduce, 7: wrong all-gather, 8: wrong world "
                      "all-reduce, 9: an exception (printed above)";
}

// Too small for the smallest segments of the world and its planned groups: the world's creation
// fails on every rank with one line saying what /dev/shm lacks and what to do, before any split.
TEST(ShmBudgetMesh, ADevShmTooSmallForThePlanIsOneClearErrorOnEveryRank) {
  MT_SKIP_UNLESS("mountns", ::geteuid() == 0, "needs root to mount a small /dev/shm");
  const int rc = ::meshtrain::testing::with_small_dev_shm("12m", [] {
    const int world = 8;
    std::vector<std::string> errors(world);
    auto store = std::make_shared<HashStore>();
    store->set_timeout(std::chrono::seconds(30));
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        try {
          ProcessGroupOptions o = testing::test_options("shm");
          o.shm_budget.planned_groups = parallel::DeviceMesh::split_sizes(kMesh222);
          auto pg = make_process_group("shm", store, r, world, o);
        } catch (const meshtrain::CommError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (const std::string& e : errors) {
      std::fprintf(stderr, "%s\n", e.c_str());
      if (e.find("/dev/shm has") == std::string::npos ||
          e.find("--shm-size") == std::string::npos || e.find("12 groups") == std::string::npos)
        return 4;
    }
    return 0;
  });
  MT_SKIP_UNLESS("mountns", rc != 3,
                 "cannot make a mount namespace with a small /dev/shm here (reason above)");
  EXPECT_EQ(rc, 0) << "4: a rank's error (printed above) does not name the plan, what /dev/shm "
                      "lacks and what to do, 7: another exception (printed above)";
}

// Four ranks on two cores, split into two groups of two ranks bound to a core each: alone such a
// group would spin, but its ranks compete with the other group's for the same two cores.
TEST(ShmBudget, ASplitGroupJudgesSpinningByTheHostsRanksPerCore) {
  const std::vector<int> cpus = runtime::allowed_cpus();
  MT_SKIP_UNLESS("cores", cpus.size() >= 2,
                 "needs 2 usable cores, this process has " << cpus.size());
  std::atomic<int> rc{0};
  testing::run_ranks(
      "shm", 4,
      [&](ProcessGroup& pg) {
        auto& base = dynamic_cast<ShmProcessGroup&>(pg);
        if (!base.oversubscribed()) rc = 4;
        ProcessGroupPtr a = base.split({0, 1});
        ProcessGroupPtr b = base.split({2, 3});
        ProcessGroupPtr mine = a ? a : b;
        auto& g = dynamic_cast<ShmProcessGroup&>(*mine);
        if (g.shm_budget().host_ranks != 4 || g.shm_budget().host_cpus != 2) rc = 5;
        if (!g.oversubscribed()) rc = 6;
        std::vector<float> x(1000, 1.0f);
        mine->all_reduce(x.data(), x.size(), DType::f32)->wait();
        if (x[999] != 2.0f) rc = 7;
      },
      [&](int rank, ProcessGroupOptions&) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[static_cast<size_t>(rank % 2)], &set);
        ASSERT_EQ(::sched_setaffinity(0, sizeof(set), &set), 0);
      });
  EXPECT_EQ(rc.load(), 0) << "4: the world of 4 on 2 cores not oversubscribed, 5: the split "
                             "does not know the host's ranks and cores, 6: the split spins as "
                             "if alone, 7: wrong all-reduce";
}

}  // namespace
}  // namespace meshtrain::comm
