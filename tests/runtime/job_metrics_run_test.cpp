// The job-level indicators (meshtrain/obs/job_metrics.h) after real resumes: a two-rank job that
// meshrun restarts after a crash, and a one-process job crashed, left down for a known time,
// resumed (its /metrics scraped while it trains), preempted and resumed again, and a job whose
// rollbacks carry over to its next attempt. The values are read where an operator would: the
// /metrics endpoint, metrics.jsonl and the job's state file.
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <optional>

#include "tests/obs/exposition_parser.h"
#include "tests/obs/prometheus_harness.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class JobMetricsRun : public TrainRunTest {
 protected:
  // The "resume" events of rank 0's metrics.jsonl, in order.
  static std::vector<nlohmann::json> resume_events(const fs::path& out) {
    std::vector<nlohmann::json> v;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "resume") v.push_back(j);
    }
    return v;
  }
  static nlohmann::json job_state(const fs::path& out) {
    return nlohmann::json::parse(file_bytes(out / "checkpoints" / "job_state.json"), nullptr,
                                 false);
  }
};

TEST_F(JobMetricsRun, AJobRestartedByMeshrunReportsItsResumeRecoveryAndCompletion) {
  const fs::path a = dir_ / "a";
  const double started = unix_now();
  const auto t0 = Clock::now();
  CommandResult r = run_command("MESHTRAIN_TEST_CRASH_AT_STEP=8 " + kMeshrunBin +
                                " --nproc-per-node 2 --max-restarts 1 --grace-period 2 -- " +
                                kMeshtrainBin + " " + train_args(a, 12, 5));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("(step 5 of 12)"), std::string::npos) << r.output;

  const auto events = resume_events(a);
  ASSERT_EQ(events.size(), 1u) << file_bytes(a / "metrics.jsonl");
  EXPECT_EQ(events[0]["step"], 5);
  EXPECT_EQ(events[0]["resumes"], 1);
  const double recover_s = events[0]["recover_s"].get<double>();
  // From the first attempt's last step to the second's first: more than nothing (two processes
  // ended, a new rendezvous and start-up), less than the whole job.
  EXPECT_GT(recover_s, 0.0);
  EXPECT_LT(recover_s, took);
  EXPECT_NE(r.output.find("recovered in "), std::string::npos) << r.output;

  const auto st = job_state(a);
  ASSERT_TRUE(st.is_object()) << file_bytes(a / "checkpoints" / "job_state.json");
  EXPECT_EQ(st["resumes_success"], 1);
  EXPECT_EQ(st["resumes_failure"], 0);
  EXPECT_EQ(st["rollbacks"], 0);
  EXPECT_EQ(st["completed"], true);
  EXPECT_EQ(st["last_step"], 12);
  EXPECT_EQ(st["last_checkpoint_step"], 12);
  EXPECT_GE(st["last_checkpoint_unix_s"].get<double>(), started);
  EXPECT_LE(st["last_checkpoint_unix_s"].get<double>(), unix_now());
  EXPECT_DOUBLE_EQ(st["last_recovery_s"].get<double>(), recover_s);
}

TEST_F(JobMetricsRun, ResumesAreCountedOverAttemptsAndTheEndpointShowsThem) {
  const fs::path out = dir_ / "run";
  // Attempt 1 crashes at step 7 (after the checkpoint of step 4).
  CommandResult first = run_command("MESHTRAIN_TEST_CRASH_AT_STEP=7 " + kMeshtrainBin + " " +
                                    train_args(out, 100000, 2));
  ASSERT_NE(first.status, 0) << first.output;
  ASSERT_NE(first.output.find("simulated crash"), std::string::npos) << first.output;
  // The job stays down for at least `down` (a known lower bound of its time to recover).
  const auto crashed = Clock::now();
  constexpr double down = 1.5;
  ASSERT_TRUE(wait_until(
      [&] { return std::chrono::duration<double>(Clock::now() - crashed).count() >= down; },
      std::chrono::seconds(5)));

  // Attempt 2 resumes and trains on, serving /metrics; scraped until the resume and a periodic
  // checkpoint of this attempt show.
  int port = 0;
  for (int tries = 0; tries < 50 && port == 0; ++tries)
    if (const int p = obs::testing::free_port(); obs::testing::port_free(p)) port = p;
  ASSERT_NE(port, 0);
  ChildProcess second = spawn(kMeshtrainBin + " " + train_args(out, 100000, 2) +
                                  " --set train.metrics_port=" + std::to_string(port),
                              (dir_ / "second.log").string());
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(1, 0);
  std::optional<obs::testing::Exposition> scraped;
  ASSERT_TRUE(wait_until(
      [&] {
        auto res = cli.Get("/metrics");
        if (!res || res->status != 200) return false;
        auto e = obs::testing::parse_exposition(res->body);
        if (e.find("meshtrain_resumes_total", {{"outcome", "success"}}).empty() ||
            e.find("meshtrain_recovery_duration_seconds").empty() ||
            e.find("meshtrain_recovery_duration_seconds")[0].value < 0 ||
            e.find("meshtrain_checkpoints_total", {{"outcome", "success"}})[0].value < 1)
          return false;
        scraped = std::move(e);
        return true;
      },
      std::chrono::seconds(60)))
      << file_bytes(dir_ / "second.log");
  second.signal(SIGTERM);  // preempted: saves a checkpoint and exits 0
  const auto status = second.wait_for(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "still running 60 s after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << file_bytes(dir_ / "second.log");

  const auto& e = *scraped;
  EXPECT_EQ(e.find("meshtrain_resumes_total", {{"outcome", "success"}})[0].value, 1);
  EXPECT_EQ(e.find("meshtrain_resumes_total", {{"outcome", "failure"}})[0].value, 0);
  const double recover_s = e.find("meshtrain_recovery_duration_seconds")[0].value;
  EXPECT_GE(recover_s, down);
  EXPECT_LT(recover_s, 60 + down);
  EXPECT_EQ(e.find("meshtrain_job_completed")[0].value, 0);
  EXPECT_GE(e.find("meshtrain_last_checkpoint_step")[0].value, 4);
  EXPECT_GT(e.find("meshtrain_last_checkpoint_timestamp_seconds")[0].value, 0);
  EXPECT_GT(e.find("meshtrain_tokens_per_second_baseline")[0].value, 0);
  EXPECT_GT(e.find("meshtrain_last_step_timestamp_seconds")[0].value, unix_now() - 120);

  // Attempt 3 resumes from the preemption's checkpoint and finishes: the count goes on to 2.
  const int64_t stopped_at = last_step(out);
  ASSERT_GT(stopped_at, 4);
  CommandResult third = run_command(kMeshtrainBin + " " + train_args(out, stopped_at + 2, 2));
  ASSERT_EQ(third.status, 0) << third.output;
  const auto st = job_state(out);
  ASSERT_TRUE(st.is_object());
  EXPECT_EQ(st["resumes_success"], 2);
  EXPECT_EQ(st["completed"], true);
  EXPECT_EQ(st["last_checkpoint_step"], stopped_at + 2);
  const auto events = resume_events(out);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["step"], 6);
  EXPECT_EQ(events[1]["step"], stopped_at);
  EXPECT_EQ(events[1]["resumes"], 2);
}

TEST_F(JobMetricsRun, RollbacksAreCountedAndCarriedToTheNextAttempt) {
  const fs::path out = dir_ / "run";
  const std::string rollback = "--set train.rollback_after=2 --set train.max_rollbacks=2";
  // Non-finite steps from step 7 on, every time: two rollbacks, then the run gives up.
  CommandResult faulted = run_command("MESHTRAIN_TEST_NAN_STEPS=7-20,always " + kMeshtrainBin +
                                      " " + train_args(out, 20, 5, rollback));
  ASSERT_NE(faulted.status, 0) << faulted.output;
  ASSERT_NE(faulted.output.find("rollback 2 of 2"), std::string::npos) << faulted.output;
  auto st = job_state(out);
  ASSERT_TRUE(st.is_object());
  EXPECT_EQ(st["rollbacks"], 2);
  EXPECT_EQ(st["completed"], false);

  // The fault is gone: the next attempt resumes, finishes, and still counts the two rollbacks.
  CommandResult rerun = run_command(kMeshtrainBin + " " + train_args(out, 20, 5, rollback));
  ASSERT_EQ(rerun.status, 0) << rerun.output;
  st = job_state(out);
  EXPECT_EQ(st["rollbacks"], 2);
  EXPECT_EQ(st["resumes_success"], 1);
  EXPECT_EQ(st["completed"], true);
}

}  // namespace
}  // namespace meshtrain::testing
