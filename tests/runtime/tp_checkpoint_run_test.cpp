// Checkpoints of tensor-parallel runs end to end, with the built meshtrain and meshrun programs
// on a tiny model: a tp = 2 run resumes at tp = 1 and back at tp = 2, a dp 2 x tp 2 run (with
// sequence parallelism) resumes as plain data parallelism (4 ranks), as ZeRO-1 and ZeRO-3 (2
// ranks) and at tp = 2 with one replica, and the ZeRO-3 checkpoint at dp 2 x tp 2 again, each
// continuing the losses of an uninterrupted run; a killed tp rank
// resumes through meshrun --max-restarts to the weights of a run that never stopped; the export
// of a tp checkpoint is the whole model, byte for byte; a damaged or unfitting checkpoint is
// one clear line and a non-zero exit that leaves the checkpoints as they were.
//
// Tolerances: a layout that computes the step the same way (the same tp degree) continues with
// the same bits. Across tp degrees the checkpoint still carries the exact state (the tests of
// tests/parallel/tp_checkpoint_test.cpp and tests/ckpt/tensor_part_test.cpp prove it bit for
// bit), but the ranks of tp = 2 add the partial products of the split matrices in another order
// than one rank does, so those steps agree within the 1e-5 relative of TensorParallelRun.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class TpCheckpointRun : public meshtrain::testing::TrainRunTest {
 protected:
  // A global batch of 4 sequences: micro-batches of 1 x accumulation x dp replicas.
  static std::string layout(int tp, int accum, const std::string& extra = "") {
    return "--set data.batch_size=1 --set train.grad_accum_steps=" + std::to_string(accum) +
           " --set parallel.tp=" + std::to_string(tp) + " --set model.dropout=0.1 " + extra;
  }

  // Losses of `got` against `want` over steps [from, to]: the same bits, or within `rel`.
  static void expect_losses(const fs::path& got_dir, const fs::path& want_dir, int64_t from,
                            int64_t to, double rel) {
    const auto got = losses(got_dir), want = losses(want_dir);
    for (int64_t step = from; step <= to; ++step) {
      ASSERT_TRUE(got.count(step) && want.count(step)) << "step " << step;
      if (rel == 0)
        EXPECT_EQ(got.at(step), want.at(step)) << "step " << step;
      else
        EXPECT_NEAR(got.at(step), want.at(step), rel * std::fabs(want.at(step))) << "step " << step;
    }
  }
};

TEST_F(TpCheckpointRun, MovesBetweenTensorParallelAndOneRank) {
  const fs::path a = dir_ / "a", same = dir_ / "same", straight = dir_ / "straight";
  // tp = 2 for 8 steps, saving every 4.
  CommandResult first = run_command(meshrun(2) + train_args(a, 8, 4, layout(2, 4)));
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_TRUE(fs::exists(a / "checkpoints" / "step_8" / "model_rank00001.safetensors"))
      << first.output;
  fs::copy(a, same, fs::copy_options::recursive);
  // tp = 1 (one process) continues to 12, then tp = 2 again to 16.
  CommandResult one = run_command(kMeshtrainBin + " " + train_args(a, 12, 4, layout(1, 4)));
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_NE(one.output.find("(step 8 of 12)"), std::string::npos) << one.output;
  CommandResult back = run_command(meshrun(2) + train_args(a, 16, 4, layout(2, 4)));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_NE(back.output.find("(step 12 of 16)"), std::string::npos) << back.output;
  // The same layout resumes from step 8 with the same arithmetic.
  CommandResult again = run_command(meshrun(2) + train_args(same, 16, 4, layout(2, 4)));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("(step 8 of 16)"), std::string::npos) << again.output;

  CommandResult ref = run_command(meshrun(2) + train_args(straight, 16, 0, layout(2, 4)));
  ASSERT_EQ(ref.status, 0) << ref.output;
  expect_losses(same, straight, 1, 16, 0);
  std::string why;
  EXPECT_TRUE(same_tensors(same / "model.safetensors", straight / "model.safetensors", &why))
      << why;
  expect_losses(a, straight, 1, 8, 0);
  expect_losses(a, straight, 9, 16, 1e-5);
}

TEST_F(TpCheckpointRun, DataAndTensorParallelMovesToDataParallelAndZeroAndBack) {
  const fs::path a = dir_ / "a", zero3 = dir_ / "zero3", zero1 = dir_ / "zero1", tp = dir_ / "tp",
                 straight = dir_ / "straight";
  // dp 2 x tp 2 with sequence parallelism for 8 steps, saving every 4.
  const std::string sp = "--set parallel.sequence_parallel=true";
  CommandResult first = run_command(meshrun(4) + train_args(a, 8, 4, layout(2, 2, sp)));
  ASSERT_EQ(first.status, 0) << first.output;
  for (const fs::path& copy : {zero3, zero1, tp}) fs::copy(a, copy, fs::copy_options::recursive);
  // Plain data parallelism over the same 4 ranks (dp 4, no accumulation).
  CommandResult ddp = run_command(meshrun(4) + train_args(a, 12, 4, layout(1, 1)));
  ASSERT_EQ(ddp.status, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("(step 8 of 12)"), std::string::npos) << ddp.output;
  // ZeRO-1 over 2 ranks (accumulation 2).
  CommandResult z1 = run_command(
      meshrun(2) + train_args(zero1, 12, 4, layout(1, 2, "--set parallel.zero_stage=1")));
  ASSERT_EQ(z1.status, 0) << z1.output;
  EXPECT_NE(z1.output.find("(step 8 of 12)"), std::string::npos) << z1.output;
  // tp = 2 with another dp (1 replica, accumulation 4), without sequence parallelism.
  CommandResult other_dp = run_command(meshrun(2) + train_args(tp, 12, 4, layout(2, 4)));
  ASSERT_EQ(other_dp.status, 0) << other_dp.output;
  EXPECT_NE(other_dp.output.find("(step 8 of 12)"), std::string::npos) << other_dp.output;
  // The batch follows the data-parallel replicas (2 -> 1), not the world size (4 -> 2).
  EXPECT_NE(other_dp.output.find("data-parallel size 2 -> 1: keeping the global batch of 4 "
                                 "sequences with gradient accumulation 4"),
            std::string::npos)
      << other_dp.output;
  EXPECT_EQ(other_dp.output.find("world size"), std::string::npos) << other_dp.output;
  // ZeRO-3 over 2 ranks, then dp 2 x tp 2 again from its checkpoint.
  CommandResult z3 = run_command(
      meshrun(2) + train_args(zero3, 12, 4, layout(1, 2, "--set parallel.zero_stage=3")));
  ASSERT_EQ(z3.status, 0) << z3.output;
  EXPECT_NE(z3.output.find("(step 8 of 12)"), std::string::npos) << z3.output;
  CommandResult back = run_command(meshrun(4) + train_args(zero3, 16, 4, layout(2, 2, sp)));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_NE(back.output.find("(step 12 of 16)"), std::string::npos) << back.output;

  CommandResult ref = run_command(meshrun(4) + train_args(straight, 16, 0, layout(2, 2, sp)));
  ASSERT_EQ(ref.status, 0) << ref.output;
  for (const fs::path& run : {a, zero1, tp, zero3}) {
    SCOPED_TRACE(run.filename().string());
    expect_losses(run, straight, 1, 8, 0);
    expect_losses(run, straight, 9, 12, 1e-5);
  }
  expect_losses(zero3, straight, 13, 16, 1e-5);
}

// Rank 1 (the second tp rank) is killed (SIGKILL) inside the save of step 10; meshrun restarts
// the job, which resumes from step 5 and ends with the weights of an uninterrupted run, bit for
// bit.
TEST_F(TpCheckpointRun, KilledTensorParallelRankResumesThroughMeshrunRestarts) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string tp = "--set parallel.tp=2 --set model.dropout=0.1";
  kill_rank1_mid_save_and_resume(
      a, "env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " + kMeshrunBin +
             " --nproc-per-node 2 --grace-period 5 --max-restarts 1 -- " + kMeshtrainBin + " " +
             train_args(a, 20, 5, tp));
  if (HasFatalFailure()) return;
  CommandResult straight = run_command(meshrun(2) + train_args(b, 20, 0, tp));
  ASSERT_EQ(straight.status, 0) << straight.output;
  std::string why;
  EXPECT_TRUE(same_tensors(a / "model.safetensors", b / "model.safetensors", &why)) << why;
  expect_losses(a, b, 1, 20, 0);
}

// The export of a tp checkpoint is the plain model's file: the whole tensors the run itself
// gathered into model.safetensors at that step, byte for byte, under the names and shapes of
// a one-rank run's export.
TEST_F(TpCheckpointRun, ExportIsThePlainModel) {
  const fs::path a = dir_ / "a", one = dir_ / "one";
  CommandResult r = run_command(meshrun(2) + train_args(a, 4, 4, layout(2, 4)));
  ASSERT_EQ(r.status, 0) << r.output;
  CommandResult p = run_command(kMeshtrainBin + " " + train_args(one, 4, 4, layout(1, 4)));
  ASSERT_EQ(p.status, 0) << p.output;
  const fs::path tp_out = dir_ / "tp.safetensors", one_out = dir_ / "one.safetensors";
  CommandResult e = run_command(kMeshtrainBin + " ckpt export " + (a / "checkpoints").string() +
                                " --out " + tp_out.string());
  ASSERT_EQ(e.status, 0) << e.output;
  CommandResult e1 = run_command(kMeshtrainBin + " ckpt export " + (one / "checkpoints").string() +
                                 " --out " + one_out.string());
  ASSERT_EQ(e1.status, 0) << e1.output;
  std::string why;
  EXPECT_TRUE(same_tensors(tp_out, a / "model.safetensors", &why)) << why;
  const auto x = meshtrain::ckpt::load_safetensors(tp_out.string());
  const auto y = meshtrain::ckpt::load_safetensors(one_out.string());
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (size_t i = 0; i < y.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].first, y.tensors[i].first);
    EXPECT_EQ(x.tensors[i].second.shape(), y.tensors[i].second.shape()) << y.tensors[i].first;
  }
}

// PyTorch reads the export (through the pure-Python safetensors reader of tests/python): the
// unpadded vocabulary and the tensors of the run's own weights file, equal.
TEST_F(TpCheckpointRun, ExportLoadsInPyTorch) {
  constexpr const char* kPython = "/usr/bin/python3";
  MT_SKIP_UNLESS(
      "torch",
      fs::exists(kPython) &&
          std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0,
      kPython << " has no torch (install python3-torch)");
  const fs::path a = dir_ / "a";
  CommandResult r = run_command(meshrun(2) + train_args(a, 4, 4, layout(2, 4)));
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path out = dir_ / "tp.safetensors";
  ASSERT_EQ(run_command(kMeshtrainBin + " ckpt export " + (a / "checkpoints").string() + " --out " +
                        out.string())
                .status,
            0);
  const fs::path script = dir_ / "check.py";
  std::ofstream(script) << R"PY(import sys
sys.path.insert(0, sys.argv[1])
import torch
import st
exported, meta = st.load(sys.argv[2])
gathered, _ = st.load(sys.argv[3])
assert sorted(exported) == sorted(gathered), (sorted(exported), sorted(gathered))
for name, t in gathered.items():
    assert torch.equal(exported[name], t), name
assert exported["wte.weight"].shape[1] == 32, exported["wte.weight"].shape
assert meta["meshtrain_step"] == "4", meta
print("torch ok")
)PY";
  const std::string cmd = std::string(kPython) + " " + script.string() + " " +
                          MESHTRAIN_SOURCE_DIR + "/tests/python " + out.string() + " " +
                          (a / "model.safetensors").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(TpCheckpointRun, DamagedOrUnfittingCheckpointIsOneLineAndChangesNothing) {
  const fs::path a = dir_ / "a";
  CommandResult first = run_command(meshrun(2) + train_args(a, 4, 4, layout(2, 4)));
  ASSERT_EQ(first.status, 0) << first.output;
  const fs::path step = a / "checkpoints" / "step_4";
  const std::string before = file_bytes(step / "manifest.json");

  // Another model width: no tensor fits.
  CommandResult wide =
      run_command(meshrun(2) + train_args(a, 8, 4, layout(2, 4, "--set model.n_embd=64")));
  EXPECT_NE(wide.status, 0) << wide.output;
  EXPECT_NE(wide.output.find("cannot be resharded into this model"), std::string::npos)
      << wide.output;
  EXPECT_FALSE(fs::exists(a / "checkpoints" / "step_8"));

  // A damaged shard, named explicitly: not loaded, the file named.
  std::string bytes = file_bytes(step / "model_rank00001.safetensors");
  bytes[bytes.size() - 3] ^= 0x01;
  {
    std::ofstream out(step / "model_rank00001.safetensors", std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  CommandResult bad = run_command(
      meshrun(2) + train_args(a, 8, 4, layout(2, 4, "--set ckpt.resume_from=" + step.string())));
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("model_rank00001.safetensors"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(a / "checkpoints" / "step_8"));
  EXPECT_EQ(file_bytes(step / "manifest.json"), before);
}

}  // namespace
