// Parameter-server training through `meshrun --ps-servers` and `meshtrain train` with the built
// programs: sync mode is the all-reduce job bit for bit at every step (one and two servers),
// ssp keeps every gradient within its staleness bound while a slowed worker trails, backup
// workers let the job go on while a worker is stopped (and train its dropped batches again),
// and what cannot run is one line with exit status 2.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::ChildProcess;
using meshtrain::testing::CommandResult;
using meshtrain::testing::run_command;

class ParamServerRun : public meshtrain::testing::TrainRunTest {
 protected:
  static nlohmann::json server_report(const fs::path& out, int server) {
    std::ifstream in(out / ("ps_server" + std::to_string(server) + ".json"));
    return nlohmann::json::parse(in, nullptr, false);
  }
  // The run's rows with a "ps" record.
  static std::map<int64_t, nlohmann::json> ps_rows(const fs::path& out) {
    return by_step<nlohmann::json>(out, "ps");
  }
  // Runs `cmd` (meshrun with --max-restarts 1, 3 ranks, 40 steps into `out`, a checkpoint every
  // 10), SIGKILLs rank `victim` once the servers' and the workers' step 10 are saved and step 12
  // is done, and leaves the job's output in `output` once it has ended with status 0 after one
  // restart.
  // A job of two workers and `servers` servers in `consistency` mode, 40 steps with a cut every
  // 10, whose worker `victim` is killed after step 12 (the tests below).
  void replace_killed_worker(const fs::path& out, int victim, int servers = 1,
                             const std::string& consistency = "async");
  void kill_mid_run(const std::string& cmd, const fs::path& out, int victim, std::string& output) {
    const std::string log = (dir_ / "run.log").string();
    ChildProcess job = spawn(cmd, log);
    ASSERT_TRUE(job.started());
    const fs::path ckpt = out / "checkpoints";
    const fs::path server = ckpt / "param_servers" / "server0" / "step_10.safetensors";
    ASSERT_TRUE(wait_until(
        [&] { return fs::exists(server) && fs::exists(ckpt / "step_10") && last_step(out) >= 12; },
        std::chrono::seconds(90)))
        << file_bytes(log);
    const std::vector<pid_t> ranks = meshrun_workers(job.pid());
    ASSERT_EQ(ranks.size(), 3u) << file_bytes(log);
    ASSERT_EQ(::kill(ranks[static_cast<size_t>(victim)], SIGKILL), 0);
    const std::optional<int> status = job.wait_for(std::chrono::seconds(150));
    output = file_bytes(log);
    ASSERT_TRUE(status.has_value()) << output;
    ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
    EXPECT_NE(output.find("restart 1 of 1"), std::string::npos) << output;
    EXPECT_EQ(last_step(out), 40) << output;
  }
};

TEST_F(ParamServerRun, SyncEqualsDataParallelBitwiseAtEveryStep) {
  // Wide enough (about 0.9 M parameters) that each server's range goes in several chunks, sent
  // while backward still runs.
  const std::string common =
      " --set model.n_layer=2 --set model.n_embd=192 --set model.n_head=4 "
      "--set optim.schedule=cosine";
  const fs::path ddp = dir_ / "ddp";
  CommandResult a = run_command(meshrun(2) + train_args(ddp, 8, 0, common));
  ASSERT_EQ(a.status, 0) << a.output;
  for (int servers : {1, 2}) {
    SCOPED_TRACE(servers);
    const fs::path ps = dir_ / ("ps" + std::to_string(servers));
    CommandResult b = run_command(meshrun(2 + servers, "--ps-servers " + std::to_string(servers)) +
                                  train_args(ps, 8, 0, common));
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("parameter server: 2 workers, " + std::to_string(servers) +
                            (servers > 1 ? " servers, sync" : " server, sync")),
              std::string::npos)
        << b.output;
    // The same global batch and optimizer: the loss and the norm (before clipping, which
    // applies) have the same bits at every step, and so do the final weights.
    const auto la = losses(ddp), lb = losses(ps);
    ASSERT_EQ(la.size(), 8u);
    EXPECT_EQ(la, lb);
    EXPECT_EQ(grad_norms(ddp), grad_norms(ps));
    bool same = false;
    EXPECT_EQ(weights_difference(ddp, ps, &same), 0.0f);
    EXPECT_TRUE(same);
    // Every step's record says what the servers did: nothing stale, nothing dropped.
    const auto rows = ps_rows(ps);
    ASSERT_EQ(rows.size(), 8u);
    for (const auto& [step, r] : rows) {
      EXPECT_EQ(r["staleness"], 0) << r.dump();
      EXPECT_EQ(r["dropped"], false) << r.dump();
      EXPECT_EQ(r["version"], step) << r.dump();
    }
    // Each server applied both workers' gradients at every step, on its share of the keys.
    int64_t elements = 0;
    for (int s = 0; s < servers; ++s) {
      const nlohmann::json rep = server_report(ps, s);
      ASSERT_TRUE(rep.is_object()) << b.output;
      EXPECT_EQ(rep["steps"], 8) << rep.dump();
      EXPECT_EQ(rep["applied"], 16) << rep.dump();
      EXPECT_EQ(rep["dropped"], 0) << rep.dump();
      elements += rep["elements"].get<int64_t>();
    }
    EXPECT_GT(elements, 0);
  }
}

TEST_F(ParamServerRun, SspKeepsEveryGradientWithinItsStalenessWhileAWorkerTrails) {
  const fs::path out = dir_ / "ssp";
  // Worker 1 takes three times as long per step: worker 0 runs ahead, by at most 2 steps.
  CommandResult r =
      run_command("env MESHTRAIN_TEST_SLOWDOWN=3@1 " + meshrun(3, "--ps-servers 1") +
                  train_args(out, 16, 0,
                             "--set parallel.ps.consistency=ssp --set parallel.ps.staleness=2 "
                             "--set parallel.ps.staleness_lr=true"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("parameter server: 2 workers, 1 server, ssp (staleness 2)"),
            std::string::npos)
      << r.output;
  const nlohmann::json rep = server_report(out, 0);
  ASSERT_TRUE(rep.is_object()) << r.output;
  // Each gradient is its own optimizer step.
  EXPECT_EQ(rep["applied"], 32) << rep.dump();
  EXPECT_EQ(rep["steps"], 32) << rep.dump();
  EXPECT_LE(rep["max_staleness"].get<int>(), 2) << rep.dump();
  // The leader did run ahead: some gradients were applied stale.
  const auto hist = rep["staleness_histogram"].get<std::vector<int64_t>>();
  ASSERT_GE(hist.size(), 2u) << rep.dump();
  int64_t total = 0, stale = 0;
  for (size_t k = 0; k < hist.size(); ++k) {
    total += hist[k];
    if (k > 0) stale += hist[k];
  }
  EXPECT_EQ(total, 32);
  EXPECT_GT(stale, 0) << rep.dump();
  EXPECT_EQ(rep["worker_clock"], nlohmann::json({16, 16})) << rep.dump();
  for (const auto& [step, row] : ps_rows(out)) EXPECT_LE(row["staleness"].get<int>(), 2);
  EXPECT_TRUE(std::isfinite(losses(out).rbegin()->second));
}

TEST_F(ParamServerRun, BackupWorkerKeepsStepsGoingWhileAWorkerIsStopped) {
  const fs::path out = dir_ / "backup";
  const std::string log = (dir_ / "run.log").string();
  ChildProcess job = spawn(
      meshrun(3, "--ps-servers 1") + train_args(out, 60, 0, "--set parallel.ps.backup_workers=1"),
      log);
  ASSERT_TRUE(job.started());
  ASSERT_TRUE(wait_until([&] { return last_step(out) >= 3; }, std::chrono::seconds(90)))
      << file_bytes(log);
  const std::vector<pid_t> ranks = meshrun_workers(job.pid());
  ASSERT_EQ(ranks.size(), 3u) << file_bytes(log);
  // Worker 1 stops; worker 0's steps go on without it (each takes the first gradient).
  ASSERT_EQ(::kill(ranks[1], SIGSTOP), 0);
  const int64_t at_stop = last_step(out);
  const bool went_on =
      wait_until([&] { return last_step(out) >= at_stop + 10; }, std::chrono::seconds(60));
  const int64_t while_stopped = last_step(out);
  ::kill(ranks[1], SIGCONT);
  EXPECT_TRUE(went_on) << "steps " << at_stop << " -> " << while_stopped << "\n" << file_bytes(log);
  const std::optional<int> status = job.wait_for(std::chrono::seconds(120));
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << output;
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
  EXPECT_EQ(last_step(out), 60) << output;
  // The stopped worker's late gradients were dropped, not applied stale, and said so.
  const nlohmann::json rep = server_report(out, 0);
  ASSERT_TRUE(rep.is_object()) << output;
  EXPECT_EQ(rep["steps"], 60) << rep.dump();
  EXPECT_GT(rep["dropped"].get<int64_t>(), 0) << rep.dump();
  EXPECT_EQ(rep["max_staleness"], 0) << rep.dump();
}

// With backup workers a checkpoint step waits for every worker: between checkpoints the slowed
// worker's late gradients are dropped (and their batches trained again), at a checkpoint step
// every gradient is applied, so no batch waits to be trained again when the step is saved, every
// worker saves it, and a resumed run goes on from it.
TEST_F(ParamServerRun, BackupWorkerCheckpointsWaitForEveryWorkerAndAResumedRunGoesOn) {
  const fs::path out = dir_ / "backup_ckpt";
  const std::string flags = "--set parallel.ps.backup_workers=1";
  CommandResult a = run_command("env MESHTRAIN_TEST_SLOWDOWN=3@1 " + meshrun(3, "--ps-servers 1") +
                                train_args(out, 12, 4, flags));
  ASSERT_EQ(a.status, 0) << a.output;
  const nlohmann::json rep = server_report(out, 0);
  ASSERT_TRUE(rep.is_object()) << a.output;
  EXPECT_GT(rep["dropped"].get<int64_t>(), 0) << rep.dump();
  EXPECT_EQ(rep["steps"], 12) << rep.dump();
  // Complete: a worker whose gradient of the step had been dropped would never have written its
  // part, and rank 0 would not have committed the step.
  for (int64_t step : {4, 8, 12}) {
    EXPECT_TRUE(fs::exists(out / "checkpoints" / ("step_" + std::to_string(step)))) << step;
    EXPECT_TRUE(fs::exists(out / "checkpoints" / "param_servers" / "server0" /
                           ("step_" + std::to_string(step) + ".safetensors")))
        << step;
  }
  CommandResult b = run_command("env MESHTRAIN_TEST_SLOWDOWN=3@1 " + meshrun(3, "--ps-servers 1") +
                                train_args(out, 16, 4, flags));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("(step 12 of 16)"), std::string::npos) << b.output;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "step_16")) << b.output;
}

TEST_F(ParamServerRun, ServersCheckpointBesideTheWorkersAndAResumedRunIsBitwiseTheSame) {
  const fs::path whole = dir_ / "whole", resumed = dir_ / "resumed";
  CommandResult a = run_command(meshrun(3, "--ps-servers 1") + train_args(whole, 12, 4));
  ASSERT_EQ(a.status, 0) << a.output;
  CommandResult b = run_command(meshrun(3, "--ps-servers 1") + train_args(resumed, 8, 4));
  ASSERT_EQ(b.status, 0) << b.output;
  // Each server's state of a checkpointed step sits beside the workers' step directory.
  const fs::path servers = resumed / "checkpoints" / "param_servers" / "server0";
  EXPECT_TRUE(fs::exists(servers / "step_4.safetensors"));
  EXPECT_TRUE(fs::exists(servers / "step_8.safetensors"));
  EXPECT_TRUE(fs::exists(resumed / "checkpoints" / "step_8"));
  CommandResult c = run_command(meshrun(3, "--ps-servers 1") + train_args(resumed, 12, 4));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("(step 8 of 12)"), std::string::npos) << c.output;
  // The servers took their parameters and optimizer state of step 8: the steps after it and
  // the final weights are the uninterrupted run's bits.
  const auto lw = losses(whole), lr = losses(resumed);
  for (int64_t s = 9; s <= 12; ++s) EXPECT_EQ(lw.at(s), lr.at(s)) << "step " << s;
  bool same = false;
  EXPECT_EQ(weights_difference(whole, resumed, &same), 0.0f);
  EXPECT_TRUE(same);
  // Without the servers' files the run refuses to start from the workers' checkpoint alone.
  fs::remove_all(resumed / "checkpoints" / "param_servers");
  CommandResult d = run_command(meshrun(3, "--ps-servers 1") + train_args(resumed, 16, 4));
  EXPECT_NE(d.status, 0) << d.output;
  EXPECT_NE(d.output.find("the workers resume from step 12 but there is no"), std::string::npos)
      << d.output;
}

TEST_F(ParamServerRun, AKilledServerIsRestartedAndResumesFromItsCheckpoint) {
  const fs::path whole = dir_ / "whole", killed = dir_ / "killed";
  CommandResult a = run_command(meshrun(3, "--ps-servers 1") + train_args(whole, 40, 10));
  ASSERT_EQ(a.status, 0) << a.output;
  // Every worker takes three times as long per step, so the kill lands mid-run; rank 2 serves.
  std::string output;
  kill_mid_run("env MESHTRAIN_TEST_SLOWDOWN=3 " + meshrun(3, "--ps-servers 1 --max-restarts 1") +
                   train_args(killed, 40, 10),
               killed, 2, output);
  if (HasFatalFailure()) return;
  bool same = false;
  EXPECT_EQ(weights_difference(whole, killed, &same), 0.0f) << output;
  EXPECT_TRUE(same);
}

// SIGTERM to meshrun (a scheduler stopping the job) reaches every rank: the workers agree on a
// last step and checkpoint it, the server saves its range with them and serves until their
// "done" pushes, so every process ends within meshrun's grace period (5 s here; past it meshrun
// kills) without a worker failing on a vanished server, and the rerun resumes from that step.
TEST_F(ParamServerRun, SigtermStopsWorkersAndServerAtOneCheckpointAndTheRerunResumes) {
  const fs::path out = dir_ / "stopped";
  const std::string log = (dir_ / "run.log").string();
  // Far too long to finish: killed with the test if the SIGTERM does not stop it.
  ChildProcess job = spawn(meshrun(3, "--ps-servers 1") + train_args(out, 1000000, 100000), log);
  ASSERT_TRUE(job.started());
  ASSERT_TRUE(wait_until([&] { return losses(out).size() >= 3; }, std::chrono::seconds(60)))
      << file_bytes(log);
  job.signal(SIGTERM);
  const std::optional<int> status = job.wait_for(std::chrono::seconds(60));
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "still running 60 s after SIGTERM\n" << output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("preempted by SIGTERM at step ([0-9]+)")))
      << output;
  const int64_t stopped = std::stoll(m[1]);
  EXPECT_EQ(last_step(out), stopped);
  // The server returned from its loop (its line and report), nobody was killed at the end of the
  // grace period, and no worker lost its server.
  EXPECT_NE(output.find("parameter server 0: " + std::to_string(stopped) + " steps"),
            std::string::npos)
      << output;
  EXPECT_EQ(server_report(out, 0)["steps"], stopped) << output;
  EXPECT_EQ(output.find("has exited"), std::string::npos) << output;
  EXPECT_EQ(output.find("grace period"), std::string::npos) << output;
  const fs::path ckpt = out / "checkpoints";
  EXPECT_TRUE(fs::exists(ckpt / ("step_" + std::to_string(stopped)))) << output;
  EXPECT_TRUE(fs::exists(ckpt / "param_servers" / "server0" /
                         ("step_" + std::to_string(stopped) + ".safetensors")))
      << output;

  CommandResult again =
      run_command(meshrun(3, "--ps-servers 1") + train_args(out, stopped + 2, 100000));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("(step " + std::to_string(stopped) + " of " +
                              std::to_string(stopped + 2) + ")"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(last_step(out), stopped + 2);
}

// The "version" (updates applied) a server wrote into its checkpoint of `step`.
int64_t saved_version(const fs::path& out, int64_t step, int server = 0) {
  std::ifstream in(out / "checkpoints" / "param_servers" / ("server" + std::to_string(server)) /
                       ("step_" + std::to_string(step) + ".safetensors"),
                   std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  std::string header(static_cast<size_t>(n), '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
  if (!j.is_object() || !j.contains("__metadata__")) return -1;
  return std::stoll(j["__metadata__"]["version"].get<std::string>());
}

// Asynchronous workers are at steps of their own, so a checkpoint step is a cut: the server
// holds every worker's reply of that step until all of them were applied, saves, and only then
// lets anyone on. With worker 1 three times slower, worker 0 would otherwise have pushed later
// steps before the save; the saved update counts show it did not. A rerun resumes from the
// cut: the servers load their state (the counts go on from it) and the workers their step.
TEST_F(ParamServerRun, AsyncAndSspCheckpointsAreCutsAndAResumedRunGoesOnFromThem) {
  for (const std::string mode : {"async", "ssp"}) {
    SCOPED_TRACE(mode);
    const fs::path out = dir_ / mode;
    const std::string flags =
        "--set parallel.ps.consistency=" + mode + " --set parallel.ps.staleness=2";
    CommandResult a = run_command("env MESHTRAIN_TEST_SLOWDOWN=3@1 " +
                                  meshrun(3, "--ps-servers 1") + train_args(out, 8, 4, flags));
    ASSERT_EQ(a.status, 0) << a.output;
    const fs::path ckpt = out / "checkpoints";
    for (int64_t step : {4, 8}) {
      EXPECT_TRUE(fs::exists(ckpt / ("step_" + std::to_string(step)))) << a.output;
      // Two workers' gradients of every step up to it, none of a later step.
      EXPECT_EQ(saved_version(out, step), 2 * step) << "step " << step << "\n" << a.output;
    }
    EXPECT_FALSE(fs::exists(ckpt / "step_5")) << a.output;
    CommandResult b = run_command(meshrun(3, "--ps-servers 1") + train_args(out, 12, 4, flags));
    ASSERT_EQ(b.status, 0) << b.output;
    EXPECT_NE(b.output.find("(step 8 of 12)"), std::string::npos) << b.output;
    const nlohmann::json rep = server_report(out, 0);
    ASSERT_TRUE(rep.is_object()) << b.output;
    EXPECT_EQ(rep["applied"], 8) << rep.dump();
    EXPECT_EQ(rep["worker_clock"], nlohmann::json({12, 12})) << rep.dump();
    if (mode == "ssp") {
      EXPECT_LE(rep["max_staleness"].get<int>(), 2) << rep.dump();
    }
    // The server went on from its saved state: 16 updates then, 24 after the rerun's 8.
    EXPECT_EQ(saved_version(out, 12), 24) << b.output;
    EXPECT_TRUE(std::isfinite(losses(out).rbegin()->second));
  }
}

// A killed server of an asynchronous job fails its workers' links too: meshrun replaces none of
// them alone (a server is not replaceable, and it failed with them) but restarts the job, which
// resumes from the last cut.
TEST_F(ParamServerRun, AKilledAsyncServerRestartsTheWholeJobFromTheLastCut) {
  const fs::path out = dir_ / "async_server_killed";
  std::string output;
  kill_mid_run("env MESHTRAIN_TEST_SLOWDOWN=3 " + meshrun(3, "--ps-servers 1 --max-restarts 1") +
                   train_args(out, 40, 10, "--set parallel.ps.consistency=async"),
               out, 2, output);
  if (HasFatalFailure()) return;
  EXPECT_EQ(output.find("replacing it alone"), std::string::npos) << output;
  EXPECT_EQ(saved_version(out, 40), 80) << output;
}

// A killed asynchronous worker is replaced alone: meshrun starts another process for its rank,
// which joins the servers on new links with their parameters and its predecessor's last applied
// step, while the other worker and the server go on in the same processes. No step of either
// worker is lost or applied twice (2 x 40 updates in the cut of step 40), and the job ends with
// status 0 without a restart.
TEST_F(ParamServerRun, AKilledAsyncWorkerIsReplacedAloneWhileTheOthersGoOn) {
  // Rank 1, and rank 0, which also writes the logs, the metrics and the run directory's lock.
  for (const int victim : {1, 0}) {
    SCOPED_TRACE(victim);
    replace_killed_worker(dir_ / ("async_replaced" + std::to_string(victim)), victim);
    if (HasFatalFailure()) return;
  }
}

void ParamServerRun::replace_killed_worker(const fs::path& out, int victim, int servers,
                                           const std::string& consistency) {
  const std::string log = (out.parent_path() / (out.filename().string() + ".log")).string();
  const int ranks = 2 + servers;
  ChildProcess job =
      spawn("env MESHTRAIN_TEST_SLOWDOWN=3 " +
                meshrun(ranks, "--ps-servers " + std::to_string(servers) + " --max-restarts 1") +
                train_args(out, 40, 10, "--set parallel.ps.consistency=" + consistency),
            log);
  ASSERT_TRUE(job.started());
  const fs::path ckpt = out / "checkpoints";
  ASSERT_TRUE(wait_until(
      [&] {
        return fs::exists(ckpt / "param_servers" / "server0" / "step_10.safetensors") &&
               fs::exists(ckpt / "step_10") && last_step(out) >= 12;
      },
      std::chrono::seconds(90)))
      << file_bytes(log);
  const std::vector<pid_t> before = meshrun_workers(job.pid());
  ASSERT_EQ(before.size(), static_cast<size_t>(ranks)) << file_bytes(log);
  ASSERT_EQ(::kill(before[static_cast<size_t>(victim)], SIGKILL), 0);
  // The replacement runs beside the processes that were there before.
  std::vector<pid_t> after;
  ASSERT_TRUE(wait_until(
      [&] {
        after = meshrun_workers(job.pid());
        return after.size() == static_cast<size_t>(ranks) &&
               std::find(after.begin(), after.end(), before[static_cast<size_t>(victim)]) ==
                   after.end();
      },
      std::chrono::seconds(60)))
      << file_bytes(log);
  for (size_t other = 0; other < before.size(); ++other) {
    if (other == static_cast<size_t>(victim)) continue;
    EXPECT_NE(std::find(after.begin(), after.end(), before[other]), after.end());
  }
  const std::optional<int> status = job.wait_for(std::chrono::seconds(150));
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << output;
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
  EXPECT_NE(output.find("replacing it alone, the other ranks go on"), std::string::npos) << output;
  EXPECT_NE(output.find("rank " + std::to_string(victim) +
                        " replaces a worker that failed: joined the running job after its step"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("restart 1 of 1"), std::string::npos) << output;
  EXPECT_EQ(last_step(out), 40) << output;
  for (int server = 0; server < servers; ++server) {
    SCOPED_TRACE(server);
    // With several servers a step the victim pushed to some of them only is trained again by
    // its replacement (applied twice there); with one, every step exactly once.
    const int64_t version = saved_version(out, 40, server);
    EXPECT_GE(version, 80) << output;
    EXPECT_LE(version, servers > 1 ? 81 : 80) << output;
    const nlohmann::json report = server_report(out, server);
    EXPECT_EQ(report.value("lost", -1), 1) << report.dump();
    EXPECT_EQ(report["worker_clock"], nlohmann::json({40, 40})) << report.dump();
    // The bound holds through the replacement: the other worker waited for it.
    if (consistency == "ssp") {
      EXPECT_LE(report["max_staleness"].get<int>(), 3) << report.dump();
    }
  }
}

// The same with bounded staleness (3, the default) and two servers, each with its own link to the
// replacement: it continues after the smaller of the two servers' clocks of its predecessor, and
// no gradient is applied staler than the bound, before, during or after the replacement.
TEST_F(ParamServerRun, AKilledSspWorkerOfTwoServersIsReplacedAlone) {
  replace_killed_worker(dir_ / "ssp_replaced", 1, 2, "ssp");
}

// SIGTERM reaches asynchronous workers at steps of their own: none saves a step another did not
// reach (nothing waits for a missing part), the job ends, and the rerun resumes from the newest
// checkpoint every worker and the server wrote.
TEST_F(ParamServerRun, SigtermToAsyncWorkersEndsTheJobAndTheRerunResumesFromTheLastCut) {
  const fs::path out = dir_ / "async_stopped";
  const std::string log = (dir_ / "run.log").string();
  const std::string flags = "--set parallel.ps.consistency=async";
  ChildProcess job = spawn("env MESHTRAIN_TEST_SLOWDOWN=2@1 " + meshrun(3, "--ps-servers 1") +
                               train_args(out, 1000000, 3, flags),
                           log);
  ASSERT_TRUE(job.started());
  const fs::path ckpt = out / "checkpoints";
  ASSERT_TRUE(wait_until([&] { return fs::exists(ckpt / "step_6"); }, std::chrono::seconds(90)))
      << file_bytes(log);
  job.signal(SIGTERM);
  const std::optional<int> status = job.wait_for(std::chrono::seconds(60));
  const std::string output = file_bytes(log);
  ASSERT_TRUE(status.has_value()) << "still running 60 s after SIGTERM\n" << output;
  EXPECT_NE(output.find("preempted by SIGTERM at step"), std::string::npos) << output;
  EXPECT_EQ(output.find("grace period"), std::string::npos) << output;
  std::smatch m;
  const std::string latest = file_bytes(ckpt / "latest");
  ASSERT_TRUE(std::regex_search(latest, m, std::regex("step_([0-9]+)"))) << latest;
  const int64_t resumable = std::stoll(m[1]);
  EXPECT_EQ(resumable % 3, 0) << latest;
  EXPECT_EQ(saved_version(out, resumable), 2 * resumable) << output;
  CommandResult again =
      run_command(meshrun(3, "--ps-servers 1") + train_args(out, resumable + 2, 3, flags));
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("(step " + std::to_string(resumable) + " of " +
                              std::to_string(resumable + 2) + ")"),
            std::string::npos)
      << again.output;
}

TEST_F(ParamServerRun, WhatCannotRunIsOneLineAndExitTwo) {
  const struct {
    std::string flags, extra, expected;
    int nproc = 2;
  } cases[] = {
      {"--ps-servers 2", "", "--ps-servers 2 leaves no worker among the 2 ranks"},
      {"", "--set parallel.mode=parameter_server --set parallel.ps.servers=2",
       "parallel.ps.servers = 2 leaves no worker among the 2 ranks"},
      {"--ps-servers 1",
       "--set ckpt.interval=0 --set ckpt.interval_minutes=5 --set parallel.ps.consistency=async",
       "parallel.mode = \"parameter_server\" and ckpt.interval_minutes = 5 cannot be combined: "
       "asynchronous workers checkpoint at steps each reaches by its own count"},
      {"--ps-servers 1",
       "--set ckpt.interval=0 --set ckpt.interval_minutes=5 --set parallel.ps.backup_workers=1",
       "parallel.mode = \"parameter_server\" and ckpt.interval_minutes = 5 cannot be combined: "
       "with backup workers a checkpoint is a step that waits for every worker",
       3},
  };
  for (const auto& c : cases) {
    CommandResult r =
        run_command(meshrun(c.nproc, c.flags) + train_args(dir_ / "bad", 2, 0, c.extra));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
}

}  // namespace
