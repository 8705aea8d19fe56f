// Checkpoints on object storage (ckpt.dir = s3://bucket/prefix). Every checkpoint is written
// into a local staging root exactly as a local checkpoint is (ckpt/checkpoint_writer.h); once
// committed there, a CheckpointMirror uploads it in the background while training goes on, and
// fetch_newest() brings the remote newest complete checkpoint into an empty (or older) local root
// before the loader runs. The remote layout mirrors the local one:
//
//   PREFIX/step_<N>/<file>         every file of the step directory; manifest.json goes LAST
//   PREFIX/latest, PREFIX/best     one line naming a step, put after that step's manifest
//
// A remote step is complete when its manifest.json exists, so a process killed in the middle of
// an upload leaves at most data objects of a step that nobody reads (a later upload overwrites
// them, remote retention removes them): the remote newest stays the previous complete
// checkpoint. A downloaded file whose size or xxh3 is not the manifest's is named and the step
// is rejected, and the previous one is tried, as locally.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/ckpt/retention.h"

namespace meshtrain::ckpt {

struct RemoteStep {
  int64_t step = 0;
  double unix_s = 0;  // when its manifest was written (the server's LastModified), 0 unknown
};

// The complete steps under uri (ascending), from one listing.
std::vector<RemoteStep> remote_complete_steps(ObjectStore& store, const ObjectUri& uri);

// The step a remote pointer (`latest`, `best`) names, or nothing.
std::optional<int64_t> read_remote_pointer(ObjectStore& store, const ObjectUri& uri,
                                           const std::string& pointer);

// Downloads step `step` into local_root/step_<N> (through a ".tmp" directory renamed when every
// file matched the manifest's size and xxh3) and returns that directory. IoError naming the
// object (s3://...) that is missing or corrupt; ObjectStoreError when the server fails.
std::string fetch_step(ObjectStore& store, const ObjectUri& uri, int64_t step,
                       const std::string& local_root, int parallel = 4);

struct FetchResult {
  std::optional<int64_t> step;          // the step now in the local root; nothing: none fetched
  std::vector<std::string> rejections;  // one line per remote step that failed
};

// Fetches the newest complete remote step newer than every complete local one (and at most
// max_step when >= 0), falling back past steps that fail (each named in `rejections`); points
// the local `latest` at it. Also fetches the remote `best` step when the local root lacks it.
// Throws ObjectStoreError when the server cannot be reached or refuses.
FetchResult fetch_newest(ObjectStore& store, const ObjectUri& uri, const std::string& local_root,
                         int64_t max_step = -1);

// For `meshtrain ckpt` and ckpt.resume_from: s3://b/p (its latest), s3://b/p/latest,
// s3://b/p/best or s3://b/p/step_<N> downloaded under cache_root; returns the local step
// directory. IoError when nothing is there.
std::string materialize_remote_checkpoint(const std::string& uri, const std::string& cache_root);

struct MirrorOptions {
  ObjectUri uri;
  std::string local_root;
  RetentionPolicy retention;  // applied to the remote copy after each upload
  size_t max_queue = 4;       // steps waiting; past it the oldest waiting one is dropped
  double retry_min_s = 1;     // first wait after a failed upload, doubling
  double retry_max_s = 60;    // ... up to this
  int parallel = 4;           // small files uploaded at a time
  std::function<void(const std::string&)> log;
  // Test hook, on the upload thread before each object is put.
  std::function<void(const std::string& key)> before_put;
};

struct MirrorStatus {
  int64_t newest_step = -1;  // newest complete remote checkpoint (-1: none known)
  double newest_unix_s = 0;  // when it was committed locally (or written remotely)
  size_t pending = 0;        // checkpoints waiting for upload (including the one in flight)
  int64_t uploaded = 0;      // checkpoints uploaded by this mirror
  int64_t failures = 0;      // failed upload attempts
  uint64_t bytes = 0;        // bytes uploaded
};

class CheckpointMirror {
 public:
  CheckpointMirror(std::shared_ptr<ObjectStore> store, MirrorOptions options);
  // Stops after the upload in flight (pending ones stay local; the next run uploads the newest).
  ~CheckpointMirror();
  CheckpointMirror(const CheckpointMirror&) = delete;
  CheckpointMirror& operator=(const CheckpointMirror&) = delete;

  // Queues the committed local step for upload; returns at once.
  void enqueue(int64_t step, double committed_unix_s = 0);
  // Records what the remote already holds (at start, from a listing).
  void set_remote_newest(int64_t step, double unix_s);
  // Waits until nothing is pending or `timeout_s` passed; true when all were uploaded.
  bool drain(double timeout_s);
  MirrorStatus status() const;
  // Called after every upload attempt (upload thread).
  void on_status(std::function<void(const MirrorStatus&)> fn);

 private:
  void run();
  void upload(int64_t step);
  void apply_remote_retention(int64_t newest);

  std::shared_ptr<ObjectStore> store_;
  MirrorOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, double>> queue_;  // (step, committed unix time)
  bool busy_ = false;
  bool stop_ = false;
  MirrorStatus status_;
  std::function<void(const MirrorStatus&)> on_status_;
  std::thread thread_;
};

}  // namespace meshtrain::ckpt
