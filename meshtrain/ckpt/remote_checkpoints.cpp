// See remote_checkpoints.h.
#include "meshtrain/ckpt/remote_checkpoints.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kLargeFile = uint64_t{256} << 20;  // uploaded one at a time

double now_unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "step_<N>/rest" under the prefix: N, or nothing.
std::optional<int64_t> step_of_key(const ObjectUri& uri, const std::string& key,
                                   std::string* rest = nullptr) {
  const std::string base = uri.prefix.empty() ? "" : uri.prefix + "/";
  if (key.rfind(base, 0) != 0) return std::nullopt;
  const std::string rel = key.substr(base.size());
  const auto slash = rel.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const auto step = parse_step_dir_name(rel.substr(0, slash));
  if (step && rest != nullptr) *rest = rel.substr(slash + 1);
  return step;
}

std::string list_prefix(const ObjectUri& uri) {
  return uri.prefix.empty() ? "" : uri.prefix + "/";
}

}  // namespace

std::vector<RemoteStep> remote_complete_steps(ObjectStore& store, const ObjectUri& uri) {
  std::map<int64_t, double> steps;
  for (const ObjectInfo& o : store.list(list_prefix(uri))) {
    std::string rest;
    const auto step = step_of_key(uri, o.key, &rest);
    if (step && rest == kManifestFile) steps[*step] = o.modified_unix_s;
  }
  std::vector<RemoteStep> out;
  for (const auto& [step, t] : steps) out.push_back({step, t});
  return out;
}

std::optional<int64_t> read_remote_pointer(ObjectStore& store, const ObjectUri& uri,
                                           const std::string& pointer) {
  const auto bytes = store.get_bytes(uri.key(pointer));
  if (!bytes) return std::nullopt;
  std::string name = *bytes;
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  return parse_step_dir_name(name);
}

std::string fetch_step(ObjectStore& store, const ObjectUri& uri, int64_t step,
                       const std::string& local_root, int parallel) {
  const std::string name = step_dir_name(step);
  const fs::path tmp = fs::path(local_root) / (name + ".fetch.tmp");
  const fs::path final_dir = fs::path(local_root) / name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  try {
    const std::string manifest_key = uri.key(name + "/" + kManifestFile);
    if (!store.get_file(manifest_key, (tmp / kManifestFile).string()))
      MT_THROW(IoError, store.uri(manifest_key), " is missing");
    Manifest m;
    try {
      m = read_manifest(tmp.string());
    } catch (const ObjectStoreError&) {
      throw;
    } catch (const IoError& e) {
      MT_THROW(IoError, store.uri(manifest_key), " is corrupt: ", e.what());
    }
    parallel_for(static_cast<int64_t>(m.files.size()), parallel, [&](int64_t i) {
      const FileRecord& f = m.files[static_cast<size_t>(i)];
      const std::string key = uri.key(name + "/" + f.name);
      const fs::path local = tmp / f.name;
      fs::create_directories(local.parent_path());
      if (!store.get_file(key, local.string())) MT_THROW(IoError, store.uri(key), " is missing");
      const uint64_t size = fs::file_size(local);
      const uint64_t hash = size == f.bytes ? xxh3_64_file(local.string()) : 0;
      if (size != f.bytes || hash != f.xxh3)
        MT_THROW(IoError, store.uri(key), " is corrupt: ", size, " bytes",
                 size == f.bytes ? ", xxh3 " + hash_hex(hash) : std::string(),
                 "; the manifest says ", f.bytes, " bytes, xxh3 ", hash_hex(f.xxh3));
    });
    fsync_dir(tmp.string());
    if (fs::exists(final_dir)) remove_dir_safely(final_dir.string());
    fs::rename(tmp, final_dir);
    fsync_dir(local_root);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir.string();
}

FetchResult fetch_newest(ObjectStore& store, const ObjectUri& uri, const std::string& local_root,
                         int64_t max_step) {
  FetchResult out;
  fs::create_directories(local_root);
  const std::vector<int64_t> local = list_complete_steps(local_root);
  const int64_t local_newest = local.empty() ? -1 : local.back();
  const std::vector<RemoteStep> remote = remote_complete_steps(store, uri);
  for (auto it = remote.rbegin(); it != remote.rend(); ++it) {
    if (max_step >= 0 && it->step > max_step) continue;
    if (it->step <= local_newest) break;
    try {
      fetch_step(store, uri, it->step, local_root);
      out.step = it->step;
      write_latest(local_root, it->step);
      break;
    } catch (const ObjectStoreError&) {
      throw;
    } catch (const std::exception& e) {
      out.rejections.push_back(
          detail::str_cat(uri.str(), "/", step_dir_name(it->step), ": ", e.what()));
    }
  }
  // The best checkpoint, when the local root lacks it (a fresh node).
  const auto best = read_remote_pointer(store, uri, kBestFile);
  if (best && !std::binary_search(local.begin(), local.end(), *best) && out.step != *best &&
      std::any_of(remote.begin(), remote.end(),
                  [&](const RemoteStep& r) { return r.step == *best; })) {
    try {
      fetch_step(store, uri, *best, local_root);
      write_best(local_root, *best);
    } catch (const ObjectStoreError&) {
      throw;
    } catch (const std::exception& e) {
      out.rejections.push_back(
          detail::str_cat(uri.str(), "/", step_dir_name(*best), " (best): ", e.what()));
    }
  } else if (best && (out.step == *best || std::binary_search(local.begin(), local.end(), *best))) {
    if (!read_best(local_root)) write_best(local_root, *best);
  }
  return out;
}

std::string materialize_remote_checkpoint(const std::string& uri_text,
                                          const std::string& cache_root) {
  ObjectUri uri = parse_object_uri(uri_text);
  std::string selector = kLatestFile;
  const auto slash = uri.prefix.rfind('/');
  const std::string last = slash == std::string::npos ? uri.prefix : uri.prefix.substr(slash + 1);
  if (last == kLatestFile || last == kBestFile || parse_step_dir_name(last)) {
    selector = last;
    uri.prefix = slash == std::string::npos ? "" : uri.prefix.substr(0, slash);
  }
  std::unique_ptr<ObjectStore> store = open_object_store(uri);
  std::optional<int64_t> step;
  if (selector == kLatestFile || selector == kBestFile) {
    step = read_remote_pointer(*store, uri, selector);
    if (!step && selector == kLatestFile) {
      const auto steps = remote_complete_steps(*store, uri);
      if (!steps.empty()) step = steps.back().step;
    }
    if (!step) MT_THROW(IoError, "no checkpoint at ", uri.str(), "/", selector);
  } else {
    step = parse_step_dir_name(selector);
  }
  const fs::path local = fs::path(cache_root) / uri.bucket / uri.prefix;
  fs::create_directories(local);
  return fetch_step(*store, uri, *step, local.string());
}

// ---- the mirror ----

CheckpointMirror::CheckpointMirror(std::shared_ptr<ObjectStore> store, MirrorOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!options_.log) options_.log = [](const std::string&) {};
  options_.max_queue = std::max<size_t>(1, options_.max_queue);
  thread_ = std::thread([this] { run(); });
}

CheckpointMirror::~CheckpointMirror() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointMirror::enqueue(int64_t step, double committed_unix_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [s, t] : queue_)
      if (s == step) return;
    if (queue_.size() >= options_.max_queue) {
      options_.log(detail::str_cat("checkpoint upload queue full (", options_.max_queue, "): step ",
                                   queue_.front().first, " is not uploaded (it stays in ",
                                   options_.local_root, ")"));
      queue_.pop_front();
    }
    queue_.emplace_back(step, committed_unix_s > 0 ? committed_unix_s : now_unix_s());
  }
  cv_.notify_all();
}

void CheckpointMirror::set_remote_newest(int64_t step, double unix_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step > status_.newest_step) {
    status_.newest_step = step;
    status_.newest_unix_s = unix_s;
  }
}

bool CheckpointMirror::drain(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return queue_.empty() && !busy_; });
}

MirrorStatus CheckpointMirror::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  MirrorStatus s = status_;
  s.pending = queue_.size() + (busy_ ? 1 : 0);
  return s;
}

void CheckpointMirror::on_status(std::function<void(const MirrorStatus&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_status_ = std::move(fn);
}

void CheckpointMirror::run() {
  // Uploads yield the cores to training: this thread and every thread it starts (parts, the
  // checksum) run at nice 10.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  double backoff = options_.retry_min_s;
  std::unique_lock<std::mutex> lock(mu_);
  // The status callback runs without the lock (it may take a while: it sets metrics).
  const auto publish = [&] {
    if (!on_status_) return;
    MirrorStatus s = status_;
    s.pending = queue_.size();
    auto fn = on_status_;
    lock.unlock();
    fn(s);
    lock.lock();
  };
  for (;;) {
    // Wakes at least every second so that the age metric keeps moving.
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    publish();
    if (queue_.empty()) continue;
    const auto [step, committed] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::string failure;
    bool retry = false;
    try {
      upload(step);
    } catch (const ObjectStoreError& e) {
      failure = e.what();
      retry = true;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    busy_ = false;
    if (failure.empty()) {
      backoff = options_.retry_min_s;
      status_.uploaded++;
      if (step >= status_.newest_step) {
        status_.newest_step = step;
        status_.newest_unix_s = committed;
      }
    } else {
      status_.failures++;
      if (retry && queue_.size() < options_.max_queue) queue_.emplace_front(step, committed);
      const size_t waiting = queue_.size();
      lock.unlock();
      options_.log(detail::str_cat("checkpoint upload of ", step_dir_name(step), " to ",
                                   options_.uri.str(), " failed: ", failure,
                                   retry ? detail::str_cat("; retrying in ", backoff, " s (",
                                                           waiting, " waiting; training goes on)")
                                         : std::string("; not retried")));
      lock.lock();
      if (retry) {
        cv_.wait_for(lock, std::chrono::duration<double>(backoff), [&] { return stop_; });
        backoff = std::min(backoff * 2, options_.retry_max_s);
      }
    }
    cv_.notify_all();
    publish();
  }
}

void CheckpointMirror::upload(int64_t step) {
  const std::string name = step_dir_name(step);
  const fs::path dir = fs::path(options_.local_root) / name;
  if (!fs::exists(dir / kManifestFile))
    MT_THROW(Error, dir.string(), " is gone (local retention removed it before its upload)");
  const std::string manifest_key = options_.uri.key(name + "/" + kManifestFile);
  auto put = [&](const std::string& key, const fs::path& path) {
    if (options_.before_put) options_.before_put(key);
    store_->put_file(key, path.string());
  };
  uint64_t bytes = 0;
  if (!store_->head(manifest_key)) {
    std::vector<std::pair<std::string, fs::path>> small, large;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string rel = fs::relative(entry.path(), dir).generic_string();
      if (rel == kManifestFile) continue;
      const uint64_t size = entry.file_size();
      bytes += size;
      (size >= kLargeFile ? large : small)
          .emplace_back(options_.uri.key(name + "/" + rel), entry.path());
    }
    for (const auto& [key, path] : large) put(key, path);
    parallel_for(static_cast<int64_t>(small.size()), options_.parallel, [&](int64_t i) {
      put(small[static_cast<size_t>(i)].first, small[static_cast<size_t>(i)].second);
    });
    // The manifest last: only now is the step complete on the server.
    put(manifest_key, dir / kManifestFile);
    bytes += fs::file_size(dir / kManifestFile);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_.bytes += bytes;
    if (step < status_.newest_step) return;  // an older step caught up: the pointers stay
  }
  if (options_.before_put) options_.before_put(options_.uri.key(kLatestFile));
  store_->put_bytes(options_.uri.key(kLatestFile), name + "\n");
  if (read_best(options_.local_root) == name)
    store_->put_bytes(options_.uri.key(kBestFile), name + "\n");
  try {
    apply_remote_retention(step);
  } catch (const std::exception& e) {
    options_.log(std::string("remote checkpoint retention failed (retried after the next "
                             "upload): ") +
                 e.what());
  }
}

void CheckpointMirror::apply_remote_retention(int64_t newest) {
  const bool prune = options_.retention.keep_last > 0 || options_.retention.keep_every > 0;
  std::map<int64_t, std::vector<std::string>> keys;
  std::set<int64_t> complete;
  for (const ObjectInfo& o : store_->list(list_prefix(options_.uri))) {
    std::string rest;
    const auto step = step_of_key(options_.uri, o.key, &rest);
    if (!step) continue;
    keys[*step].push_back(o.key);
    if (rest == kManifestFile) complete.insert(*step);
  }
  std::vector<int64_t> doomed;
  if (prune) {
    const auto best = read_remote_pointer(*store_, options_.uri, kBestFile);
    doomed = steps_to_delete(std::vector<int64_t>(complete.begin(), complete.end()), newest,
                             options_.retention, best);
  }
  // Data objects of uploads that never finished (a killed process), older than the newest.
  for (const auto& [step, k] : keys)
    if (!complete.count(step) && step < newest) doomed.push_back(step);
  for (int64_t step : doomed) {
    // The manifest first: a step half deleted is no longer complete.
    const std::string manifest_key = options_.uri.key(step_dir_name(step) + "/" + kManifestFile);
    if (complete.count(step)) store_->remove(manifest_key);
    for (const std::string& key : keys[step])
      if (key != manifest_key) store_->remove(key);
  }
}

}  // namespace meshtrain::ckpt
