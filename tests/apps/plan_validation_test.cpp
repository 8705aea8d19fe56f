// The planner's memory per rank against what real training runs hold: this machine calibrated
// by `meshtrain plan --calibrate`, the run's layout predicted by `meshtrain plan --predict`, then
// trained by meshrun with each worker's peak resident memory taken by /usr/bin/time. The tcp
// backend keeps every buffer private to its rank, so a rank's peak RSS is its own memory (the shm
// backend maps every rank's buckets into every rank; bench/plan_validate.sh accounts for that and
// covers 11 layouts, pipeline and tensor parallelism among them, and the step time).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::run_command;

const std::string kMeshtrain = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain";
const std::string kMeshrun = std::string(MESHTRAIN_BINARY_DIR) + "/meshrun";

// The tolerance docs/planner.md holds the memory model to.
constexpr double kTolerance = 0.10;

class PlanValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& p : {kMeshtrain, kMeshrun, std::string("/usr/bin/time")})
      if (::access(p.c_str(), X_OK) != 0)
        FAIL() << p
               << " is missing (meshtrain and meshrun: the build makes them; /usr/bin/time: "
                  "scripts/install-deps.sh, package time)";
    dir_ = fs::temp_directory_path() / ("mt_plan_validation_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream text(dir_ / "t.txt");
    for (int i = 0; i < 4000; ++i) text << "line " << i % 97 << " of the generated text.\n";
    text.close();
    auto r = run_command(kMeshtrain + " data prepare --input " + (dir_ / "t.txt").string() +
                         " --out " + (dir_ / "data").string() + " --val-fraction 0.1");
    ASSERT_EQ(r.status, 0) << r.output;
    r = run_command(kMeshtrain + " plan --calibrate --ranks 2 --calibrate-out " +
                    (dir_ / "cluster.toml").string());
    ASSERT_EQ(r.status, 0) << r.output;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Predicted and measured bytes of the rank with the most, for 2 ranks at a ZeRO stage.
  std::pair<double, double> predicted_and_measured(int zero_stage) {
    const fs::path cfg = dir_ / ("run" + std::to_string(zero_stage) + ".toml");
    std::ofstream(cfg) << "[model]\nn_layer = 4\nn_embd = 256\nn_head = 8\nblock_size = 128\n"
                          "vocab_size = 257\n"
                          "[data]\nbatch_size = 4\nval_batches = 1\ndir = \""
                       << (dir_ / "data").string()
                       << "\"\n"
                          "[train]\nsteps = 4\nthreads = 1\neval_interval = 0\n"
                          "sample_tokens = 0\nsave_weights = false\nout_dir = \""
                       << (dir_ / ("out" + std::to_string(zero_stage))).string()
                       << "\"\n"
                          "[ckpt]\ninterval = 0\nresume = false\n"
                          "[dist]\nbackend = \"tcp\"\n"
                          "[parallel]\nzero_stage = "
                       << zero_stage << "\n";
    auto r = run_command(kMeshtrain + " plan --model-config " + cfg.string() + " --cluster " +
                         (dir_ / "cluster.toml").string() + " --predict");
    EXPECT_EQ(r.status, 0) << r.output;
    const size_t brace = r.output.rfind("\n{");
    if (brace == std::string::npos) {
      ADD_FAILURE() << "no JSON line from --predict: " << r.output;
      return {0, 0};
    }
    const auto pred = nlohmann::json::parse(r.output.substr(brace + 1));
    EXPECT_EQ(pred.at("ranks").get<int>(), 2) << r.output;
    EXPECT_EQ(pred.at("layout").get<std::string>(),
              "dp2 tp1 pp1 z" + std::to_string(zero_stage) + " B4x1")
        << r.output;
    r = run_command(kMeshrun + " --nproc-per-node 2 -- /usr/bin/time -f peak_rss_kb=%M " +
                    kMeshtrain + " train --config " + cfg.string());
    EXPECT_EQ(r.status, 0) << r.output;
    // The run trained with the stage asked for (its start line names ZeRO stages, not DDP).
    if (zero_stage > 0) {
      EXPECT_NE(r.output.find("ZeRO-" + std::to_string(zero_stage) + " "), std::string::npos)
          << r.output;
    }
    double peak = 0;
    int ranks = 0;
    const std::regex line(R"(\[rank \d+\] peak_rss_kb=(\d+))");
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
      peak = std::max(peak, std::stod((*it)[1].str()) * 1024.0);
      ++ranks;
    }
    EXPECT_EQ(ranks, 2) << r.output;
    return {pred.at("memory_bytes").get<double>(), peak};
  }

  fs::path dir_;
};

TEST_F(PlanValidation, PredictedMemoryPerRankIsWithinTenPercentOfDdpAndZero3Runs) {
  for (int stage : {0, 3}) {
    const auto [predicted, measured] = predicted_and_measured(stage);
    ASSERT_GT(measured, 0);
    const double error = predicted / measured - 1;
    std::printf("ZeRO-%d on 2 ranks: predicted %.1f MiB, measured peak RSS %.1f MiB (%+.1f%%)\n",
                stage, predicted / 1048576.0, measured / 1048576.0, 100 * error);
    EXPECT_LT(std::abs(error), kTolerance)
        << "ZeRO-" << stage << ": predicted " << predicted / 1048576.0 << " MiB, measured "
        << measured / 1048576.0 << " MiB";
  }
}

}  // namespace
