// Rolling back to the last checkpoint after a run of non-finite steps: the policy on its own,
// then end to end with the built programs and the NaN fault hook (MESHTRAIN_TEST_NAN_STEPS).
// A transient fault (NaN losses at steps 7..9, once) with rollback_after = 3 and a checkpoint
// every 5 steps must send the run back to step 5 and end with exactly the parameters of a run
// that never saw the fault, on one process and on two ranks; a fault that comes back every time
// must end the run with one line once train.max_rollbacks are used up. By default the batches of
// the bad steps are then skipped (and train.rollback_lr_factor lowers the learning rate).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/runtime/rollback.h"
#include "meshtrain/util/error.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;
using runtime::RollbackPolicy;

TEST(RollbackPolicy, RollsBackAfterConsecutiveBadStepsOnly) {
  RollbackPolicy p(3, 2);
  EXPECT_FALSE(p.on_step(1, true));
  EXPECT_FALSE(p.on_step(2, true));
  EXPECT_FALSE(p.on_step(3, false));  // a good step ends the run of bad ones
  EXPECT_FALSE(p.on_step(4, true));
  EXPECT_FALSE(p.on_step(5, true));
  EXPECT_TRUE(p.on_step(6, true));
  EXPECT_EQ(p.first_bad_step(), 4);
  EXPECT_EQ(p.bad_steps(), 3);
  p.rolled_back();
  EXPECT_EQ(p.rollbacks(), 1);
  EXPECT_FALSE(p.on_step(4, true));
}

TEST(RollbackPolicy, StopsWithAnErrorOnceTheRollbacksAreUsedUp) {
  RollbackPolicy p(2, 1);
  p.on_step(7, true);
  ASSERT_TRUE(p.on_step(8, true));
  p.rolled_back();
  p.on_step(7, true);
  try {
    p.on_step(8, true);
    FAIL() << "a second rollback was allowed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("steps 7..8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.max_rollbacks = 1"), std::string::npos) << msg;
  }
}

TEST(RollbackPolicy, ZeroNeverRollsBack) {
  RollbackPolicy p(0, 3);
  for (int64_t step = 1; step <= 10; ++step) EXPECT_FALSE(p.on_step(step, true));
}

class Rollback : public TrainRunTest {
 protected:
  static std::string final_model(const fs::path& out) {
    return file_bytes(out / "checkpoints" / "step_20" / "model_rank00000.safetensors");
  }
};

// The rollback itself must reproduce the unfaulted run: the batches are not skipped here.
constexpr const char* kRollbackArgs =
    "--set train.rollback_after=3 --set train.rollback_skip_data=false";
constexpr const char* kRolledBack =
    "rolled back to the checkpoint of step 5 after 3 consecutive non-finite steps (7..9); "
    "rollback 1 of 3";

TEST_F(Rollback, TransientNaNsRollBackToTheLastCheckpointAndTheRunMatchesAnUnfaultedOne) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  CommandResult faulted = run_command("MESHTRAIN_TEST_NAN_STEPS=7-9 " + kMeshtrainBin + " " +
                                      train_args(a, 20, 5, kRollbackArgs));
  ASSERT_EQ(faulted.status, 0) << faulted.output;
  EXPECT_NE(faulted.output.find("(skipped: non-finite)"), std::string::npos) << faulted.output;
  EXPECT_NE(faulted.output.find(kRolledBack), std::string::npos) << faulted.output;

  CommandResult straight = run_command(kMeshtrainBin + " " + train_args(b, 20, 5, kRollbackArgs));
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_EQ(straight.output.find("rolled back"), std::string::npos) << straight.output;
  const std::string resumed = final_model(a);
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == final_model(b))
      << "the rolled-back run's final parameters differ from an unfaulted run's";
}

// The NaN comes from the last rank only; the mean loss carries it to every rank, so both ranks
// roll back at the same step and stay in step with each other.
TEST_F(Rollback, BothRanksRollBackTogetherAndMatchAnUnfaultedRun) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string meshrun = kMeshrunBin + " --nproc-per-node 2 -- " + kMeshtrainBin + " ";
  CommandResult faulted =
      run_command("MESHTRAIN_TEST_NAN_STEPS=7-9 " + meshrun + train_args(a, 20, 5, kRollbackArgs));
  ASSERT_EQ(faulted.status, 0) << faulted.output;
  EXPECT_NE(faulted.output.find(kRolledBack), std::string::npos) << faulted.output;

  CommandResult straight = run_command(meshrun + train_args(b, 20, 5, kRollbackArgs));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const std::string resumed = final_model(a);
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == final_model(b))
      << "the rolled-back job's final parameters differ from an unfaulted job's";
}

TEST_F(Rollback, AFaultThatComesBackEndsTheRunAfterMaxRollbacks) {
  const fs::path a = dir_ / "a";
  CommandResult r = run_command("MESHTRAIN_TEST_NAN_STEPS=7-20,always " + kMeshtrainBin + " " +
                                train_args(a, 20, 5,
                                           "--set train.rollback_after=2 "
                                           "--set train.max_rollbacks=2"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rollback 2 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("meshtrain: error: steps 7..8: 2 consecutive non-finite losses or "
                          "gradient norms after 2 rollbacks (train.max_rollbacks = 2); stopping"),
            std::string::npos)
      << r.output;
}

// By default the batches of the bad steps are not trained on again: after rolling back to step
// 5, step 7 skips the three batches of steps 7..9 and the run finishes on new data; with
// train.rollback_lr_factor the learning rate is halved from the rollback on.
TEST_F(Rollback, TheBatchesBeforeARollbackAreSkippedAndTheLearningRateLowered) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string args = "--set train.rollback_after=3 --set train.rollback_lr_factor=0.5";
  CommandResult faulted = run_command("MESHTRAIN_TEST_NAN_STEPS=7-9 " + kMeshtrainBin + " " +
                                      train_args(a, 20, 5, args));
  ASSERT_EQ(faulted.status, 0) << faulted.output;
  EXPECT_NE(faulted.output.find(kRolledBack), std::string::npos) << faulted.output;
  EXPECT_NE(faulted.output.find("skipped the 3 batches of steps 7..9 that preceded the rollback "
                                "(data position epoch "),
            std::string::npos)
      << faulted.output;
  // The last record of each step: before the rollback lr, after it half of it.
  std::map<int64_t, double> lr;
  std::ifstream in(a / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("lr")) lr[j["step"].get<int64_t>()] = j["lr"].get<double>();
  }
  ASSERT_TRUE(lr.count(5) && lr.count(12)) << faulted.output;
  EXPECT_NEAR(lr[12], 0.5 * lr[5], 1e-9 * lr[5]);

  CommandResult straight = run_command(kMeshtrainBin + " " + train_args(b, 20, 5, args));
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_FALSE(final_model(a) == final_model(b))
      << "skipping three batches and halving the learning rate left the model unchanged";
}

TEST_F(Rollback, RollbackWithoutCheckpointsIsAConfigError) {
  CommandResult r = run_command(kMeshtrainBin + " " +
                                train_args(dir_ / "a", 20, 0, "--set train.rollback_after=3"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("train.rollback_after needs checkpoints"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace meshtrain::testing
