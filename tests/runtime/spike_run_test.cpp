// Loss spikes end to end: with train.spike_zscore set, a finite spike injected into one rank's
// loss at step 20 (the step's mean loss, the same bits on every rank, jumps 500-fold) is skipped
// by every rank -- the divergence guard compares the replicas at every step and the run ends
// normally -- under DDP and under ZeRO-2, and no other step is skipped.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class SpikeRun : public meshtrain::testing::TrainRunTest {};

TEST_F(SpikeRun, AnInjectedSpikeIsSkippedByEveryRank) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    const fs::path out = dir_ / ("stage" + std::to_string(stage));
    CommandResult r =
        run_command("env MESHTRAIN_TEST_SPIKE_STEP=20 " + kMeshrunBin + " --nproc-per-node 2 -- " +
                    kMeshtrainBin + " " +
                    train_args(out, 30, 0,
                               "--set train.spike_zscore=8 --set dist.check_interval=1"
                               " --set parallel.zero_stage=" +
                                   std::to_string(stage)));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("(skipped: spike, loss z="), std::string::npos) << r.output;
    std::ifstream in(out / "metrics.jsonl");
    int rows = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("skipped")) continue;
      ++rows;
      const int64_t step = j["step"].get<int64_t>();
      EXPECT_EQ(j["skipped"].get<bool>(), step == 20) << line;
      EXPECT_EQ(j.contains("spike"), step == 20) << line;
    }
    EXPECT_EQ(rows, 30);
  }
}

TEST_F(SpikeRun, ABadThresholdIsOneLine) {
  CommandResult r =
      run_command(kMeshtrainBin + " " + train_args(dir_, 1, 0, "--set train.spike_zscore=-1"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("train.spike_zscore must be >= 0"), std::string::npos) << r.output;
}

}  // namespace
