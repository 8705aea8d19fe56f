// A checkpoint records what ran its matrix products (library, version, kernels); a run that
// resumes it on another one says so in one line, since the two round differently and the run
// then differs from an uninterrupted one in the last bits. A resume on the same one says nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class GemmResumeRun : public TrainRunTest {};

TEST_F(GemmResumeRun, AResumeOnAnotherGemmLibrarySaysSoAndOnTheSameOneSaysNothing) {
  const fs::path out = dir_ / "run";
  const CommandResult a =
      run_command(kMeshtrainBin + " " + train_args(out, 4, 2, "--set train.gemm=openblas"));
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b =
      run_command(kMeshtrainBin + " " + train_args(out, 6, 2, "--set train.gemm=onednn"));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("(step 4 of 6)"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("the checkpoint's matrix products ran on BLAS OpenBLAS"),
            std::string::npos)
      << b.output;
  EXPECT_NE(b.output.find("this run's run on GEMM oneDNN"), std::string::npos) << b.output;
  const CommandResult c =
      run_command(kMeshtrainBin + " " + train_args(out, 8, 2, "--set train.gemm=onednn"));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("(step 6 of 8)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("matrix products ran on"), std::string::npos) << c.output;
  EXPECT_EQ(last_step(out), 8);
}

}  // namespace
}  // namespace meshtrain::testing
