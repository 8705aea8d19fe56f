// ZeRO end to end with the built meshtrain and meshrun programs on a tiny model: checkpoints
// move between stages and world sizes (ZeRO-3 on 4 ranks -> DDP on 2 -> ZeRO-1 on 3) and each
// resumed run continues as the loaded state dictates; a rank killed under ZeRO-3 is restarted by
// meshrun and the job ends with the parameters of an uninterrupted run; bad [parallel] settings
// are one line and exit status 2.
#include <gtest/gtest.h>

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

class ZeroRun : public meshtrain::testing::TrainRunTest {};

// Micro-batches of one sequence and a global batch of 12: 4 ranks x accumulation 3, 2 ranks x 6
// and 3 ranks x 4 all train on the same 12 sequences per step.
std::string zero(int stage, int accum) {
  return "--set data.batch_size=1 --set train.grad_accum_steps=" + std::to_string(accum) +
         " --set parallel.zero_stage=" + std::to_string(stage);
}

// Reordered float32 sums (other world sizes, other micro-batch groupings) move the loss by
// about 1e-7 relative per step; a wrong state (optimizer moments, data position, a shard loaded
// into the wrong place) moves it by 1e-3 or more.
TEST_F(ZeroRun, CheckpointsMoveAcrossStagesAndWorldSizes) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  CommandResult first = run_command(meshrun(4) + train_args(a, 4, 4, zero(3, 3)));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("ZeRO-3 over 4 ranks"), std::string::npos) << first.output;

  // The ZeRO-3 checkpoint holds flat pieces on every rank; export gives one whole file.
  const fs::path exported = dir_ / "exported.safetensors";
  CommandResult exp = run_command(kMeshtrainBin + " ckpt export " + (a / "checkpoints").string() +
                                  " --out " + exported.string());
  ASSERT_EQ(exp.status, 0) << exp.output;
  const auto whole = meshtrain::ckpt::load_safetensors(exported.string());
  ASSERT_TRUE(whole.contains("h.0.mlp.c_fc.weight")) << exp.output;
  EXPECT_EQ(whole.at("h.0.mlp.c_fc.weight").shape(), (meshtrain::Shape{128, 32}));
  EXPECT_EQ(whole.at("wte.weight").dim(), 2);

  CommandResult ddp = run_command(meshrun(2) + train_args(a, 8, 4, zero(0, 3)));
  ASSERT_EQ(ddp.status, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("(step 4 of 8)"), std::string::npos) << ddp.output;
  EXPECT_NE(ddp.output.find("data-parallel size 4 -> 2: keeping the global batch of 12"),
            std::string::npos)
      << ddp.output;

  CommandResult z1 = run_command(meshrun(3) + train_args(a, 12, 4, zero(1, 3)));
  ASSERT_EQ(z1.status, 0) << z1.output;
  EXPECT_NE(z1.output.find("(step 8 of 12)"), std::string::npos) << z1.output;
  EXPECT_NE(z1.output.find("ZeRO-1 over 3 ranks"), std::string::npos) << z1.output;

  CommandResult straight = run_command(meshrun(4) + train_args(b, 12, 0, zero(3, 3)));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 12u);
  ASSERT_EQ(resumed.size(), 12u);
  float worst = 0;
  for (int64_t step = 1; step <= 12; ++step) {
    EXPECT_NEAR(resumed.at(step), reference.at(step), 2e-5f) << "step " << step;
    worst = std::max(worst, std::fabs(resumed.at(step) - reference.at(step)));
  }
  std::printf("largest loss difference across the three layouts: %.3g\n", worst);
  // The final weights of a ZeRO-3 run are whole (rank 0 gathered them) and load as a model.
  const auto weights = meshtrain::ckpt::load_safetensors((b / "model.safetensors").string());
  EXPECT_TRUE(weights.contains("wte.weight"));
  EXPECT_TRUE(weights.contains("h.0.attn.c_attn.weight"));
}

// Rank 1 is killed (SIGKILL) while every rank is inside the save of step 10 under ZeRO-3;
// meshrun restarts the group, which resumes from the step-5 checkpoint (each rank loading its
// own shards), and the final weights equal an uninterrupted run's, bit for bit.
TEST_F(ZeroRun, KilledRankUnderZero3ResumesToTheSameParameters) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  kill_rank1_mid_save_and_resume(a, "env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " +
                                        meshrun(2, "--max-restarts 1") +
                                        train_args(a, 20, 5, zero(3, 1)));
  if (HasFatalFailure()) return;

  CommandResult straight = run_command(meshrun(2) + train_args(b, 20, 0, zero(3, 1)));
  ASSERT_EQ(straight.status, 0) << straight.output;
  // The tensors, not the files: the files' metadata names each run's own directory.
  const auto resumed = meshtrain::ckpt::load_safetensors((a / "model.safetensors").string());
  const auto reference = meshtrain::ckpt::load_safetensors((b / "model.safetensors").string());
  ASSERT_EQ(resumed.tensors.size(), reference.tensors.size());
  ASSERT_FALSE(reference.tensors.empty());
  for (const auto& [name, t] : reference.tensors) {
    ASSERT_TRUE(resumed.contains(name)) << name;
    const auto& r = resumed.at(name);
    ASSERT_EQ(r.nbytes(), t.nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(r.data_ptr(), t.data_ptr(), t.nbytes()))
        << name << ": the resumed run's final parameters differ from an uninterrupted run's";
  }
}

// The first number after `"key":` in the output.
double json_number(const std::string& out, const std::string& key) {
  const size_t at = out.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::strtod(out.c_str() + at + key.size() + 3, nullptr);
}

// What a rank holds between steps, measured by the tensor allocator and the communication
// buffers' count, against the ZeRO paper's formulas for f32 AdamW (4 bytes of parameters, 4 of
// gradients and 8 of optimizer state per parameter, P parameters, N ranks), plus the buffers the
// engine reports as in flight (ZeRO-2's pair of bucket buffers, ZeRO-3's gathered units). The
// allowance: 5% of the formula for the padding of buckets and units to a multiple of N, and
// 96 KiB for what else a rank holds between steps (the step's batches, the loss).
TEST_F(ZeroRun, MemoryAtRestFollowsTheFormulasOfEachStage) {
  const std::string model =
      " --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set "
      "train.log_format=json --set dist.bucket_mb=0.05 --set dist.first_bucket_mb=0.01";
  for (int world : {2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", ZeRO-" + std::to_string(stage));
      std::string name = "world";
      name += std::to_string(world) + "_stage" + std::to_string(stage);
      const fs::path out = dir_ / name;
      CommandResult r = run_command(meshrun(world) + train_args(out, 1, 0, zero(stage, 1) + model));
      ASSERT_EQ(r.status, 0) << r.output;
      const size_t at = r.output.find("GPT ");
      ASSERT_NE(at, std::string::npos) << r.output;
      const double p = std::strtod(r.output.c_str() + at + 4, nullptr);
      ASSERT_GT(p, 1e5) << r.output;
      const double n = world;
      const double formula = stage == 0   ? 16 * p
                             : stage == 1 ? 8 * p + 8 * p / n
                             : stage == 2 ? 4 * p + 12 * p / n
                                          : 16 * p / n;
      const double measured = json_number(r.output, "mem_at_rest_bytes");
      const double in_flight = json_number(r.output, "mem_in_flight_bytes");
      ASSERT_GT(measured, 0) << r.output;
      ASSERT_GE(in_flight, 0) << r.output;
      if (stage < 2) {
        EXPECT_EQ(in_flight, 0);
      }
      std::printf(
          "world %d ZeRO-%d: P = %.0f, measured %.0f B = %.3f x formula %.0f B + in flight "
          "%.0f B\n",
          world, stage, p, measured, (measured - in_flight) / formula, formula, in_flight);
      EXPECT_LE(std::fabs(measured - in_flight - formula), 0.05 * formula + 96 * 1024)
          << "measured " << measured << " B, in flight " << in_flight << " B, formula " << formula
          << " B";
    }
  }
}

TEST_F(ZeroRun, BadParallelSettingsAreOneLineAndStatus2) {
  CommandResult four = run_command(kMeshtrainBin + " " + train_args(dir_, 1, 0, zero(4, 1)));
  EXPECT_EQ(four.status, 2) << four.output;
  EXPECT_NE(four.output.find("parallel.zero_stage must be in [0, 3] (0 = DDP), got 4"),
            std::string::npos)
      << four.output;
  CommandResult hook = run_command(
      kMeshtrainBin + " " + train_args(dir_, 1, 0, zero(2, 1) + " --set dist.comm_hook=powersgd"));
  EXPECT_EQ(hook.status, 2) << hook.output;
  EXPECT_NE(hook.output.find("parallel.zero_stage = 2 and dist.comm_hook = \"powersgd\" cannot "
                             "be combined"),
            std::string::npos)
      << hook.output;
  CommandResult three_d = run_command(
      kMeshtrainBin + " " + train_args(dir_, 1, 0, "--set parallel.tp=2 --set parallel.pp=2"));
  EXPECT_EQ(three_d.status, 2) << three_d.output;
  // The 3D mesh trains (pipeline_tp_test.cpp); one process cannot hold pp x tp = 4 ranks.
  EXPECT_NE(three_d.output.find("parallel.pp x parallel.tp = 4 does not divide the 1 ranks"),
            std::string::npos)
      << three_d.output;
}

}  // namespace
