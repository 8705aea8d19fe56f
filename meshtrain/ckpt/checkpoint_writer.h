// Writes checkpoints without stopping training for the I/O. save() runs on the training thread
// and only copies this rank's tensors into host memory (a snapshot); a background thread then
// writes the rank's shard files into ROOT/step_<N>.tmp/, meets the other ranks at a barrier,
// and rank 0 merges every rank's record into manifest.json, fsyncs, renames the directory to
// step_<N>/, points `latest` at it and applies retention.
//
// At most one save is in flight: a save() that finds the previous one still writing waits for
// it (and logs how long), so extra memory stays at one snapshot. A snapshot larger than
// max_snapshot_bytes is not taken; that save is written synchronously from the live tensors.
// A failure on the writer thread is reported by the next save() or wait() as an IoError naming
// the file (and says ENOSPC when the disk is full); a failed save never moves `latest`, and rank
// 0 removes its step_<N>.tmp/ directory so that the space is free for the next attempt.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/ckpt/retention.h"

namespace meshtrain::ckpt {

struct WriterOptions {
  std::string root;  // the checkpoint root, shared by all ranks (created when missing)
  int64_t rank = 0;
  WorldLayout layout;  // layout.world_size ranks take part in every save
  // Called by every rank once its own files are durable (on the writer thread, also when its
  // write failed, so that no peer waits forever); rank 0 writes the manifest only after it.
  // Plug in a store barrier or a process group used only for checkpoints. Empty: no-op, right
  // for a single process.
  std::function<void()> barrier;
  uint64_t max_snapshot_bytes = uint64_t{8} << 30;
  bool async = true;  // false: every save is written on the calling thread
  RetentionPolicy retention;
  // Test hook: runs on the writing thread before each file is written (a slow disk, a fault).
  std::function<void(const std::string& path)> before_file_write;
};

struct SaveStats {
  int64_t step = 0;
  double wait_s = 0;      // waiting for the previous save to finish
  double snapshot_s = 0;  // copying tensors to host memory
  uint64_t snapshot_bytes = 0;
  bool async = false;  // false when written synchronously (async off or over the budget)
};

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
  // previous save's failure (IoError) instead of starting this one.
  SaveStats save(int64_t step, const RankShards& shards,
                 const nlohmann::json& train_state = nlohmann::json::object());
  // Blocks until nothing is in flight; throws a pending failure.
  void wait();

  bool in_flight() const;
  // The newest step this writer saved successfully (for rank 0: committed), -1 before any.
  int64_t last_saved_step() const;
  const WriterOptions& options() const { return options_; }

 private:
  struct Job {
    int64_t step = 0;
    RankShards shards;
    nlohmann::json train_state;
  };

  void run_thread();
  void write_job(const Job& job);  // any thread; throws IoError naming the file
  void write_rank_files(const Job& job, const std::string& tmp_dir);
  void commit(const Job& job, const std::string& tmp_dir);  // rank 0
  void rethrow_pending_locked(std::unique_lock<std::mutex>& lock);

  WriterOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;  // queued or being written
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t last_saved_step_ = -1;
  std::thread thread_;
};

}  // namespace meshtrain::ckpt
