// A real one-node Slurm cluster on loopback for tests: munged, slurmctld and slurmd (Debian's
// packages) started as children of the test with a configuration, key, state and sockets in a
// directory of their own, so nothing of the machine's own Slurm or munge is used or touched.
// The destructor cancels what is left of the jobs and stops and reaps every daemon, also when
// the test failed. Needs root (slurmd runs jobs as their user); unavailable_reason() says why a
// cluster could not be made.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/socket.h"
#include "tests/support/run_command.h"
#include "tests/support/wait.h"

namespace meshtrain::testing {

class SlurmCluster {
 public:
  // `cpus` is what the node offers (the tasks of a job must fit). The cluster's files live in a
  // short directory of its own: slurmstepd's socket paths must fit in 108 bytes.
  explicit SlurmCluster(int cpus) {
    namespace fs = std::filesystem;
    if (::geteuid() != 0) {
      reason_ = "a Slurm cluster needs root (slurmd starts jobs as their user)";
      return;
    }
    for (const char* tool : {"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol"}) {
      if (run_command(std::string("command -v ") + tool).status != 0) {
        reason_ = std::string(tool) + " is not installed (Debian: munge, slurmctld, slurmd, " +
                  "slurm-client; see scripts/install-deps.sh)";
        return;
      }
    }
    std::string tmpl = (fs::temp_directory_path() / "mtslurm.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      reason_ = "cannot make a directory under " + fs::temp_directory_path().string();
      return;
    }
    dir_ = tmpl;
    fs::create_directories(dir_ / "state");
    fs::create_directories(dir_ / "spool");
    const auto key = run_command("mungekey -c -k " + (dir_ / "munge.key").string());
    if (key.status != 0) {
      reason_ = "mungekey failed: " + key.output;
      return;
    }
    const std::string sock = (dir_ / "munge.sock").string();
    // Two free ports for the daemons (taken as the kernel hands them out, then released).
    const uint16_t ctld_port = comm::Socket::listen("127.0.0.1", 0).local_port();
    const uint16_t slurmd_port = comm::Socket::listen("127.0.0.1", 0).local_port();
    conf_ = dir_ / "slurm.conf";
    std::ofstream c(conf_);
    c << "ClusterName=meshtrain-test\n"
      << "SlurmctldHost=localhost(127.0.0.1)\n"
      << "SlurmctldPort=" << ctld_port << "\nSlurmdPort=" << slurmd_port << "\n"
      << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << sock << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "StateSaveLocation=" << (dir_ / "state").string() << "\n"
      << "SlurmdSpoolDir=" << (dir_ / "spool").string() << "\n"
      << "SlurmctldPidFile=" << (dir_ / "slurmctld.pid").string() << "\n"
      << "SlurmdPidFile=" << (dir_ / "slurmd.pid").string() << "\n"
      << "SlurmctldLogFile=" << (dir_ / "slurmctld.log").string() << "\n"
      << "SlurmdLogFile=" << (dir_ / "slurmd.log").string()
      << "\n"
      // No cgroups in a container or CI runner: track processes by parentage.
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
      << "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
      << "ReturnToService=2\nKillWait=20\nMinJobAge=3600\nSlurmdTimeout=60\n"
      << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=" << cpus << " State=UNKNOWN\n"
      << "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP "
         "OverSubscribe=YES\n";
    c.close();
    ::setenv("SLURM_CONF", conf_.c_str(), 1);  // for sbatch, scontrol, squeue and srun
    daemons_.push_back(spawn(
        {"munged", "-F", "-f", "--socket=" + sock, "--key-file=" + (dir_ / "munge.key").string(),
         "--log-file=" + (dir_ / "munged.log").string(),
         "--pid-file=" + (dir_ / "munged.pid").string(),
         "--seed-file=" + (dir_ / "munged.seed").string()},
        "munged.out"));
    if (!wait_for([&] { return std::filesystem::exists(sock); }, std::chrono::seconds(20))) {
      reason_ = "munged did not create its socket:\n" + text("munged.out");
      return;
    }
    daemons_.push_back(spawn({"slurmctld", "-D", "-i", "-f", conf_.string()}, "slurmctld.out"));
    daemons_.push_back(
        spawn({"slurmd", "-D", "-N", "localhost", "-f", conf_.string()}, "slurmd.out"));
    const bool idle = wait_for(
        [&] {
          const auto r = run_command("sinfo -h -n localhost -o %T");
          return r.status == 0 && r.output.find("idle") != std::string::npos;
        },
        std::chrono::seconds(60));
    if (!idle) reason_ = "the node did not come up idle:\n" + logs();
  }

  ~SlurmCluster() {
    // Jobs first (slurmstepd ends each one's processes), then the daemons in reverse order.
    if (!daemons_.empty()) {
      run_command("scancel --full --signal=KILL --partition=test");
      wait_for([] { return run_command("squeue -h -t R,CG").output.empty(); },
               std::chrono::seconds(30));
    }
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) stop(*it);
    ::unsetenv("SLURM_CONF");
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const std::string& unavailable_reason() const { return reason_; }

  // scontrol's JobState of a job ("PENDING", "RUNNING", "COMPLETED", ...), "" when unknown.
  static std::string job_state(const std::string& id) {
    const auto r = run_command("scontrol show job " + id);
    const auto at = r.output.find("JobState=");
    if (at == std::string::npos) return "";
    const auto end = r.output.find_first_of(" \n", at);
    return r.output.substr(at + 9, end - at - 9);
  }
  // True once a job reached a state it does not leave by itself (COMPLETED, FAILED, ...).
  static bool job_ended(const std::string& id) {
    const std::string st = job_state(id);
    for (const char* end : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
      if (st == end) return true;
    return false;
  }
  static std::string job_field(const std::string& id, const std::string& key) {
    const auto r = run_command("scontrol show job " + id);
    const auto at = r.output.find(" " + key + "=");
    if (at == std::string::npos) return "";
    const auto end = r.output.find_first_of(" \n", at + 1);
    return r.output.substr(at + key.size() + 2, end - at - key.size() - 2);
  }

  // The daemons' logs, for a failure message.
  std::string logs() const {
    std::string out;
    for (const char* f :
         {"munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"}) {
      const std::string t = text(f);
      out += std::string("---- ") + f + "\n" + (t.size() > 4000 ? t.substr(t.size() - 4000) : t);
    }
    return out;
  }

  template <typename Pred>
  static bool wait_for(Pred pred, std::chrono::milliseconds limit) {
    return wait_until(pred, limit, std::chrono::milliseconds(100));
  }

 private:
  pid_t spawn(std::vector<std::string> argv, const std::string& log) {
    const std::string path = (dir_ / log).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      FILE* f = std::freopen(path.c_str(), "w", stdout);
      if (f != nullptr) ::dup2(::fileno(stdout), 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    return pid;
  }
  static void stop(pid_t pid) {
    ::kill(pid, SIGTERM);
    int status = 0;
    if (!wait_for([&] { return ::waitpid(pid, &status, WNOHANG) == pid; },
                  std::chrono::seconds(15))) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  std::string text(const std::string& name) const {
    std::ifstream in(dir_ / name);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  std::filesystem::path dir_;
  std::filesystem::path conf_;
  std::vector<pid_t> daemons_;
  std::string reason_;
};

}  // namespace meshtrain::testing
