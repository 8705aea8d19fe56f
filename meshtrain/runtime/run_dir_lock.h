// One job per run directory. Two jobs writing one train.out_dir corrupt each other (one resumes
// from the other's half-written checkpoints, job_state.json renames collide, metrics.jsonl gets
// torn lines), so a job's rank 0 holds a lock file in it, "<out_dir>/meshtrain.lock", for the
// whole run, and every rank of another job is refused before it touches the directory.
//
// The file holds the holder's host, pid, start time and job id (JSON). It is made complete under
// a private name and then hard-linked to the lock's name: link() fails when the name exists and
// is atomic on local filesystems and on NFS, Lustre, GPFS and CephFS, which is what lets ranks on
// several hosts share one out_dir on a shared filesystem (flock() is not reliable there).
//
// A lock whose holder is dead is taken over:
//   - same host: the pid no longer runs, or runs another program (the pid's start time differs),
//     or the host rebooted since (another boot id);
//   - another host: the holder refreshes the file's mtime every `heartbeat` (10 s); a file not
//     refreshed for `stale_after` (60 s) is dead. Its age is measured against the mtime of a file
//     this process has just written to the same directory, so both times come from the same
//     clock (the file server's) and the hosts' clocks need not agree.
//   - the same job id: an earlier attempt of this job (a restart), whose rank 0 may have moved
//     to another host.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "meshtrain/comm/store.h"

namespace meshtrain::runtime {

struct RunDirLockOptions {
  // Ranks of one job and its restarts share this id; empty: this process alone.
  std::string job_id;
  std::string host;  // empty: this machine's host name
  std::chrono::milliseconds heartbeat{10'000};
  std::chrono::milliseconds stale_after{60'000};
};

// Who holds a run directory, as its lock file says.
struct RunDirHolder {
  std::string host;
  int64_t pid = 0;
  std::string start_time;  // UTC, ISO 8601
  std::string job_id;
  std::string boot_id;     // the host's boot (same-host liveness)
  uint64_t pid_start = 0;  // the process's start in clock ticks after boot (pid reuse)
};

class RunDirLock {
 public:
  static constexpr const char* kFileName = "meshtrain.lock";

  // Creates `out_dir` if needed and takes its lock, taking over a dead holder's. Throws
  // ValueError, one line naming the live holder, when another job holds it.
  RunDirLock(const std::filesystem::path& out_dir, RunDirLockOptions options);
  // Stops the heartbeat and removes the file if it is still this process's.
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  void heartbeat_loop();
  bool still_ours() const;

  std::filesystem::path path_;
  std::string content_;
  RunDirLockOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

// The lock file's holder; nullopt when there is none or it cannot be parsed.
std::optional<RunDirHolder> read_run_dir_holder(const std::filesystem::path& lock_file);

// The job's lock: rank 0 takes it and tells the other ranks through the store whether it did,
// so that every rank of a refused job fails with the same line (ValueError) and none waits on a
// collective its rank 0 will never join. Returns null on ranks other than 0.
std::unique_ptr<RunDirLock> lock_run_dir(const std::string& out_dir, const std::string& job_id,
                                         int rank, comm::Store* store);

}  // namespace meshtrain::runtime
