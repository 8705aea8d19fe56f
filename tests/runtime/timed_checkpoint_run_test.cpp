// ckpt.interval_minutes end to end on two ranks: rank 0's clock (a fake one that advances 30 s
// per step, MESHTRAIN_TEST_CLOCK_STEP_S, so nothing waits) makes a checkpoint due every second
// step with no step interval in reach; both ranks must save at those steps, which the commit
// proves (a checkpoint is only committed with every rank's record of the same step).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/manifest.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class TimedCheckpointRun : public TrainRunTest {};

TEST_F(TimedCheckpointRun, BothRanksSaveWhenRank0sClockSaysSo) {
  const fs::path out = dir_ / "run";
  const CommandResult r =
      run_command("env MESHTRAIN_TEST_CLOCK_STEP_S=30 " + kMeshrunBin +
                  " --nproc-per-node 2 --grace-period 5 -- " + kMeshtrainBin + " " +
                  train_args(out, 7, 1000, "--set ckpt.interval_minutes=1 --set ckpt.keep_last=0"));
  ASSERT_EQ(r.status, 0) << r.output;
  // Readings: 0 at the start, 30 at step 1, 60 at step 2 (due), ... and the end of the run.
  const std::string root = (out / "checkpoints").string();
  EXPECT_EQ(ckpt::list_complete_steps(root), (std::vector<int64_t>{2, 4, 6, 7})) << r.output;
  for (int64_t step : {2, 4, 6}) {
    EXPECT_NE(r.output.find("checkpoint at step " + std::to_string(step) +
                            ": ckpt.interval_minutes = 1 passed since the last one"),
              std::string::npos)
        << r.output;
    const ckpt::Manifest m =
        ckpt::read_manifest((fs::path(root) / ckpt::step_dir_name(step)).string());
    EXPECT_EQ(m.world.world_size, 2);
    EXPECT_EQ(m.step, step);
  }
}

TEST_F(TimedCheckpointRun, ANegativeIntervalIsOneClearLine) {
  const CommandResult r = run_command(
      kMeshtrainBin + " " + train_args(dir_ / "run", 2, 0, "--set ckpt.interval_minutes=-1"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.interval_minutes must be >= 0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace meshtrain::testing
