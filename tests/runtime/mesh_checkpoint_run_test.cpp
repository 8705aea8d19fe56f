// Checkpoints of the 3D mesh end to end, with the built meshtrain and meshrun programs on a tiny
// model: a run of 8 ranks as pp 2 x dp 2 x tp 2 saves at step 8 and runs on uninterrupted to 16;
// its step-8 checkpoint resumes as plain data parallelism (dp 2, 2 ranks), as one replica of the
// pipeline over tp (pp 2 x tp 2, 4 ranks, which saves again and goes back to 2 x 2 x 2), and in
// the same 2 x 2 x 2 layout, each continuing the uninterrupted run's losses; the export of the
// 3D checkpoint is the uninterrupted run's gathered weights, byte for byte. Under ZeRO-1/2 over
// dp the mesh's checkpoints move between ZeRO stages and layouts the same way.
//
// Tolerances: the same layout computes each step the same way and continues with the same bits.
// Another layout reads the exact state (the checkpoint holds every tensor's whole bits, see
// tests/parallel/tp_checkpoint_test.cpp), but adds in another order: one rank sums a row-split
// matrix's partial products that tp = 2 adds over its ranks, and one replica accumulates the
// four micro-batches that two replicas average in pairs, so those steps agree within the 1e-5
// relative of PipelineTensorParallelRun.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class MeshCheckpointRun : public TrainRunTest {
 protected:
  // A global batch of 4 sequences: one sequence a micro-batch x accumulation x dp replicas. Four
  // layers (two blocks, the embedding and the head), so that two stages hold two each.
  static std::string layout(int pp, int dp, int tp, const std::string& extra = "") {
    return "--set model.n_layer=2 --set data.batch_size=1 --set model.dropout=0.1"
           " --set train.grad_accum_steps=" +
           std::to_string(4 / dp) + " --set parallel.pp=" + std::to_string(pp) +
           " --set parallel.tp=" + std::to_string(tp) + " " + extra;
  }

  static std::string resume_from(const fs::path& step) {
    return "--set ckpt.resume_from=" + step.string();
  }

  // Losses of `got` against `want` over steps [from, to]: the same bits, or within `rel`.
  static void expect_losses(const fs::path& got_dir, const fs::path& want_dir, int64_t from,
                            int64_t to, double rel) {
    const auto got = losses(got_dir), want = losses(want_dir);
    double worst = 0;
    for (int64_t step = from; step <= to; ++step) {
      ASSERT_TRUE(got.count(step) && want.count(step)) << "step " << step;
      if (rel == 0)
        EXPECT_EQ(got.at(step), want.at(step)) << "step " << step;
      else
        EXPECT_NEAR(got.at(step), want.at(step), rel * std::fabs(want.at(step))) << "step " << step;
      worst = std::max(worst, std::fabs(double{got.at(step)} - want.at(step)) / want.at(step));
    }
    std::printf("%s: steps %lld to %lld, largest relative loss difference %.3g\n",
                got_dir.filename().string().c_str(), static_cast<long long>(from),
                static_cast<long long>(to), worst);
  }
};

TEST_F(MeshCheckpointRun, ThreeDimensionalCheckpointMovesAcrossLayouts) {
  const fs::path straight = dir_ / "straight", ddp = dir_ / "ddp", one = dir_ / "one_replica",
                 same = dir_ / "same";
  // Uninterrupted: 2 x 2 x 2 for 16 steps, saving at 8 and 16 (a save changes no arithmetic).
  CommandResult ref = run_command(meshrun(8) + train_args(straight, 16, 8, layout(2, 2, 2)));
  ASSERT_EQ(ref.status, 0) << ref.output;
  const fs::path step8 = straight / "checkpoints" / "step_8";
  // dp-replica 0 writes: rank 5 is stage 1, replica 0, tp rank 1 (tp varies fastest, pp slowest).
  ASSERT_TRUE(fs::exists(step8 / "model_rank00005.safetensors")) << ref.output;

  // Each resumed run writes into a directory of its own, so its metrics hold only its own steps;
  // a run resumes only with checkpoints on (ckpt.interval > 0), and the line proves it did (a
  // fresh start's steps 9 to 12 would agree to 1e-7 too).
  const std::string kResumedAt8 = "(step 8 of 12, ckpt.resume_from = " + step8.string() + ")";
  CommandResult a =
      run_command(meshrun(2) + train_args(ddp, 12, 4, layout(1, 2, 1, resume_from(step8))));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find(kResumedAt8), std::string::npos) << a.output;

  CommandResult b =
      run_command(meshrun(4) + train_args(one, 12, 4, layout(2, 1, 2, resume_from(step8))));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find(kResumedAt8), std::string::npos) << b.output;
  // Its own step-12 checkpoint (pp 2 x tp 2, one replica) back at 2 x 2 x 2.
  CommandResult back = run_command(meshrun(8) + train_args(one, 16, 4, layout(2, 2, 2)));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_NE(back.output.find("(step 12 of 16)"), std::string::npos) << back.output;

  CommandResult c =
      run_command(meshrun(8) + train_args(same, 12, 4, layout(2, 2, 2, resume_from(step8))));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find(kResumedAt8), std::string::npos) << c.output;

  expect_losses(same, straight, 9, 12, 0);
  expect_losses(ddp, straight, 9, 12, 1e-5);
  expect_losses(one, straight, 9, 16, 1e-5);

  // The export of the uninterrupted run's step-16 checkpoint (written by the 8 ranks' parts) is
  // the whole model the run gathered at its end.
  const fs::path exported = dir_ / "export.safetensors";
  CommandResult e =
      run_command(kMeshtrainBin + " ckpt export " + (straight / "checkpoints").string() +
                  " --out " + exported.string());
  ASSERT_EQ(e.status, 0) << e.output;
  std::string why;
  EXPECT_TRUE(same_tensors(exported, straight / "model.safetensors", &why)) << why;
}

// ZeRO over dp in the 3D mesh: its checkpoint holds each stage's tp parts of the optimizer
// state, put together over the replicas, under the whole model's names. ZeRO-1 computes what
// ZeRO-0 does bit for bit (tests/parallel/pipeline_tp_zero_test.cpp), so a ZeRO-1 checkpoint
// that resumes at ZeRO-0 or ZeRO-1 in the same layout must continue with the same bits, which
// only an exact state gives. ZeRO-2 adds the norm's squares in another order (1e-6 relative
// over these steps), and tp alone (pp 1) accumulates as one stage: those within 1e-5.
TEST_F(MeshCheckpointRun, ZeroCheckpointsOfTheMeshMoveAcrossStagesAndLayouts) {
  const fs::path straight = dir_ / "straight", zero1 = dir_ / "zero1", to0 = dir_ / "to_zero0",
                 to1 = dir_ / "to_zero1", tp_only = dir_ / "tp_only", to2 = dir_ / "to_zero2";
  const auto zero = [](int stage) { return "--set parallel.zero_stage=" + std::to_string(stage); };
  CommandResult ref = run_command(meshrun(8) + train_args(straight, 16, 8, layout(2, 2, 2)));
  ASSERT_EQ(ref.status, 0) << ref.output;
  CommandResult z1 = run_command(meshrun(8) + train_args(zero1, 8, 8, layout(2, 2, 2, zero(1))));
  ASSERT_EQ(z1.status, 0) << z1.output;
  EXPECT_NE(z1.output.find("ZeRO-1 over each stage's 2 replicas"), std::string::npos) << z1.output;
  const fs::path z1_step8 = zero1 / "checkpoints" / "step_8";
  ASSERT_TRUE(fs::exists(z1_step8 / "model_rank00005.safetensors")) << z1.output;
  const std::string kResumedAt8 = "(step 8 of 12, ckpt.resume_from = " + z1_step8.string() + ")";

  // ZeRO-1's checkpoint at ZeRO-0 and at ZeRO-1, the same layout.
  CommandResult a =
      run_command(meshrun(8) + train_args(to0, 12, 4, layout(2, 2, 2, resume_from(z1_step8))));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find(kResumedAt8), std::string::npos) << a.output;
  CommandResult b = run_command(
      meshrun(8) + train_args(to1, 12, 4, layout(2, 2, 2, zero(1) + " " + resume_from(z1_step8))));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find(kResumedAt8), std::string::npos) << b.output;
  // At dp 2 x tp 2 with ZeRO-2 (tp alone: one stage), which saves at 12 and goes back to the
  // 3D mesh at ZeRO-0.
  CommandResult c =
      run_command(meshrun(4) + train_args(tp_only, 12, 4,
                                          layout(1, 2, 2, zero(2) + " " + resume_from(z1_step8))));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find(kResumedAt8), std::string::npos) << c.output;
  CommandResult back = run_command(meshrun(8) + train_args(tp_only, 16, 4, layout(2, 2, 2)));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_NE(back.output.find("(step 12 of 16)"), std::string::npos) << back.output;
  // ZeRO-0's checkpoint at ZeRO-2, the same layout.
  const fs::path step8 = straight / "checkpoints" / "step_8";
  CommandResult d = run_command(
      meshrun(8) + train_args(to2, 12, 4, layout(2, 2, 2, zero(2) + " " + resume_from(step8))));
  ASSERT_EQ(d.status, 0) << d.output;
  EXPECT_NE(d.output.find("(step 8 of 12, ckpt.resume_from = " + step8.string() + ")"),
            std::string::npos)
      << d.output;

  expect_losses(zero1, straight, 1, 8, 0);
  expect_losses(to0, straight, 9, 12, 0);
  expect_losses(to1, straight, 9, 12, 0);
  expect_losses(tp_only, straight, 9, 16, 1e-5);
  expect_losses(to2, straight, 9, 12, 1e-6);
}

}  // namespace
}  // namespace meshtrain::testing
