// Writes checkpoints without stopping training for the I/O. save() runs on the training thread
// and only queues this rank's tensors; a background thread copies them into host memory (a
// snapshot), writes the rank's shard files into ROOT/step_<N>.tmp/, meets the other ranks at a
// barrier, and rank 0 merges every rank's record into manifest.json, fsyncs, renames the
// directory to step_<N>/, points `latest` at it and applies retention.
//
// When the snapshot is taken is the caller's choice (WriterOptions::deferred_snapshot): save()
// either waits for the copy, or returns at once and the caller calls wait_snapshot() before it
// next changes the tensors. The trainer does the latter: the copy runs during the next step's
// forward and backward, which only read the parameters and the optimizer state, and the
// optimizer step waits for it, so the training thread is blocked for neither copy nor I/O.
//
// At most one save is in flight: a save() that finds the previous one still writing waits for
// it (and logs how long), so extra memory stays at one snapshot; its buffer is kept for the
// next save, as allocating and faulting in fresh pages every time costs as much as the copy. A
// snapshot larger than max_snapshot_bytes is not taken; that save is written synchronously
// from the live tensors. A failure on the writer thread is reported by the next save() or
// wait() as an IoError naming the file (and says ENOSPC when the disk is full); a failed save
// never moves `latest`, and rank 0 removes its step_<N>.tmp/ directory so that the space is
// free for the next attempt.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/ckpt/retention.h"
#include "meshtrain/util/fault_plan.h"

namespace meshtrain::ckpt {

struct WriterOptions {
  std::string root;  // the checkpoint root, shared by all ranks (created when missing)
  int64_t rank = 0;
  WorldLayout layout;  // layout.world_size ranks take part in every save
  // Called by every rank once its own files are durable (on the writer thread, also when its
  // write failed, so that no peer waits forever); rank 0 writes the manifest only after it.
  // Plug in a store barrier or a process group used only for checkpoints. Empty: no-op, right
  // for a single process.
  std::function<void(int64_t step)> barrier;
  uint64_t max_snapshot_bytes = uint64_t{8} << 30;
  bool async = true;  // false: every save is written on the calling thread
  // false: save() returns once the snapshot is taken, and the caller may change its tensors at
  // once. true: save() returns without waiting for the copy, and the caller must call
  // wait_snapshot() before it changes any tensor it passed to save().
  bool deferred_snapshot = false;
  RetentionPolicy retention;
  // Test hook: runs on the writing thread before each file is written (a slow disk, a fault).
  std::function<void(const std::string& path)> before_file_write;
  // Test hook: runs on the writer's thread before the snapshot is copied (a slow copy).
  std::function<void()> before_snapshot;
  // Injected faults (a stalled write, a slow snapshot copy), for the crash tests; none by default.
  FaultPlan faults;
  // Called once per save when it is over, on the thread that wrote it, outside the writer's
  // lock: the step, the seconds from the start of the write (or of the snapshot) to its end,
  // this rank's bytes, and whether it succeeded (for rank 0: committed). Feeds the job's
  // checkpoint metrics.
  std::function<void(int64_t step, double seconds, uint64_t bytes, bool ok)> on_done;
};

struct SaveStats {
  int64_t step = 0;
  double wait_s = 0;      // waiting for the previous save to finish
  double snapshot_s = 0;  // waiting for the snapshot copy (0 with deferred_snapshot)
  uint64_t snapshot_bytes = 0;
  bool async = false;  // false when written synchronously (async off or over the budget)
};

// A rank whose process died after it was told to save `step` and before it wrote its part (an
// asynchronous parameter-server worker, replaced while the job went on): the process that
// replaced it marks the part absent, so that rank 0 leaves the step uncommitted with a warning
// instead of failing, and the previous checkpoint stays the newest. Nothing is marked where the
// step is committed already.
void mark_rank_absent(const std::string& root, int64_t step, int64_t rank, const std::string& why);

class CheckpointWriter {
 public:
  explicit CheckpointWriter(WriterOptions options);
  // Finishes an in-flight save; a failure is logged (destructors do not throw).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves this rank's part of step `step`. train_state (a JSON object: sampler position, RNG
  // states, scheduler, loss scaler, comm-hook state, ...) is stored in the manifest from rank
  // 0's call; its integer "epoch", when present, is also the manifest's epoch. Throws the
  // previous save's failure (IoError) instead of starting this one. mark_best (every rank
  // passes the same): once committed and `latest` points at it, `best` is pointed at it too; a
  // crash in between leaves `best` at the previous best step, which retention has kept.
  SaveStats save(int64_t step, const RankShards& shards,
                 const nlohmann::json& train_state = nlohmann::json::object(),
                 bool mark_best = false);
  // Blocks until nothing is in flight; throws a pending failure.
  void wait();
  // Blocks until the last save's snapshot is taken (at once when there is none in flight), so
  // that the caller may change the tensors it passed to save(); returns the seconds it waited.
  // A failed copy is reported later, like a failed write.
  double wait_snapshot();

  bool in_flight() const;
  // The newest step this writer saved successfully (for rank 0: committed), -1 before any.
  int64_t last_saved_step() const;
  const WriterOptions& options() const { return options_; }

 private:
  struct Job;

  void run_thread();
  // Copies the job's tensors into snapshot_buffer_ (writer thread).
  void take_snapshot(Job& job);
  void write_job(const Job& job);  // any thread; throws IoError naming the file
  void write_rank_files(const Job& job, const std::string& tmp_dir);
  // rank 0; false where a rank's part was marked absent (nothing committed)
  bool commit(const Job& job, const std::string& tmp_dir);
  void rethrow_pending_locked(std::unique_lock<std::mutex>& lock);

  WriterOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Job> job_;   // queued or being written
  bool snapshot_done_ = true;  // false from save() until job_'s snapshot is taken
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t last_saved_step_ = -1;
  std::unique_ptr<std::byte[]> snapshot_buffer_;  // writer thread only
  uint64_t snapshot_capacity_ = 0;
  std::thread thread_;
};

}  // namespace meshtrain::ckpt
