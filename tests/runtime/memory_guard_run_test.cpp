// The memory guard in real runs under pipeline and tensor parallelism: a limit that a rank of the
// layout fits (its stage, its shards) but a rank holding the whole model does not. The pipeline
// and the tensor-parallel run train; the same model as plain data parallelism, and the pipeline
// under a limit below its own estimate, stop before building the model with the guard's line.
#include <gtest/gtest.h>

#include <string>

#include "meshtrain/plan/memory_model.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/runtime/memory_guard.h"
#include "tests/runtime/train_run_fixture.h"

namespace {

using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class MemoryGuardRun : public meshtrain::testing::TrainRunTest {};

// 4 blocks of width 256 (about 3.2M parameters): big enough that the blocks dominate.
constexpr const char* kModel =
    " --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4 --set "
    "train.grad_accum_steps=2";

// The guard's estimate for 2 ranks of this model under `pp` x `tp` (as the trainer computes it).
int64_t estimate(int64_t pp, int64_t tp) {
  meshtrain::runtime::TrainConfig c = meshtrain::runtime::load_config(
      "", {"model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.block_size=32",
           "data.batch_size=4", "train.grad_accum_steps=2", "parallel.pp=" + std::to_string(pp),
           "parallel.tp=" + std::to_string(tp)});
  return meshtrain::plan::estimate_memory(
             meshtrain::runtime::memory_input(meshtrain::runtime::resolve_config(c), 2))
      .total();
}

std::string mib(int64_t bytes) {
  return std::to_string(bytes / 1048576) + "MiB";
}

TEST_F(MemoryGuardRun, PipelineAndTensorParallelRunsThatFitOnlyByTheirLayoutTrain) {
  const int64_t whole = estimate(1, 1), pp = estimate(2, 1), tp = estimate(1, 2);
  ASSERT_LT(pp, whole * 7 / 10);
  ASSERT_LT(tp, whole * 7 / 10);
  const std::string between = mib((std::max(pp, tp) + whole) / 2);
  const std::string launch =
      kMeshrunBin + " --nproc-per-node 2 --grace-period 5 -- " + kMeshtrainBin + " ";
  const std::string limit = " --set train.max_memory=" + between;

  CommandResult r = run_command(
      launch + train_args(dir_ / "pp", 2, 0, kModel + limit + " --set parallel.pp=2") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline 1f1b over 2 stages"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;

  r = run_command(launch + train_args(dir_ / "tp", 2, 0, kModel + limit + " --set parallel.tp=2") +
                  " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tensor parallelism over 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;

  // Every rank holding the whole model does not fit the same limit.
  r = run_command(launch + train_args(dir_ / "dp", 2, 0, kModel + limit) + " 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("memory guard: this run needs about"), std::string::npos) << r.output;

  // Nor does the pipeline fit half its own estimate: refused with the guard's line naming it.
  r = run_command(launch +
                  train_args(dir_ / "pp_small", 2, 0,
                             kModel + std::string(" --set train.max_memory=") + mib(pp / 2) +
                                 " --set parallel.pp=2") +
                  " 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("memory guard: this run needs about"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(dp1 tp1 pp2 z0 B4x2 1f1b) on 2 ranks"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("signal"), std::string::npos) << r.output;
}

}  // namespace
