// The checkpoint writer: snapshot and files on a background thread, and the commit protocol (see
// checkpoint_writer.h). Each rank also writes a small record of what it wrote (rank<NNNNN>.json:
// tensors, offsets, file sizes and checksums) so that rank 0 can build the manifest from the
// shared directory after the barrier without another collective.
//
// Files inside step_<N>.tmp/ are written in place, without a temporary name of their own: the
// directory is the unit that becomes visible, by one rename, and only after every file in it
// and the directory itself are fsynced. All shard files of a rank are queued before the first
// fsync so that the disk never waits for the writer.
#include "meshtrain/ckpt/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/fault_plan.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string rank_record_name(int64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank%05lld.json", static_cast<long long>(rank));
  return buf;
}

std::string absent_marker_name(int64_t rank) {
  return rank_record_name(rank) + ".absent";
}

// A small file written in place and fsynced (rank records, the manifest: see the top).
void write_synced_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) MT_THROW(IoError, "cannot create ", path, ": ", std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    MT_THROW(IoError, "cannot ", what, " ", path, ": ", std::strerror(err));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) MT_THROW(IoError, "cannot close ", path, ": ", std::strerror(errno));
}

constexpr uint64_t kSnapshotAlign = 64;  // each tensor on its own cache lines

uint64_t aligned(uint64_t n) {
  return (n + kSnapshotAlign - 1) / kSnapshotAlign * kSnapshotAlign;
}

[[noreturn]] void rethrow_as_io_error(std::exception_ptr e, int64_t step, const std::string& file) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "unknown error";
  }
  // A full disk is the failure operators meet most; name it the way they will search for it.
  const bool full = what.find(std::strerror(ENOSPC)) != std::string::npos;
  MT_THROW(IoError, "checkpoint step ", step, ": writing ", file, " failed: ", what,
           full ? " (ENOSPC: the checkpoint disk is full)" : "");
}

// Test hook for crash tests, not a feature: the fault plan's stall step
// (MESHTRAIN_TEST_CKPT_STALL_AT_STEP=N, fault_plan.h) makes the writer stop for good in the middle
// of step N's checkpoint (after the shard files, before the rank record), on the first attempt of a
// job only, so that a test can kill the process while a checkpoint is provably half written instead
// of hoping a kill lands at the right moment.
void maybe_stall_for_test(const FaultPlan& plan, int64_t step, int64_t rank) {
  if (!plan.ckpt_stall_now(step)) return;
  MT_LOG_WARN("ckpt", "MESHTRAIN_TEST_CKPT_STALL_AT_STEP: rank ", rank,
              " stalls in the middle of writing step ", step);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Test hook for the trainer tests, not a feature: the fault plan's snapshot delay
// (MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS=N) holds
// every snapshot copy back N ms, so that a trainer that changed its state without waiting for
// the copy would save the wrong values reliably instead of once in a while.
void maybe_delay_snapshot_for_test(const FaultPlan& plan) {
  if (const auto delay = plan.ckpt_snapshot_delay; delay.count() > 0)
    std::this_thread::sleep_for(delay);
}

Json read_rank_record(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) MT_THROW(IoError, "no ", path.string(), " (the rank did not finish its shards)");
  if (size > (uint64_t{64} << 20)) MT_THROW(IoError, path.string(), " is larger than 64 MiB");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const Json::exception& e) {
    MT_THROW(IoError, path.string(), " is not valid JSON: ", e.what());
  }
}

}  // namespace

// What the writer thread works from. `shards` keeps the caller's tensors (or host copies of
// CUDA ones) alive; `bytes` says where each tensor's bytes are now: in those tensors until the
// snapshot is taken, in snapshot_buffer_ after.
struct CheckpointWriter::Job {
  int64_t step = 0;
  RankShards shards;
  nlohmann::json train_state;
  std::vector<std::vector<TensorBytes>> bytes;  // per group of `shards`
  bool snapshot_pending = false;
  bool mark_best = false;
  uint64_t nbytes = 0;  // this rank's bytes (the tensors may be released after the snapshot)

  Job(int64_t s, const RankShards& in, const nlohmann::json& state, bool best)
      : step(s), shards(in), train_state(state), mark_best(best), nbytes(in.nbytes()) {
    for (auto& [group, tensors] : shards.groups()) {
      std::vector<TensorBytes>& out = bytes.emplace_back();
      out.reserve(tensors.size());
      for (TensorShard& t : tensors) {
        // A device tensor is copied to the host here, on the caller's thread and stream: that
        // copy is already a snapshot, and device work stays off the writer thread.
        if (!t.data.device().is_cpu()) t.data = t.data.to(Device::cpu());
        out.push_back({t.name, t.data.dtype(), t.data.shape(), t.data.data_ptr(), t.data.nbytes()});
      }
    }
  }
};

CheckpointWriter::CheckpointWriter(WriterOptions options) : options_(std::move(options)) {
  MT_CHECK(!options_.root.empty(), "checkpoint root is empty");
  MT_CHECK(options_.layout.world_size >= 1 && options_.rank >= 0 &&
               options_.rank < options_.layout.world_size,
           "checkpoint rank ", options_.rank, " outside world size ", options_.layout.world_size);
  std::error_code ec;
  fs::create_directories(options_.root, ec);
  if (ec) MT_THROW(IoError, "cannot create checkpoint root ", options_.root, ": ", ec.message());
  if (options_.async) thread_ = std::thread([this] { run_thread(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      MT_LOG_ERROR("ckpt", "last checkpoint save failed: ", e.what());
    }
  }
}

void CheckpointWriter::rethrow_pending_locked(std::unique_lock<std::mutex>&) {
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

SaveStats CheckpointWriter::save(int64_t step, const RankShards& shards,
                                 const nlohmann::json& train_state, bool mark_best) {
  MT_CHECK(step >= 0, "negative checkpoint step ", step);
  MT_CHECK(train_state.is_object(), "checkpoint train_state must be a JSON object");
  SaveStats stats;
  stats.step = step;
  {
    std::unique_lock<std::mutex> lock(mu_);
    rethrow_pending_locked(lock);
    if (job_) {
      const int64_t previous = job_->step;
      const auto t0 = Clock::now();
      cv_.wait(lock, [&] { return !job_; });
      stats.wait_s = seconds_since(t0);
      MT_LOG_INFO("ckpt", "save of step ", step, " waited ", stats.wait_s,
                  " s for the save of step ", previous, " to finish");
    }
    rethrow_pending_locked(lock);
  }
  const uint64_t bytes = shards.nbytes();
  stats.async = options_.async && bytes <= options_.max_snapshot_bytes;
  auto job = std::make_unique<Job>(step, shards, train_state, mark_best);
  if (!stats.async) {
    if (options_.async)
      MT_LOG_WARN("ckpt", "step ", step, ": ", bytes, " bytes exceed the snapshot budget of ",
                  options_.max_snapshot_bytes, "; writing synchronously");
    const auto t0 = Clock::now();
    try {
      write_job(*job);
    } catch (...) {
      if (options_.on_done) options_.on_done(step, seconds_since(t0), bytes, false);
      throw;
    }
    if (options_.on_done) options_.on_done(step, seconds_since(t0), bytes, true);
    std::lock_guard<std::mutex> lock(mu_);
    last_saved_step_ = step;
    return stats;
  }
  job->snapshot_pending = true;
  stats.snapshot_bytes = bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    snapshot_done_ = false;
  }
  cv_.notify_all();
  if (!options_.deferred_snapshot) stats.snapshot_s = wait_snapshot();
  return stats;
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_; });
  rethrow_pending_locked(lock);
}

double CheckpointWriter::wait_snapshot() {
  std::unique_lock<std::mutex> lock(mu_);
  if (snapshot_done_) return 0;
  const auto t0 = Clock::now();
  cv_.wait(lock, [&] { return snapshot_done_; });
  return seconds_since(t0);
}

bool CheckpointWriter::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_ != nullptr;
}

int64_t CheckpointWriter::last_saved_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_saved_step_;
}

void CheckpointWriter::run_thread() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
    if (!job_) return;  // stopping with nothing queued
    // save() never touches job_ while it is set, so it can be used without the lock.
    lock.unlock();
    std::exception_ptr err;
    const auto t0 = Clock::now();
    try {
      take_snapshot(*job_);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    snapshot_done_ = true;
    cv_.notify_all();
    if (!err) {
      lock.unlock();
      try {
        write_job(*job_);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
    }
    const double took = seconds_since(t0);
    if (options_.on_done) {
      const int64_t step = job_->step;
      const uint64_t bytes = job_->nbytes;
      lock.unlock();
      options_.on_done(step, took, bytes, err == nullptr);
      lock.lock();
    }
    if (err) {
      error_ = err;
    } else {
      last_saved_step_ = job_->step;
      MT_LOG_DEBUG("ckpt", "rank ", options_.rank, " wrote step ", job_->step, " in ", took, " s");
    }
    job_.reset();
    cv_.notify_all();
  }
}

void CheckpointWriter::take_snapshot(Job& job) {
  if (!job.snapshot_pending) return;
  if (options_.before_snapshot) options_.before_snapshot();
  maybe_delay_snapshot_for_test(options_.faults);
  uint64_t need = 0;
  for (const auto& group : job.bytes)
    for (const TensorBytes& t : group) need += aligned(t.nbytes);
  if (need > snapshot_capacity_) {
    snapshot_buffer_.reset();
    snapshot_capacity_ = 0;
    snapshot_buffer_ = std::make_unique_for_overwrite<std::byte[]>(need);
    snapshot_capacity_ = need;
  }
  uint64_t offset = 0;
  for (auto& group : job.bytes) {
    for (TensorBytes& t : group) {
      std::byte* dst = snapshot_buffer_.get() + offset;
      if (t.nbytes > 0) std::memcpy(dst, t.data, t.nbytes);
      t.data = dst;
      offset += aligned(t.nbytes);
    }
  }
  job.snapshot_pending = false;
  // The caller's tensors are not needed any more; do not keep them alive until the write ends.
  for (auto& [group, tensors] : job.shards.groups())
    for (TensorShard& t : tensors) t.data = Tensor();
}

void CheckpointWriter::write_job(const Job& job) {
  const fs::path tmp = fs::path(options_.root) / (step_dir_name(job.step) + ".tmp");
  std::exception_ptr err;
  try {
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) MT_THROW(IoError, "cannot create ", tmp.string(), ": ", ec.message());
    write_rank_files(job, tmp.string());
  } catch (...) {
    err = std::current_exception();
  }
  // Every rank reaches the barrier, failed or not, so that no peer waits out its timeout; rank
  // 0 then finds the failed rank's record missing and does not commit.
  if (options_.barrier) options_.barrier(job.step);
  bool skipped = false;
  if (options_.rank == 0 && !err) {
    try {
      skipped = !commit(job, tmp.string());
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (skipped) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return;
  }
  if (!err) return;
  // Every rank has passed the barrier, so nobody writes into the directory any more. Removing
  // it gives the space back (a full disk must not stay full because of a dead checkpoint).
  if (options_.rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (ec)
      MT_LOG_WARN("ckpt", "cannot remove the failed checkpoint ", tmp.string(), ": ", ec.message());
  }
  std::rethrow_exception(err);
}

void CheckpointWriter::write_rank_files(const Job& job, const std::string& tmp_dir) {
  const fs::path dir(tmp_dir);
  const std::string record_name = rank_record_name(options_.rank);
  // A record left by an earlier failed attempt must not vouch for this one.
  std::error_code ec;
  fs::remove(dir / record_name, ec);

  Json tensors = Json::array();
  Json files = Json::array();
  std::string current;
  try {
    std::vector<SafetensorsWriter> written;
    const auto& groups = job.shards.groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& [group, shards] = groups[g];
      const std::vector<TensorBytes>& bytes = job.bytes[g];
      const std::string file = shard_file_name(group, options_.rank);
      current = (dir / file).string();
      if (options_.before_file_write) options_.before_file_write(current);
      for (size_t i = 0; i < shards.size(); ++i) {
        const TensorShard& s = shards[i];
        Json rec = {{"name", s.name},
                    {"group", group},
                    {"dtype", std::string(dtype_name(bytes[i].dtype))},
                    {"shape", bytes[i].shape},
                    {"kind", shard_kind_name(s.kind)},
                    {"offset", s.offset},
                    {"file", file}};
        if (s.kind != ShardKind::replicated) rec["global_shape"] = s.global_shape;
        if (s.kind == ShardKind::dim) {
          rec["dim"] = s.dim;
          rec["blocks"] = s.blocks;
        }
        tensors.push_back(std::move(rec));
      }
      SafetensorsWriter out(current);
      const FileDigest d = out.write(bytes, {{"meshtrain_step", std::to_string(job.step)},
                                             {"meshtrain_rank", std::to_string(options_.rank)},
                                             {"meshtrain_group", group}});
      files.push_back({{"name", file}, {"bytes", d.bytes}, {"xxh3", hash_hex(d.xxh3)}});
      written.push_back(std::move(out));
    }
    for (SafetensorsWriter& out : written) {
      current = out.path();
      out.sync();
    }
    Json record = {{"step", job.step},
                   {"rank", options_.rank},
                   {"world_size", options_.layout.world_size},
                   {"tensors", std::move(tensors)},
                   {"files", std::move(files)}};
    maybe_stall_for_test(options_.faults, job.step, options_.rank);
    current = (dir / record_name).string();
    if (options_.before_file_write) options_.before_file_write(current);
    write_synced_file(current, record.dump());
    // Rank 0 syncs the directory in commit(), after the manifest, which covers its own files.
    if (options_.rank != 0) {
      current = dir.string();
      fsync_dir(current);
    }
  } catch (...) {
    rethrow_as_io_error(std::current_exception(), job.step, current);
  }
}

void mark_rank_absent(const std::string& root, int64_t step, int64_t rank, const std::string& why) {
  const fs::path committed = fs::path(root) / step_dir_name(step);
  if (fs::exists(committed)) return;
  const fs::path tmp = fs::path(root) / (step_dir_name(step) + ".tmp");
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) MT_THROW(IoError, "cannot create ", tmp.string(), ": ", ec.message());
  write_synced_file((tmp / absent_marker_name(rank)).string(), why + "\n");
}

bool CheckpointWriter::commit(const Job& job, const std::string& tmp_dir) {
  const fs::path dir(tmp_dir);
  const fs::path root(options_.root);
  const int64_t world = options_.layout.world_size;
  for (int64_t r = 0; r < world; ++r) {
    if (fs::exists(dir / rank_record_name(r)) || !fs::exists(dir / absent_marker_name(r))) continue;
    MT_LOG_WARN("ckpt", "checkpoint step ", job.step, " is not committed: rank ", r,
                "'s process died before writing its part (it was replaced while the job went "
                "on); the newest checkpoint stays the one before");
    return false;
  }
  std::string current = (dir / kManifestFile).string();
  try {
    Manifest m;
    m.software_version = MESHTRAIN_VERSION;
    m.step = job.step;
    if (job.train_state.contains("epoch") && job.train_state["epoch"].is_number_integer())
      m.epoch = job.train_state["epoch"].get<int64_t>();
    m.world = options_.layout;
    m.train_state = job.train_state;
    std::map<std::string, size_t> index;
    for (int64_t r = 0; r < world; ++r) {
      const std::string record_name = rank_record_name(r);
      current = (dir / record_name).string();
      const Json rec = read_rank_record(dir / record_name);
      if (rec.value("step", int64_t{-1}) != job.step ||
          rec.value("world_size", int64_t{-1}) != world || rec.value("rank", int64_t{-1}) != r)
        MT_THROW(IoError, "rank ", r,
                 " wrote a record for another step or world size: ", rec.dump());
      for (const Json& f : rec.at("files")) {
        m.files.push_back({f.at("name").get<std::string>(), r, f.at("bytes").get<uint64_t>(),
                           std::stoull(f.at("xxh3").get<std::string>(), nullptr, 16)});
      }
      m.files.push_back({record_name, r, fs::file_size(dir / record_name),
                         xxh3_64_file((dir / record_name).string())});
      for (const Json& t : rec.at("tensors")) {
        const std::string name = t.at("name").get<std::string>();
        const ShardKind kind = parse_shard_kind(t.at("kind").get<std::string>());
        Shape shape = t.at("shape").get<Shape>();
        ShardRecord shard{r, t.at("file").get<std::string>(), 0, shape.empty() ? 1 : shape[0]};
        int64_t dim = 0, blocks = 1;
        if (kind == ShardKind::dim) {
          dim = t.at("dim").get<int64_t>();
          blocks = t.at("blocks").get<int64_t>();
          shard.offset = t.at("offset").get<int64_t>();
          shard.length = shape.at(static_cast<size_t>(dim)) / blocks;
          shape = t.at("global_shape").get<Shape>();
        } else if (kind == ShardKind::flat) {
          // The piece is stored 1-D; the manifest keeps the global shape.
          shard.offset = t.at("offset").get<int64_t>();
          shard.length = shape_numel(shape);
          shape = t.at("global_shape").get<Shape>();
        }
        auto it = index.find(name);
        if (it == index.end()) {
          index.emplace(name, m.tensors.size());
          m.tensors.push_back({name,
                               t.at("group").get<std::string>(),
                               parse_dtype(t.at("dtype").get<std::string>()),
                               shape,
                               kind,
                               dim,
                               blocks,
                               {shard}});
          continue;
        }
        TensorRecord& rec_t = m.tensors[it->second];
        if (rec_t.kind != kind || rec_t.shape != shape || rec_t.dim != dim ||
            rec_t.blocks != blocks || rec_t.group != t.at("group").get<std::string>() ||
            std::string(dtype_name(rec_t.dtype)) != t.at("dtype").get<std::string>())
          MT_THROW(IoError, "ranks disagree on tensor '", name, "' (rank ", r, " has ",
                   shard_kind_name(kind), " ", shape_str(shape), ", an earlier rank ",
                   shard_kind_name(rec_t.kind), " ", shape_str(rec_t.shape), ")");
        rec_t.shards.push_back(std::move(shard));
      }
    }
    // Round trip through the reader's validation: what we commit is what a loader accepts.
    current = (dir / kManifestFile).string();
    m = Manifest::from_json(Json::parse(m.to_json().dump()), current);

    // Files from an earlier attempt that nobody vouches for now do not belong in the checkpoint.
    std::set<std::string> listed;
    for (const FileRecord& f : m.files) listed.insert(f.name);
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (!listed.count(name) && name != kManifestFile) fs::remove_all(entry.path());
    }
    if (options_.before_file_write) options_.before_file_write(current);
    write_synced_file(current, manifest_text(m));
    fsync_dir(dir.string());

    const fs::path final_dir = root / step_dir_name(job.step);
    current = final_dir.string();
    if (fs::exists(final_dir)) remove_dir_safely(final_dir.string());
    fs::rename(dir, final_dir);
    fsync_dir(root.string());
    current = (root / kLatestFile).string();
    write_latest(root.string(), job.step);
    if (job.mark_best) {
      current = (root / kBestFile).string();
      if (options_.before_file_write) options_.before_file_write(current);
      write_best(root.string(), job.step);
    }
  } catch (...) {
    rethrow_as_io_error(std::current_exception(), job.step, current);
  }
  try {
    apply_retention(root.string(), options_.retention, job.step);
  } catch (const std::exception& e) {
    MT_LOG_WARN("ckpt", "retention after step ", job.step, " failed: ", e.what());
  }
  return true;
}

}  // namespace meshtrain::ckpt
