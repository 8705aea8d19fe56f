// The two ways a checkpoint write ends badly outside the program's control, end to end with the
// built programs: the process is killed (SIGKILL) in the middle of writing a checkpoint, and
// the disk fills up. In both the previous checkpoint must stay the one `latest` names, stay
// loadable and be the one the next run resumes from; the half-written directory never counts.
//
// The kill is made deterministic with the writer's test hook MESHTRAIN_TEST_CKPT_STALL_AT_STEP
// (it stops for good after the shard files of that step), and the full disk is a small tmpfs
// mounted in a private mount namespace (`unshare -m`), so it disappears with the run. Both need
// root; a machine where the tmpfs cannot be mounted fails the test saying so.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>
#include <vector>

#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class CheckpointCrash : public TrainRunTest {
 protected:
  static std::string latest(const fs::path& root) {
    std::string line;
    std::ifstream in(root / "latest");
    std::getline(in, line);
    return line;
  }

  // Beside the step directories and `latest`, the root holds the job's state (job_state.json:
  // the counters of meshtrain/obs/job_metrics.h carried over attempts).
  static std::vector<std::string> entries(const fs::path& root) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(root)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

  // Waits until `path` exists (the writer got that far) or the deadline passes.
  static bool wait_for(const fs::path& path, std::chrono::seconds limit = 90s) {
    return wait_until([&] { return fs::exists(path); }, limit);
  }
};

TEST_F(CheckpointCrash, KillDuringAWriteKeepsThePreviousCheckpointAndTheRerunResumesFromIt) {
  const fs::path a = dir_ / "a", b = dir_ / "b", root = a / "checkpoints";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess run = spawn(
      "env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " + kMeshtrainBin + " " + train_args(a, 20, 5),
      log);
  ASSERT_TRUE(run.started());
  // The shard file of step 10 is complete, its rank record is not: the checkpoint is half done.
  const bool midway = wait_for(root / "step_10.tmp" / "model_rank00000.safetensors");
  const int status = run.kill_and_reap();
  ASSERT_TRUE(midway) << "the writer never reached step 10: " << file_bytes(log);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << file_bytes(log);

  EXPECT_EQ(latest(root), "step_5");
  EXPECT_EQ(entries(root),
            (std::vector<std::string>{"job_state.json", "latest", "step_10.tmp", "step_5"}));
  CommandResult verify = run_command(kMeshtrainBin + " ckpt verify " + (root / "step_5").string());
  EXPECT_EQ(verify.status, 0) << verify.output;

  CommandResult rerun = run_command(kMeshtrainBin + " " + train_args(a, 20, 5));
  ASSERT_EQ(rerun.status, 0) << rerun.output;
  EXPECT_NE(rerun.output.find("resumed from " + (root / "step_5").string() + " (step 5 of 20)"),
            std::string::npos)
      << rerun.output;
  EXPECT_EQ(entries(root),
            (std::vector<std::string>{"job_state.json", "latest", "step_10", "step_15", "step_20"}))
      << "the leftover step_10.tmp was not cleaned up";

  CommandResult straight = run_command(kMeshtrainBin + " " + train_args(b, 20, 5));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const std::string resumed = file_bytes(root / "step_20" / "model_rank00000.safetensors");
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == file_bytes(b / "checkpoints" / "step_20" / "model_rank00000.safetensors"))
      << "the resumed run's final parameters differ from an uninterrupted run's";
}

// Two ranks under meshrun --max-restarts: rank 0 is killed while both ranks are inside the
// save of step 10; the agent restarts the job, which resumes from step 5 and finishes with the
// parameters of an uninterrupted run.
TEST_F(CheckpointCrash, KilledRankMidWriteIsRestartedFromThePreviousCheckpoint) {
  const fs::path a = dir_ / "a", b = dir_ / "b", root = a / "checkpoints";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess job = spawn("env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " + kMeshrunBin +
                               " --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- " +
                               kMeshtrainBin + " " + train_args(a, 20, 5),
                           log);
  ASSERT_TRUE(job.started());
  const bool midway = wait_for(root / "step_10.tmp" / "model_rank00000.safetensors");
  const std::vector<pid_t> workers = children_of(job.pid());
  ASSERT_TRUE(midway) << file_bytes(log);
  ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
  EXPECT_EQ(latest(root), "step_5");
  ::kill(workers[0], SIGKILL);
  const std::optional<int> status = job.wait_for(180s);
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "meshrun did not finish after the restart\n" << output;
  ASSERT_TRUE(WIFEXITED(*status)) << output;
  ASSERT_EQ(WEXITSTATUS(*status), 0) << output;
  EXPECT_NE(output.find("restart 1 of 1"), std::string::npos) << output;
  EXPECT_NE(output.find("resumed from " + (root / "step_5").string() + " (step 5 of 20)"),
            std::string::npos)
      << output;
  EXPECT_EQ(entries(root), (std::vector<std::string>{"job_state.json", "latest", "step_10",
                                                     "step_15", "step_20"}));

  CommandResult straight = run_command(kMeshrunBin + " --nproc-per-node 2 -- " + kMeshtrainBin +
                                       " " + train_args(b, 20, 5));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const std::string resumed = file_bytes(root / "step_20" / "model_rank00000.safetensors");
  ASSERT_FALSE(resumed.empty());
  EXPECT_TRUE(resumed == file_bytes(b / "checkpoints" / "step_20" / "model_rank00000.safetensors"))
      << "the restarted job's final parameters differ from an uninterrupted run's";
}

class DiskFull : public CheckpointCrash {
 protected:
  // The bytes a checkpoint of the tiny model takes on a tmpfs (files rounded up to pages),
  // measured from a real checkpoint rather than assumed.
  static uint64_t checkpoint_bytes(const fs::path& step_dir) {
    uint64_t total = 0;
    for (const auto& e : fs::directory_iterator(step_dir))
      total += (e.file_size() + 4095) / 4096 * 4096;
    return total;
  }

  struct Outcome {
    CommandResult run;  // the whole shell's output and status
    int train_status = -1;
    fs::path copy;  // what the tmpfs held after the run
  };

  // Trains 20 steps with a checkpoint every 5 into a tmpfs that holds one checkpoint and a half:
  // step 5 fits, step 10 runs out of space midway.
  Outcome train_on_small_disk(const std::string& on_error) {
    const fs::path probe = dir_ / "probe";
    CommandResult p = run_command(kMeshtrainBin + " " + train_args(probe, 5, 5));
    EXPECT_EQ(p.status, 0) << p.output;
    const uint64_t one = checkpoint_bytes(probe / "checkpoints" / "step_5");
    const uint64_t disk = one + one / 2 + 2 * 4096;
    const fs::path mnt = dir_ / "disk", copy = dir_ / "after";
    fs::create_directories(mnt);
    fs::create_directories(copy);
    const std::string script =
        "mount -t tmpfs -o size=" + std::to_string(disk) + " tmpfs " + mnt.string() +
        " || { echo \"cannot mount a tmpfs\"; exit 97; }; " + kMeshtrainBin + " " +
        train_args(dir_ / "run", 20, 5,
                   "--set ckpt.dir=" + mnt.string() + " --set ckpt.on_error=" + on_error) +
        "; echo \"train exit status $?\"; cp -a " + mnt.string() + "/. " + copy.string() + "/";
    Outcome o;
    o.run = run_command("unshare -m sh -c '" + script + "'");
    o.copy = copy;
    std::smatch m;
    if (std::regex_search(o.run.output, m, std::regex("train exit status ([0-9]+)")))
      o.train_status = std::stoi(m[1]);
    return o;
  }

  static int count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1))
      ++n;
    return n;
  }

  // The only checkpoint is step 5, named by `latest`, intact; nothing half written is left.
  void expect_step_5_untouched(const fs::path& root, const std::string& output) {
    EXPECT_EQ(latest(root), "step_5") << output;
    EXPECT_EQ(entries(root), (std::vector<std::string>{"job_state.json", "latest", "step_5"}))
        << output;
    CommandResult verify =
        run_command(kMeshtrainBin + " ckpt verify " + (root / "step_5").string());
    EXPECT_EQ(verify.status, 0) << verify.output;
  }
};

TEST_F(DiskFull, StopEndsTheRunWithOneLineNamingTheFileAndENOSPC) {
  Outcome o = train_on_small_disk("stop");
  ASSERT_NE(o.run.status, 97) << "cannot make a small disk (needs root): " << o.run.output;
  ASSERT_EQ(o.run.status, 0) << o.run.output;
  EXPECT_GT(o.train_status, 0) << "the run must stop with a failure status: " << o.run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      o.run.output, m,
      std::regex("meshtrain: error: checkpoint step 10: writing [^ ]*/step_10\\.tmp/"
                 "[a-z_0-9]+\\.safetensors failed: [^\n]*ENOSPC[^\n]*\n")))
      << o.run.output;
  EXPECT_EQ(count(o.run.output, "No space left on device"), 1) << o.run.output;
  EXPECT_EQ(o.run.output.find("step 20/20"), std::string::npos) << o.run.output;
  expect_step_5_untouched(o.copy, o.run.output);
}

TEST_F(DiskFull, ContinueReportsEveryFailedSaveAndFinishesTraining) {
  Outcome o = train_on_small_disk("continue");
  ASSERT_NE(o.run.status, 97) << "cannot make a small disk (needs root): " << o.run.output;
  ASSERT_EQ(o.run.status, 0) << o.run.output;
  EXPECT_EQ(o.train_status, 0) << o.run.output;
  // Steps 10, 15 and 20 do not fit; each failure is one line, and training reaches the end.
  EXPECT_EQ(count(o.run.output, "No space left on device"), 3) << o.run.output;
  EXPECT_EQ(count(o.run.output, "training continues (ckpt.on_error = continue)"), 3)
      << o.run.output;
  EXPECT_NE(o.run.output.find("step 20/20"), std::string::npos) << o.run.output;
  expect_step_5_untouched(o.copy, o.run.output);
}

}  // namespace
}  // namespace meshtrain::testing
