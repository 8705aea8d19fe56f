// The shm group decides whether it has more ranks than cores from the cores its ranks may use
// together (every rank's affinity mask), not from one rank's own: ranks bound to a core each
// (meshrun --bind-cores-to-rank) have a core each.
#include <gtest/gtest.h>
#include <sched.h>

#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/runtime/core_binding.h"
#include "tests/support/capability.h"

namespace meshtrain::comm {
namespace {

// Binds the calling thread (a rank of run_ranks) to one core.
void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(set), &set), 0);
}

// The group's view of its cores, and an all-reduce that still works either way.
void expect_group(ProcessGroup& pg, bool oversubscribed) {
  EXPECT_EQ(dynamic_cast<ShmProcessGroup&>(pg).oversubscribed(), oversubscribed)
      << "rank " << pg.rank();
  std::vector<float> x(1000, 1.0f);
  pg.all_reduce(x.data(), x.size(), DType::f32)->wait();
  EXPECT_EQ(x[999], 2.0f);
}

TEST(ShmCores, RanksBoundToACoreEachAreNotOversubscribed) {
  const std::vector<int> cpus = runtime::allowed_cpus();
  MT_SKIP_UNLESS("cores", cpus.size() >= 2,
                 "needs 2 usable cores, this process has " << cpus.size());
  testing::run_ranks(
      "shm", 2, [](ProcessGroup& pg) { expect_group(pg, /*oversubscribed=*/false); },
      [&](int rank, ProcessGroupOptions&) { bind_to(cpus[static_cast<size_t>(rank)]); });
}

TEST(ShmCores, RanksBoundToOneCoreAreOversubscribed) {
  const std::vector<int> cpus = runtime::allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  testing::run_ranks(
      "shm", 2, [](ProcessGroup& pg) { expect_group(pg, /*oversubscribed=*/true); },
      [&](int, ProcessGroupOptions&) { bind_to(cpus.front()); });
}

}  // namespace
}  // namespace meshtrain::comm
