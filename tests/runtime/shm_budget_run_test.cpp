// meshtrain train plans the shm budget for the groups its engine's mesh splits off the world: a
// pipeline of 2 stages x 2 replicas on 4 ranks makes its 4 groups of 2 from shares of one budget
// (the world's 4 ranks and 4 x 2 planned ranks: 12), not each from what /dev/shm has free.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class ShmBudgetRun : public meshtrain::testing::TrainRunTest {};

TEST_F(ShmBudgetRun, TheEnginesMeshGroupsDrawFromTheWorldsPlannedBudget) {
  const CommandResult r =
      run_command("MESHTRAIN_LOG_LEVEL=debug " + kMeshrunBin +
                  " --nproc-per-node 4 --grace-period 5 -- " + kMeshtrainBin + " " +
                  train_args(dir_ / "run", 2, 0,
                             "--set dist.backend=shm --set parallel.pp=2 --set model.n_layer=2 "
                             "--set model.dropout=0"));
  ASSERT_EQ(r.status, 0) << r.output;
  // Each group's rank 0 says which share it took: the 2 pp and 2 dp groups, 2/12 each.
  size_t shares = 0;
  for (size_t at = r.output.find("shm group of 2 ranks: its share (2/12)"); at != std::string::npos;
       at = r.output.find("shm group of 2 ranks: its share (2/12)", at + 1))
    ++shares;
  EXPECT_EQ(shares, 4u) << r.output;
  std::printf("%zu groups of 2 drew 2/12 of the job's budget\n", shares);
  EXPECT_NE(r.output.find("shm group of 4 ranks"), std::string::npos)
      << "the world states its own share: " << r.output;
}

}  // namespace
