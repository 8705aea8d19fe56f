// The trainer's asynchronous checkpoints, end to end with the built program: a save returns
// before the parameters and the optimizer state are copied, and training goes on at once, so
// the checkpoint must still hold the state of its own step. The copy is held back with the
// writer's test hook MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS, so that a trainer that updated its
// parameters without waiting for the copy would save the next step's values every time.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class AsyncCheckpoint : public TrainRunTest {};

TEST_F(AsyncCheckpoint, TheCheckpointHoldsItsStepAlthoughTrainingWentOnDuringTheCopy) {
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  // Reference: training ends at step 3, so nothing can change the state while step 3 is copied.
  CommandResult r = run_command(kMeshtrainBin + " " + train_args(ref, 3, 3));
  ASSERT_EQ(r.status, 0) << r.output;
  // The same first three steps, then three more started while step 3's copy is held back.
  r = run_command("MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS=400 " + kMeshtrainBin + " " +
                  train_args(run, 6, 3));
  ASSERT_EQ(r.status, 0) << r.output;

  const ckpt::Checkpoint want = ckpt::Checkpoint::open((ref / "checkpoints" / "step_3").string());
  const ckpt::Checkpoint got = ckpt::Checkpoint::open((run / "checkpoints" / "step_3").string());
  ASSERT_EQ(got.manifest().tensors.size(), want.manifest().tensors.size());
  ASSERT_FALSE(want.manifest().tensors.empty());
  for (const ckpt::TensorRecord& t : want.manifest().tensors) {
    const Tensor a = want.load_global_tensor(t.name), b = got.load_global_tensor(t.name);
    ASSERT_EQ(a.shape(), b.shape()) << t.name;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0)
        << t.name << " differs from the state of step 3";
  }
  EXPECT_EQ(got.train_state().at("optimizer"), want.train_state().at("optimizer"));
  EXPECT_EQ(got.train_state().at("sampler"), want.train_state().at("sampler"));
  // The run trained on past the save: its step-6 checkpoint differs from step 3.
  const ckpt::Checkpoint last = ckpt::Checkpoint::open((run / "checkpoints" / "step_6").string());
  int changed = 0;
  for (const ckpt::TensorRecord& t : want.manifest().tensors) {
    const Tensor a = want.load_global_tensor(t.name), c = last.load_global_tensor(t.name);
    if (std::memcmp(a.data_ptr(), c.data_ptr(), a.nbytes()) != 0) ++changed;
  }
  EXPECT_GT(changed, 0);
}

}  // namespace
}  // namespace meshtrain::testing
