// train.kernel_times end to end: every step's row says how its forward, backward and optimizer
// time split into GEMM, attention, element-wise and optimizer kernels and the time outside any
// kernel, the parts within the phases they come from; the run's numbers are those of a run
// without it, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class KernelTimesRun : public TrainRunTest {};

TEST_F(KernelTimesRun, RowsSplitTheComputeTimeByKernelKindAndTheLossesDoNotChange) {
  const fs::path timed = dir_ / "timed", plain = dir_ / "plain";
  const CommandResult a =
      run_command(kMeshtrainBin + " " + train_args(timed, 6, 0, "--set train.kernel_times=true"));
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b = run_command(kMeshtrainBin + " " + train_args(plain, 6, 0));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(losses(timed), losses(plain));
  int rows = 0;
  std::ifstream in(timed / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++rows;
    ASSERT_TRUE(j.contains("kernel_s")) << line;
    const auto& k = j["kernel_s"];
    ASSERT_EQ(k.size(), 4u) << line;
    double inside = 0.0;
    for (const char* kind : {"gemm", "attention", "elementwise", "optimizer"}) {
      ASSERT_TRUE(k.contains(kind)) << line;
      EXPECT_GT(k[kind].get<double>(), 0.0) << kind << ": " << line;
      inside += k[kind].get<double>();
    }
    const double computing = j["forward_s"].get<double>() + j["backward_s"].get<double>() +
                             j["optimizer_s"].get<double>();
    EXPECT_LE(inside, computing * (1 + 1e-9)) << line;
    EXPECT_NEAR(inside + j["outside_kernels_s"].get<double>(), computing, 1e-9 + 1e-9 * computing)
        << line;
  }
  EXPECT_EQ(rows, 6);
  std::ifstream other(plain / "metrics.jsonl");
  for (std::string line; std::getline(other, line);)
    EXPECT_EQ(line.find("kernel_s"), std::string::npos) << line;
}

}  // namespace
}  // namespace meshtrain::testing
