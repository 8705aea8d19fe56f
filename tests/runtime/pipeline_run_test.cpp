// Pipeline parallelism end to end with the built meshtrain and meshrun programs on a tiny model:
// 2 stages against one rank (bitwise, tied or untied), 2 stages x 2 replicas against one
// rank with the same global batch (to 1e-6), checkpoints moving between pp layouts, a killed
// stage restarted by meshrun, and the bad pipeline settings, one line each with exit status 2.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class PipelineRun : public meshtrain::testing::TrainRunTest {
 protected:
  // Four layers (two blocks, the embedding and the head), no dropout: one rank and a pipeline
  // draw no masks, so the only differences left are the order of additions.
  static std::string pipe_args(const fs::path& out, const std::string& extra) {
    return train_args(out, 8, 0,
                      "--set model.n_layer=2 --set model.dropout=0 --set train.grad_accum_steps=2 "
                      "--set dist.check_interval=1 " +
                          extra);
  }
};

TEST_F(PipelineRun, TwoStagesMatchOneRank) {
  for (const char* tie : {"false", "true"}) {
    SCOPED_TRACE(std::string("model.tie_embeddings = ") + tie);
    const std::string t = std::string("--set model.tie_embeddings=") + tie;
    const fs::path one = dir_ / (std::string("one_") + tie), pp = dir_ / (std::string("pp_") + tie);
    CommandResult a = run_command(kMeshtrainBin + " " + pipe_args(one, t));
    ASSERT_EQ(a.status, 0) << a.output;
    CommandResult b = run_command(meshrun(2) + pipe_args(pp, t + " --set parallel.pp=2"));
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("pipeline 1f1b over 2 stages"), std::string::npos) << b.output;
    // The start line counts the whole model's parameters, which no stage holds.
    const auto count = [](const std::string& out) {
      const size_t at = out.find("meshtrain: GPT ");
      return at == std::string::npos ? -1.0 : std::strtod(out.c_str() + at + 15, nullptr);
    };
    EXPECT_GT(count(a.output), 0.0) << a.output;
    EXPECT_EQ(count(b.output), count(a.output)) << b.output;
    const auto want = losses(one), got = losses(pp);
    ASSERT_EQ(want.size(), 8u);
    ASSERT_EQ(got.size(), 8u);
    bool same = false;
    const float worst = weights_difference(pp, one, &same);
    float worst_loss = 0;
    for (const auto& [step, l] : want)
      worst_loss = std::max(worst_loss, std::fabs(got.at(step) - l));
    std::printf("tie_embeddings=%s: largest loss difference %.3g, weight difference %.3g\n", tie,
                worst_loss, worst);
    // Tied too: the pipeline adds the tied embedding's contributions in one rank's order.
    EXPECT_TRUE(same) << "largest difference " << worst;
    EXPECT_EQ(worst_loss, 0.0f);
  }
}

// 2 stages x 2 replicas (4 processes) against one rank with the global batch of 16: replica r
// reads half of each step's sequences, so its micro-batches are half as large; the replicas'
// average of their means adds the same terms in another order than one rank's mean, so the two
// agree to rounding (about 1e-7 per step), not bitwise.
TEST_F(PipelineRun, TwoByTwoMatchesOneRankWithTheGlobalBatch) {
  const fs::path one = dir_ / "one", grid = dir_ / "grid";
  CommandResult a = run_command(kMeshtrainBin + " " + pipe_args(one, "--set data.batch_size=8"));
  ASSERT_EQ(a.status, 0) << a.output;
  CommandResult b = run_command(
      meshrun(4) + pipe_args(grid,
                             "--set data.batch_size=4 --set parallel.pp=2 "
                             "--set parallel.schedule=gpipe --set train.eval_interval=4"));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("pipeline gpipe over 2 stages x 2 data-parallel replicas"),
            std::string::npos)
      << b.output;
  const auto want = losses(one), got = losses(grid);
  ASSERT_EQ(got.size(), 8u);
  float worst_loss = 0;
  for (const auto& [step, l] : want) worst_loss = std::max(worst_loss, std::fabs(got.at(step) - l));
  bool same = false;
  const float worst = weights_difference(grid, one, &same);
  std::printf("pp 2 x dp 2: largest loss difference %.3g, weight difference %.3g\n", worst_loss,
              worst);
  EXPECT_LE(worst_loss, 1e-6f);
  // Clipping is on: the global norm (summed per tensor and stage, the replicas' halves apart)
  // differs from one rank's in its last bits, and Adam carries that into the weights over the
  // 8 steps (1.0e-6 measured).
  EXPECT_LE(worst, 2e-6f);
}

// A checkpoint holds the whole model by name whatever pp wrote it: 2 stages -> 1 rank -> 2
// stages (another schedule) continues bit for bit as one rank that never stopped (untied
// embeddings: each layout computes the same bits, so any state lost or misplaced shows).
TEST_F(PipelineRun, CheckpointsMoveBetweenPipelineLayouts) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string untied = "--set model.tie_embeddings=false ";
  auto args = [&](const fs::path& out, int steps, const std::string& extra) {
    return train_args(
        out, steps, 4,
        "--set model.n_layer=2 --set model.dropout=0 --set train.grad_accum_steps=2 " + untied +
            extra);
  };
  CommandResult first = run_command(meshrun(2) + args(a, 8, "--set parallel.pp=2"));
  ASSERT_EQ(first.status, 0) << first.output;
  CommandResult one = run_command(kMeshtrainBin + " " + args(a, 12, ""));
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_NE(one.output.find("(step 8 of 12)"), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("data-parallel size"), std::string::npos) << one.output;
  CommandResult back =
      run_command(meshrun(2) + args(a, 16, "--set parallel.pp=2 --set parallel.schedule=gpipe"));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_NE(back.output.find("(step 12 of 16)"), std::string::npos) << back.output;

  CommandResult straight = run_command(kMeshtrainBin + " " + args(b, 16, ""));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 16u);
  ASSERT_EQ(resumed.size(), 16u);
  for (const auto& [step, l] : reference) EXPECT_EQ(resumed.at(step), l) << "step " << step;
  bool same = false;
  const float worst = weights_difference(a, b, &same);
  EXPECT_TRUE(same) << "largest weight difference " << worst;
}

// Stage 1 is killed (SIGKILL) while both stages are inside the save of step 10; meshrun restarts
// the pipeline, which resumes from the step-5 checkpoint, and the job ends with the weights of
// an uninterrupted run, bit for bit.
TEST_F(PipelineRun, KilledStageResumesThroughMeshrunRestarts) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string pp = "--set model.n_layer=2 --set model.dropout=0 --set parallel.pp=2";
  kill_rank1_mid_save_and_resume(
      a, "env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " + kMeshrunBin +
             " --nproc-per-node 2 --grace-period 5 --max-restarts 1 -- " + kMeshtrainBin + " " +
             train_args(a, 20, 5, pp));
  if (HasFatalFailure()) return;

  CommandResult straight = run_command(meshrun(2) + train_args(b, 20, 0, pp));
  ASSERT_EQ(straight.status, 0) << straight.output;
  bool same = false;
  const float worst = weights_difference(a, b, &same);
  EXPECT_TRUE(same) << "largest weight difference " << worst;
}

TEST_F(PipelineRun, BadPipelineSettingsAreOneLineAndStatus2) {
  struct Bad {
    std::string set;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"--set parallel.pp=5",
       "parallel.pp x parallel.virtual_stages = 5 pipeline stages is more "
       "than the model's 4 layers"},
      {"--set parallel.pp=2 --set parallel.micro_batches=3",
       "parallel.micro_batches = 3 does not divide the batch of 8 sequences per replica"},
      {"--set parallel.pp=2 --set model.n_layer=6 --set parallel.schedule=interleaved "
       "--set parallel.virtual_stages=2",
       "the interleaved schedule's 4 chunks (parallel.pp x parallel.virtual_stages) do not "
       "divide model.n_layer = 6"},
      {"--set parallel.pp=2 --set parallel.partition=layers",
       "parallel.partition = \"layers\" is not one of: flops, params"},
      {"--set parallel.pp=2 --set parallel.zero_stage=3",
       "parallel.zero_stage = 3 with parallel.pp = 2 is not available yet"},
  };
  for (const Bad& b : bad) {
    CommandResult r = run_command(kMeshtrainBin + " " + pipe_args(dir_, b.set));
    EXPECT_EQ(r.status, 2) << b.set << "\n" << r.output;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << b.set << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  // 3 stages cannot tile 4 ranks.
  CommandResult r = run_command(meshrun(4) + pipe_args(dir_, "--set parallel.pp=3"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("parallel.pp x parallel.tp = 3 does not divide the 4 ranks"),
            std::string::npos)
      << r.output;
}

}  // namespace
