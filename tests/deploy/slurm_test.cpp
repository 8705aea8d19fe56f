// deploy/slurm/train.sbatch on a real Slurm (munged, slurmctld and slurmd on loopback, one node,
// two tasks): the batch script trains to the end; and `scontrol requeue` of the running job
// stops it with a checkpoint (SIGTERM), and the requeued attempt resumes from the newest
// checkpoint and finishes, both attempts appending to one log.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "tests/deploy/slurm_cluster.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;
using meshtrain::testing::SlurmCluster;

const std::string kScript = std::string(MESHTRAIN_SOURCE_DIR) + "/deploy/slurm/train.sbatch";

class Slurm : public meshtrain::testing::TrainRunTest {
 protected:
  // Submits the batch script for a two-task job on the one node, with `env` (VAR=VALUE words)
  // added to sbatch's environment; returns the job id.
  std::string submit(const fs::path& out, int64_t steps, int64_t interval,
                     const std::string& extra = "", const std::string& env = "") {
    // The script runs `meshtrain train --config ... --set train.out_dir=...` itself; the rest of
    // the tiny run's arguments go through MESHTRAIN_ARGS.
    std::string args = train_args(out, steps, interval, extra);
    args = args.substr(args.find(' ') + 1);  // without the leading "train"
    const std::string cmd =
        "cd " + dir_.string() + " && env MESHTRAIN_BIN=" + kMeshtrainBin +
        " MESHTRAIN_CONFIG=" + std::string(MESHTRAIN_SOURCE_DIR) + "/configs/demo.toml" +
        " MESHTRAIN_OUT_DIR=" + out.string() +
        " MESHTRAIN_TOKEN_FILE=" + (dir_ / "token").string() + " MESHTRAIN_ARGS='" + args + "' " +
        env + " sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 " +
        "--output=" + (dir_ / "slurm-%j.log").string() + " " + kScript;
    const auto r = run_command(cmd);
    EXPECT_EQ(r.status, 0) << cmd << "\n" << r.output;
    std::string id = r.output;
    id.erase(std::remove_if(id.begin(), id.end(), [](char ch) { return !std::isdigit(ch); }),
             id.end());
    return id;
  }
  std::string job_log(const std::string& id) { return file_bytes(dir_ / ("slurm-" + id + ".log")); }
  // Waits for job `id` to end and fails the test unless it completed; returns its log.
  std::string completed_log(const std::string& id, SlurmCluster& cluster) {
    const bool done = SlurmCluster::wait_for([&] { return SlurmCluster::job_ended(id); }, 180s) &&
                      SlurmCluster::job_state(id) == "COMPLETED";
    const std::string log = job_log(id);
    EXPECT_TRUE(done) << "job " << id << " state " << SlurmCluster::job_state(id) << "\n"
                      << log << cluster.logs();
    return log;
  }
};

TEST_F(Slurm, BatchScriptTrainsToTheEnd) {
  SlurmCluster cluster(2);
  MT_SKIP_UNLESS("slurm", cluster.unavailable_reason().empty(), cluster.unavailable_reason());
  const fs::path out = dir_ / "run";
  const int64_t steps = 6;
  const std::string id = submit(out, steps, 3);
  ASSERT_FALSE(id.empty());
  const std::string log = completed_log(id, cluster);
  if (HasFailure()) return;
  EXPECT_NE(log.find("(2 tasks)"), std::string::npos) << log;
  EXPECT_NE(log.find("x ranks 2"), std::string::npos) << log;
  EXPECT_NE(log.find("step 6/6"), std::string::npos) << log;
  EXPECT_EQ(last_step(out), steps) << log;
  EXPECT_EQ(SlurmCluster::job_field(id, "ExitCode"), "0:0");
}

// MESHTRAIN_PS_SERVERS=1: of the two tasks (the node's two CPUs) the last serves the parameters,
// the first trains.
TEST_F(Slurm, ParameterServerJobTrainsToTheEnd) {
  SlurmCluster cluster(2);
  MT_SKIP_UNLESS("slurm", cluster.unavailable_reason().empty(), cluster.unavailable_reason());
  const fs::path out = dir_ / "run";
  const int64_t steps = 6;
  const std::string id = submit(out, steps, 3, "", "MESHTRAIN_PS_SERVERS=1");
  ASSERT_FALSE(id.empty());
  const std::string log = completed_log(id, cluster);
  if (HasFailure()) return;
  EXPECT_NE(log.find("(2 tasks: 1 training, 1 serving the parameters)"), std::string::npos) << log;
  EXPECT_NE(log.find("parameter server: 1 worker, 1 server, sync"), std::string::npos) << log;
  EXPECT_NE(log.find("parameter server 0: 6 steps"), std::string::npos) << log;
  EXPECT_EQ(last_step(out), steps) << log;
}

// A server count that leaves no worker stops the script before srun, with one line.
TEST_F(Slurm, ParameterServerCountThatLeavesNoWorkerIsOneLine) {
  SlurmCluster cluster(2);
  MT_SKIP_UNLESS("slurm", cluster.unavailable_reason().empty(), cluster.unavailable_reason());
  const std::string id = submit(dir_ / "run", 6, 3, "", "MESHTRAIN_PS_SERVERS=2");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(SlurmCluster::wait_for([&] { return SlurmCluster::job_ended(id); }, 120s));
  const std::string log = job_log(id);
  EXPECT_EQ(SlurmCluster::job_state(id), "FAILED") << log;
  EXPECT_NE(log.find("MESHTRAIN_PS_SERVERS=2 must be a count below the job's 2 tasks"),
            std::string::npos)
      << log;
}

TEST_F(Slurm, RequeueStopsWithACheckpointAndTheJobResumesFromIt) {
  SlurmCluster cluster(2);
  MT_SKIP_UNLESS("slurm", cluster.unavailable_reason().empty(), cluster.unavailable_reason());
  const fs::path out = dir_ / "run";
  // Long enough that the job is still running when it is requeued; short enough for CI.
  const int64_t steps = 400;
  const std::string id = submit(out, steps, 10);
  ASSERT_FALSE(id.empty());
  // Requeue once a checkpoint exists and training has gone on past it.
  const bool trained = SlurmCluster::wait_for(
      [&] {
        return (fs::exists(out / "checkpoints" / "latest") && last_step(out) >= 15) ||
               SlurmCluster::job_ended(id);
      },
      120s);
  if (!trained || !fs::exists(out / "checkpoints" / "latest") || last_step(out) >= steps - 50) {
    FAIL() << "job " << id << " did not train as expected before the requeue (step "
           << last_step(out) << ")\n"
           << job_log(id) << cluster.logs();
  }
  const auto rq = run_command("scontrol requeue " + id);
  ASSERT_EQ(rq.status, 0) << rq.output;
  // Slurm holds a requeued batch job back for a while (Reason=BeginTime); an administrator may
  // release it at once, which keeps this test short.
  ASSERT_TRUE(SlurmCluster::wait_for(
      [&] {
        return SlurmCluster::job_field(id, "Reason") == "BeginTime" || SlurmCluster::job_ended(id);
      },
      60s))
      << SlurmCluster::job_state(id);
  const auto release = run_command("scontrol update JobId=" + id + " StartTime=now");
  ASSERT_EQ(release.status, 0) << release.output;
  const bool done = SlurmCluster::wait_for([&] { return SlurmCluster::job_ended(id); }, 240s) &&
                    SlurmCluster::job_state(id) == "COMPLETED";
  const std::string log = job_log(id);
  ASSERT_TRUE(done) << "job " << id << " state " << SlurmCluster::job_state(id) << "\n"
                    << log << cluster.logs();
  EXPECT_EQ(SlurmCluster::job_field(id, "Restarts"), "1") << log;
  // The first attempt stopped at a step with a checkpoint; the second resumed from the newest.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m, std::regex("preempted by [^\\n]* at step ([0-9]+); checkpoint saved")))
      << log;
  const std::string stopped_at = m[1];
  EXPECT_NE(log.find("attempt 1 on localhost"), std::string::npos) << log;
  EXPECT_TRUE(std::regex_search(log, m,
                                std::regex("resumed from [^\\n]*step_0*" + stopped_at +
                                           "[^\\n]* \\(step " + stopped_at + " of ")))
      << log;
  EXPECT_NE(log.find("step 400/400"), std::string::npos) << log;
  EXPECT_EQ(last_step(out), steps);
}

}  // namespace
