// Checkpoints, preemption and restarts end to end, with the built meshtrain and meshrun programs
// on a tiny model: resuming continues the exact loss trajectory, a corrupt newest checkpoint
// falls back to the previous one, SIGTERM stops at a step boundary with a checkpoint, and
// meshrun --max-restarts brings a crashed job back to completion.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "meshtrain/cuda/availability.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kMeshtrain = kBin + "/meshtrain";
const std::string kMeshrun = kBin + "/meshrun";

using meshtrain::testing::ChildProcess;
using meshtrain::testing::children_of;
using Result = meshtrain::testing::CommandResult;
Result run(const std::string& cmd) {
  return meshtrain::testing::run_command(cmd);
}

class FaultTolerance : public meshtrain::testing::TrainRunTest {
 protected:
  static std::vector<int64_t> checkpoint_steps(const fs::path& out) {
    std::vector<int64_t> steps;
    const fs::path root = out / "checkpoints";
    if (!fs::exists(root)) return steps;
    static const std::regex kName("step_([0-9]+)");
    for (const auto& e : fs::directory_iterator(root)) {
      std::smatch m;
      const std::string name = e.path().filename().string();
      if (e.is_directory() && std::regex_match(name, m, kName)) steps.push_back(std::stoll(m[1]));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }
};

TEST_F(FaultTolerance, ResumedRunContinuesTheUninterruptedTrajectory) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  Result first = run(kMeshtrain + " " + train_args(a, 20, 10));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(first.output.find("resumed from"), std::string::npos) << first.output;
  EXPECT_EQ(checkpoint_steps(a), (std::vector<int64_t>{10, 20}));

  Result second = run(kMeshtrain + " " + train_args(a, 30, 10));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from " + (a / "checkpoints" / "step_20").string() +
                               " (step 20 of 30)"),
            std::string::npos)
      << second.output;

  Result straight = run(kMeshtrain + " " + train_args(b, 30, 0));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 30u);
  ASSERT_EQ(resumed.size(), 30u);
  for (int64_t step = 1; step <= 30; ++step)
    EXPECT_NEAR(resumed.at(step), reference.at(step), 1e-6f) << "step " << step;
}

TEST_F(FaultTolerance, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  const fs::path a = dir_ / "a";
  Result first = run(kMeshtrain + " " + train_args(a, 20, 10));
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(checkpoint_steps(a), (std::vector<int64_t>{10, 20}));
  // Flip one byte in the middle of the largest file of the newest checkpoint.
  fs::path victim;
  for (const auto& e : fs::directory_iterator(a / "checkpoints" / "step_20"))
    if (e.is_regular_file() && (victim.empty() || e.file_size() > fs::file_size(victim)))
      victim = e.path();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    const auto pos = static_cast<std::streamoff>(fs::file_size(victim) / 2);
    f.seekg(pos);
    char c = 0;
    f.get(c);
    f.seekp(pos);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  Result second = run(kMeshtrain + " " + train_args(a, 25, 10));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("checkpoint rejected"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find(victim.filename().string()), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("(step 10 of 25)"), std::string::npos) << second.output;
}

TEST_F(FaultTolerance, SigtermStopsAtAStepWithACheckpointAndTheRerunResumes) {
  const fs::path a = dir_ / "a";
  const std::string log = (dir_ / "run.log").string();
  // A run far too long to finish: it is killed with the test if the SIGTERM does not stop it.
  ChildProcess trainer = spawn(kMeshtrain + " " + train_args(a, 1000000, 100000), log);
  ASSERT_TRUE(trainer.started());
  // Wait for a few steps, then preempt.
  ASSERT_TRUE(wait_until([&] { return losses(a).size() >= 3; }, 60s)) << file_bytes(log);
  trainer.signal(SIGTERM);
  const std::optional<int> status = trainer.wait_for(60s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "still training 60 s after SIGTERM\n" << output;
  ASSERT_TRUE(WIFEXITED(*status)) << output;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("preempted by SIGTERM at step ([0-9]+)")))
      << output;
  const int64_t stopped = std::stoll(m[1]);
  EXPECT_EQ(losses(a).rbegin()->first, stopped);
  EXPECT_EQ(checkpoint_steps(a), (std::vector<int64_t>{stopped}));

  Result again = run(kMeshtrain + " " + train_args(a, stopped + 2, 100000));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("(step " + std::to_string(stopped) + " of " +
                              std::to_string(stopped + 2) + ")"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(losses(a).rbegin()->first, stopped + 2);
}

// With checkpoints off, every line about the stop says that nothing was saved.
TEST_F(FaultTolerance, SigtermWithCheckpointsOffSaysNothingWasSaved) {
  const fs::path a = dir_ / "a";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess trainer = spawn(kMeshtrain + " " + train_args(a, 1000000, 0), log);
  ASSERT_TRUE(trainer.started());
  ASSERT_TRUE(wait_until([&] { return losses(a).size() >= 2; }, 60s)) << file_bytes(log);
  trainer.signal(SIGTERM);
  const std::optional<int> status = trainer.wait_for(60s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "still training 60 s after SIGTERM\n" << output;
  EXPECT_NE(output.find("checkpoints are off (ckpt.interval = 0), nothing saved"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("on a signal; checkpoints are off (ckpt.interval = 0), so the next run "
                        "starts over"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("checkpoint is saved"), std::string::npos) << output;
  EXPECT_TRUE(checkpoint_steps(a).empty());
}

// A checkpoint already at or past train.steps: one line, exit 0, and every file as it was.
TEST_F(FaultTolerance, StepsBelowTheCheckpointChangeNothing) {
  const fs::path a = dir_ / "a";
  Result first = run(kMeshtrain + " " + train_args(a, 10, 5));
  ASSERT_EQ(first.status, 0) << first.output;
  std::map<std::string, std::string> before;
  for (const auto& e : fs::recursive_directory_iterator(a))
    if (e.is_regular_file()) before[e.path().string()] = file_bytes(e.path());
  ASSERT_GT(before.size(), 3u);

  Result again = run(kMeshtrain + " " + train_args(a, 5, 5));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("nothing to do: the checkpoint resumed is at step 10 and "
                              "train.steps = 5; raise train.steps to train further"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step 11"), std::string::npos) << again.output;
  std::map<std::string, std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(a))
    if (e.is_regular_file()) after[e.path().string()] = file_bytes(e.path());
  EXPECT_TRUE(after == before) << "files were added, removed or changed:\n" << again.output;
  EXPECT_EQ(checkpoint_steps(a), (std::vector<int64_t>{5, 10}));
}

// NCCL on a machine without a GPU is a configuration error: one line per rank naming the key and
// the way out (no source path), exit status 2, and meshrun does not restart it.
TEST_F(FaultTolerance, NcclWithoutAGpuIsAConfigErrorAndNotRestarted) {
  if (meshtrain::cuda::device_count() > 0)
    GTEST_SKIP() << "checks the refusal on a machine without a GPU; this one has one";
  Result r = run(kMeshrun + " --nproc-per-node 2 --max-restarts 2 --grace-period 5 -- " +
                 kMeshtrain + " " + train_args(dir_ / "a", 4, 0, "--set dist.backend=nccl"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("config: dist.backend = \"nccl\" needs a CUDA device on every rank"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting: a worker exited with status 2"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restart 1 of 2"), std::string::npos) << r.output;
}

// Resuming with another model shape names the checkpoint and the keys that changed.
TEST_F(FaultTolerance, ResumingAnotherModelNamesTheCheckpointAndTheChangedKeys) {
  const fs::path a = dir_ / "a";
  Result first = run(kMeshtrain + " " + train_args(a, 10, 5));
  ASSERT_EQ(first.status, 0) << first.output;
  Result again = run(kMeshtrain + " " + train_args(a, 20, 5, "--set model.n_embd=64"));
  EXPECT_EQ(again.status, 2) << again.output;
  EXPECT_NE(again.output.find("cannot resume from " + (a / "checkpoints" / "step_10").string() +
                              " (step 10): "),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("the checkpoint was written with model.n_embd = 32 (now 64): change "
                              "them back, or use a new train.out_dir"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(checkpoint_steps(a), (std::vector<int64_t>{5, 10})) << "nothing written";
}

TEST_F(FaultTolerance, SigtermToOneRankStopsEveryRankAtTheSameStep) {
  const fs::path a = dir_ / "a";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess job = spawn(
      kMeshrun + " --nproc-per-node 2 -- " + kMeshtrain + " " + train_args(a, 1000000, 100000),
      log);
  ASSERT_TRUE(job.started());
  ASSERT_TRUE(wait_until([&] { return losses(a).size() >= 3; }, 60s)) << file_bytes(log);
  const std::vector<pid_t> workers = children_of(job.pid());
  ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
  ::kill(workers[1], SIGTERM);  // rank 1 only
  const std::optional<int> status = job.wait_for(60s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "still training 60 s after SIGTERM to rank 1\n" << output;
  // Both workers finish cleanly, so the job counts as a success.
  ASSERT_TRUE(WIFEXITED(*status)) << output;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      output, m, std::regex("preempted by a signal to another rank at step ([0-9]+)")))
      << output;
  const int64_t stopped = std::stoll(m[1]);
  EXPECT_EQ(losses(a).rbegin()->first, stopped);
  EXPECT_EQ(checkpoint_steps(a), (std::vector<int64_t>{stopped}));
}

TEST_F(FaultTolerance, MeshrunRestartsACrashedWorkerAndTheJobCompletes) {
  const fs::path a = dir_ / "a";
  Result r = run("MESHTRAIN_TEST_CRASH_AT_STEP=8 " + kMeshrun +
                 " --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- " + kMeshtrain + " " +
                 train_args(a, 12, 5));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("simulated crash of rank 1 at step 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(step 5 of 12)"), std::string::npos) << r.output;
  EXPECT_EQ(losses(a).rbegin()->first, 12);
  EXPECT_EQ(checkpoint_steps(a).back(), 12);

  // The restarted job continues exactly where an uninterrupted two-rank job would be.
  const fs::path b = dir_ / "b";
  Result straight =
      run(kMeshrun + " --nproc-per-node 2 -- " + kMeshtrain + " " + train_args(b, 12, 0));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 12u);
  for (int64_t step = 1; step <= 12; ++step)
    EXPECT_NEAR(resumed.at(step), reference.at(step), 1e-6f) << "step " << step;
}

TEST_F(FaultTolerance, MeshrunWithoutRestartsReportsTheCrash) {
  const fs::path a = dir_ / "a";
  Result r =
      run("MESHTRAIN_TEST_CRASH_AT_STEP=3 " + kMeshrun +
          " --nproc-per-node 2 --grace-period 2 -- " + kMeshtrain + " " + train_args(a, 6, 5));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("simulated crash of rank 1 at step 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// Top-k compression keeps per-rank error feedback; a restart must bring it back too, or the
// trajectory after the restart would differ from the uninterrupted one.
TEST_F(FaultTolerance, CommHookStateSurvivesARestart) {
  const std::string hook = "--set dist.comm_hook=topk:0.1";
  const fs::path a = dir_ / "a", b = dir_ / "b";
  Result r = run("MESHTRAIN_TEST_CRASH_AT_STEP=8 " + kMeshrun +
                 " --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- " + kMeshtrain + " " +
                 train_args(a, 12, 5, hook));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("(step 5 of 12)"), std::string::npos) << r.output;
  Result straight =
      run(kMeshrun + " --nproc-per-node 2 -- " + kMeshtrain + " " + train_args(b, 12, 0, hook));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto resumed = losses(a), reference = losses(b);
  ASSERT_EQ(reference.size(), 12u);
  for (int64_t step = 1; step <= 12; ++step)
    EXPECT_NEAR(resumed.at(step), reference.at(step), 1e-6f) << "step " << step;
}

}  // namespace

namespace {

// The fault the restart policy exists for: a rank killed outright in the middle of training.
// The job must finish with exactly the parameters of an uninterrupted run.
TEST_F(FaultTolerance, KilledRankIsRestartedAndTheFinalParametersAreBitwiseIdentical) {
  const int64_t steps = 600;
  const fs::path a = dir_ / "a", b = dir_ / "b";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess job =
      spawn(kMeshrun + " --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- " + kMeshtrain +
                " " + train_args(a, steps, 10) + " --set train.log_interval=100",
            log);
  ASSERT_TRUE(job.started());
  // Kill rank 1 once the first checkpoint is committed, mid-run.
  meshtrain::testing::wait_until(
      [&] { return fs::exists(a / "checkpoints" / "step_10" / "manifest.json"); }, 60s, 5ms);
  const std::vector<pid_t> workers = children_of(job.pid());
  ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
  ::kill(workers[1], SIGKILL);
  const std::optional<int> status = job.wait_for(180s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "meshrun did not finish after the restart\n" << output;
  ASSERT_TRUE(WIFEXITED(*status)) << output;
  ASSERT_EQ(WEXITSTATUS(*status), 0) << output;
  ASSERT_NE(output.find("was killed by signal 9"), std::string::npos)
      << "the kill landed after the job finished; " << output;
  EXPECT_NE(output.find("restart 1 of 1"), std::string::npos) << output;
  EXPECT_NE(output.find("resumed from"), std::string::npos) << output;

  Result straight = run(kMeshrun + " --nproc-per-node 2 -- " + kMeshtrain + " " +
                        train_args(b, steps, steps) + " --set train.log_interval=100");
  ASSERT_EQ(straight.status, 0) << straight.output;
  const std::string final_step = "step_" + std::to_string(steps);
  const std::string resumed =
      file_bytes(a / "checkpoints" / final_step / "model_rank00000.safetensors");
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == file_bytes(b / "checkpoints" / final_step / "model_rank00000.safetensors"))
      << "final parameters differ from the uninterrupted run";
}

}  // namespace
