// Mixed precision and activation checkpointing end to end through the built program: an f16
// run saves its loss scaler (scale, growth tracker) in every checkpoint and a resumed run
// continues with it, step for step like a run that never stopped; a bf16 run with every block
// checkpointed trains and says so; bad values are one-line config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class MixedPrecisionRun : public TrainRunTest {
 protected:
  // step -> the value of `key` in rank 0's metrics.jsonl (the last record of a step wins).
  static std::map<int64_t, double> metric(const fs::path& out, const std::string& key) {
    std::map<int64_t, double> m;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains(key)) m[j["step"].get<int64_t>()] = j[key].get<double>();
    }
    return m;
  }
};

constexpr const char* kF16 =
    "--set train.precision=f16 --set train.loss_scale_growth_interval=3 "
    "--set model.activation_checkpointing=all";

TEST_F(MixedPrecisionRun, F16LossScalerStateIsCheckpointedAndResumed) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  CommandResult straight = run_command(kMeshtrainBin + " " + train_args(a, 8, 4, kF16));
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_NE(straight.output.find("precision f16"), std::string::npos) << straight.output;
  // Growth every 3 finite steps from 65536: steps 1-3, 4-6, 7-8.
  const auto scales = metric(a, "loss_scale");
  ASSERT_EQ(scales.size(), 8u);
  EXPECT_EQ(scales.at(1), 65536.0);
  EXPECT_EQ(scales.at(4), 131072.0);
  EXPECT_EQ(scales.at(7), 262144.0);
  const std::string manifest = file_bytes(a / "checkpoints" / "step_4" / "manifest.json");
  const auto j = nlohmann::json::parse(manifest, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << manifest;
  EXPECT_NE(manifest.find("\"loss_scaler\""), std::string::npos) << manifest;

  // Stop at step 4, then resume to 8.
  CommandResult first = run_command(kMeshtrainBin + " " + train_args(b, 4, 4, kF16));
  ASSERT_EQ(first.status, 0) << first.output;
  CommandResult resumed = run_command(kMeshtrainBin + " " + train_args(b, 8, 4, kF16));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  const auto resumed_scales = metric(b, "loss_scale");
  const auto la = losses(a), lb = losses(b);
  for (int64_t step = 5; step <= 8; ++step) {
    EXPECT_EQ(resumed_scales.at(step), scales.at(step)) << "step " << step;
    EXPECT_EQ(lb.at(step), la.at(step)) << "step " << step;
  }
}

TEST_F(MixedPrecisionRun, Bf16WithCheckpointedBlocksTrainsCloseToF32) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  CommandResult f32 = run_command(kMeshtrainBin + " " + train_args(a, 20, 0));
  ASSERT_EQ(f32.status, 0) << f32.output;
  CommandResult bf16 = run_command(
      kMeshtrainBin + " " +
      train_args(b, 20, 0, "--set train.precision=bf16 --set model.activation_checkpointing=all"));
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("precision bf16; activation checkpointing all"), std::string::npos)
      << bf16.output;
  const auto la = losses(a), lb = losses(b);
  ASSERT_EQ(lb.size(), 20u);
  EXPECT_NE(lb.at(1), la.at(1));  // rounding is in force
  EXPECT_NEAR(lb.at(20), la.at(20), 0.03 * la.at(20));
}

TEST_F(MixedPrecisionRun, BadValuesAreConfigErrors) {
  for (const std::string& bad : {std::string("--set train.precision=f8"),
                                 std::string("--set model.activation_checkpointing=9"),
                                 std::string("--set train.loss_scale_backoff_factor=1.5")}) {
    CommandResult r = run_command(kMeshtrainBin + " " + train_args(dir_ / "x", 2, 0, bad));
    EXPECT_EQ(r.status, 2) << bad << "\n" << r.output;
  }
}

}  // namespace
}  // namespace meshtrain::testing
