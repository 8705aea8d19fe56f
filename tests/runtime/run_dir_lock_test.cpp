// The run directory's lock: one job per train.out_dir, a dead holder taken over, the ranks and
// restarts of one job sharing it; and, end to end, a second `meshtrain train` on a directory in
// use refused with one line while the first keeps it.
#include "meshtrain/runtime/run_dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/util/error.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::runtime {
namespace {

using meshtrain::testing::TempDir;
using meshtrain::testing::wait_until;
namespace fs = std::filesystem;

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

RunDirLockOptions job(const std::string& id, const std::string& host = "") {
  RunDirLockOptions o;
  o.job_id = id;
  o.host = host;
  return o;
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  in >> id;
  return id;
}

// A lock file as another process would have left it.
void write_holder(const fs::path& dir, const nlohmann::json& holder) {
  std::ofstream(dir / RunDirLock::kFileName) << holder.dump() << "\n";
}

void age_file(const fs::path& path, std::chrono::seconds age) {
  const timespec now{::time(nullptr) - age.count(), 0};
  const timespec times[2] = {now, now};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

std::string refusal(const fs::path& dir, RunDirLockOptions options = {}) {
  try {
    RunDirLock lock(dir, options);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(RunDirLock, HoldsTheFileForItsLifetime) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "run";
  {
    RunDirLock lock(dir, job("job-a"));
    const auto holder = read_run_dir_holder(lock.path());
    ASSERT_TRUE(holder.has_value());
    EXPECT_EQ(holder->pid, ::getpid());
    EXPECT_EQ(holder->host, host_name());
    EXPECT_EQ(holder->job_id, "job-a");
    EXPECT_FALSE(holder->start_time.empty());
  }
  EXPECT_FALSE(fs::exists(dir / RunDirLock::kFileName));
  // Only the lock itself was ever visible: no private file is left behind.
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(RunDirLock, RefusesAnotherJobWhileTheHolderLives) {
  TempDir tmp;
  RunDirLock first(tmp.path(), job("job-a"));
  const std::string line = refusal(tmp.path(), job("job-b"));
  EXPECT_NE(line.find("is in use by another job"), std::string::npos) << line;
  EXPECT_NE(line.find("host " + host_name()), std::string::npos) << line;
  EXPECT_NE(line.find("pid " + std::to_string(::getpid())), std::string::npos) << line;
  EXPECT_NE(line.find("started 20"), std::string::npos) << line;
  EXPECT_NE(line.find("job job-a"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  // The refused one left the holder's file alone.
  EXPECT_EQ(read_run_dir_holder(first.path())->job_id, "job-a");
}

TEST(RunDirLock, ALockWithoutAJobIdIsNeverShared) {
  TempDir tmp;
  RunDirLock first(tmp.path(), {});
  EXPECT_NE(refusal(tmp.path(), {}), "");
}

TEST(RunDirLock, TakesOverFromADeadProcessOnThisHost) {
  TempDir tmp;
  // No process has this pid (above the kernel's largest pid_max).
  write_holder(
      tmp.path(),
      {{"host", host_name()}, {"pid", 0x7ffffff0}, {"start_time", "x"}, {"boot_id", boot_id()}});
  RunDirLock lock(tmp.path(), job("job-b"));
  EXPECT_EQ(read_run_dir_holder(lock.path())->pid, ::getpid());
}

TEST(RunDirLock, TakesOverWhenThePidNowBelongsToAnotherProcess) {
  TempDir tmp;
  // Our own pid, but another start time: the holder died and its pid was reused.
  write_holder(tmp.path(), {{"host", host_name()},
                            {"pid", ::getpid()},
                            {"start_time", "x"},
                            {"boot_id", boot_id()},
                            {"pid_start", 1}});
  RunDirLock lock(tmp.path(), job("job-b"));
  EXPECT_EQ(read_run_dir_holder(lock.path())->job_id, "job-b");
}

// A holder killed but not yet reaped by its parent still answers kill(pid, 0).
TEST(RunDirLock, AKilledHolderNotYetReapedIsDead) {
  meshtrain::testing::ChildProcess child = meshtrain::testing::fork_child([] { return 0; });
  ASSERT_TRUE(child.started());
  const auto zombie = [&] {
    std::ifstream in("/proc/" + std::to_string(child.pid()) + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return stat.find(") Z ") != std::string::npos;
  };
  ASSERT_TRUE(wait_until(zombie, std::chrono::seconds(10)));
  TempDir tmp;
  write_holder(
      tmp.path(),
      {{"host", host_name()}, {"pid", child.pid()}, {"start_time", "x"}, {"boot_id", boot_id()}});
  RunDirLock lock(tmp.path(), job("job-b"));
  EXPECT_EQ(read_run_dir_holder(lock.path())->pid, ::getpid());
}

TEST(RunDirLock, AnotherHostIsAliveUntilItsHeartbeatIsStale) {
  TempDir tmp;
  write_holder(tmp.path(), {{"host", "elsewhere"}, {"pid", 42}, {"start_time", "t0"}});
  const std::string line = refusal(tmp.path(), job("job-b"));
  EXPECT_NE(line.find("host elsewhere, pid 42, started t0"), std::string::npos) << line;
  age_file(tmp.path() / RunDirLock::kFileName, std::chrono::seconds(120));
  RunDirLock lock(tmp.path(), job("job-b"));
  EXPECT_EQ(read_run_dir_holder(lock.path())->job_id, "job-b");
}

TEST(RunDirLock, TheSameJobTakesOverItsEarlierAttempt) {
  TempDir tmp;
  // A restart whose rank 0 moved: the earlier attempt's heartbeat is still fresh.
  write_holder(tmp.path(),
               {{"host", "elsewhere"}, {"pid", 42}, {"start_time", "t0"}, {"job_id", "job-a"}});
  RunDirLock lock(tmp.path(), job("job-a"));
  EXPECT_EQ(read_run_dir_holder(lock.path())->pid, ::getpid());
}

TEST(RunDirLock, AHolderThatWasTakenOverLeavesTheNewFileAlone) {
  TempDir tmp;
  auto first = std::make_unique<RunDirLock>(tmp.path(), job("job-a"));
  RunDirLock second(tmp.path(), job("job-a", "another-host"));
  first.reset();
  EXPECT_EQ(read_run_dir_holder(second.path())->host, "another-host");
}

TEST(RunDirLock, TheHeartbeatKeepsTheFileFresh) {
  TempDir tmp;
  RunDirLockOptions options;
  options.heartbeat = std::chrono::milliseconds(20);
  RunDirLock lock(tmp.path(), options);
  age_file(lock.path(), std::chrono::seconds(120));
  const auto fresh = [&] {
    struct stat st {};
    return ::stat(lock.path().c_str(), &st) == 0 && ::time(nullptr) - st.st_mtime < 60;
  };
  EXPECT_TRUE(wait_until(fresh, std::chrono::seconds(10)));
}

TEST(RunDirLock, AnUnreadableFreshFileIsRefusedAndAStaleOneTakenOver) {
  TempDir tmp;
  std::ofstream(tmp.path() / RunDirLock::kFileName) << "not json";
  const std::string line = refusal(tmp.path());
  EXPECT_NE(line.find("cannot be read"), std::string::npos) << line;
  age_file(tmp.path() / RunDirLock::kFileName, std::chrono::seconds(120));
  RunDirLock lock(tmp.path(), {});
  EXPECT_EQ(read_run_dir_holder(lock.path())->pid, ::getpid());
}

}  // namespace
}  // namespace meshtrain::runtime

namespace meshtrain::testing {
namespace {

using runtime::RunDirLock;
namespace fs = std::filesystem;

class RunDirLockRun : public TrainRunTest {};

// The same command twice on one train.out_dir: the second is refused with one line naming the
// first (exit 2) and changes nothing; once the first is killed, its lock is taken over and a
// third run resumes from the first's last complete checkpoint.
TEST_F(RunDirLockRun, ASecondJobIsRefusedAndADeadOnesLockTakenOver) {
  const fs::path out = dir_ / "out";
  const std::string args = train_args(out, 20, 5);
  ChildProcess first =
      spawn("env MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10 " + kMeshtrainBin + " " + args,
            (dir_ / "first.log").string());
  ASSERT_TRUE(first.started());
  const fs::path midway = out / "checkpoints" / "step_10.tmp";
  ASSERT_TRUE(wait_until([&] { return fs::exists(midway); }, std::chrono::seconds(120)))
      << file_bytes(dir_ / "first.log");
  const std::string metrics_before = file_bytes(out / "metrics.jsonl");

  const CommandResult second = run_command(kMeshtrainBin + " " + args + " 2>&1");
  EXPECT_EQ(second.status, 2) << second.output;
  EXPECT_NE(second.output.find("is in use by another job (host "), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("pid " + std::to_string(first.pid()) + ", started "),
            std::string::npos)
      << second.output;
  EXPECT_EQ(std::count(second.output.begin(), second.output.end(), '\n'), 1) << second.output;
  EXPECT_TRUE(fs::exists(midway));
  EXPECT_EQ(file_bytes(out / "metrics.jsonl").substr(0, metrics_before.size()), metrics_before);

  first.kill_and_reap();
  ASSERT_TRUE(fs::exists(out / RunDirLock::kFileName)) << "the killed run's lock is left behind";
  const CommandResult third = run_command(kMeshtrainBin + " " + args + " 2>&1");
  EXPECT_EQ(third.status, 0) << third.output;
  EXPECT_NE(third.output.find("(step 5 of 20)"), std::string::npos) << third.output;
  EXPECT_FALSE(fs::exists(out / RunDirLock::kFileName));
}

}  // namespace
}  // namespace meshtrain::testing
