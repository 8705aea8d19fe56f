// See remote_shards.h.
#include "meshtrain/data/remote_shards.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include "meshtrain/data/dataset_cache.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/file_lock.h"
#include "meshtrain/util/log.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

// Marks a cached object as used now: the time eviction orders by, shared by every process.
void touch(const fs::path& content) {
  std::error_code ec;
  fs::last_write_time(content, fs::file_time_type::clock::now(), ec);
}

std::string split_of(const std::string& name) {
  return name.substr(0, name.find('_'));
}

// The first bytes of a cached file (up to kShardHeaderBytes).
std::string read_head(const fs::path& path) {
  std::string out(static_cast<size_t>(kShardHeaderBytes), '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MT_THROW(IoError, "cannot read ", path.string());
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  ::close(fd);
  if (n < 0) MT_THROW(IoError, "cannot read ", path.string());
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

RemoteShards::RemoteShards(std::shared_ptr<ckpt::ObjectStore> store, ckpt::ObjectUri uri,
                           RemoteDatasetOptions options)
    : store_(std::move(store)), uri_(std::move(uri)), options_(std::move(options)) {
  MT_CHECK(store_ != nullptr, "remote shards without a store");
  if (!options_.log) options_.log = [](const std::string&) {};
  options_.parallel = std::max(1, options_.parallel);
  const fs::path root(options_.cache_root);
  objects_dir_ = root / "objects";
  view_dir_ = root / "views" / uri_.bucket / uri_.prefix;
  fs::create_directories(objects_dir_);
  fs::create_directories(view_dir_);

  std::vector<ckpt::ObjectInfo> shards;
  for (ckpt::ObjectInfo& o : list_dataset(*store_, uri_)) {
    const std::string name = dataset_file_name(uri_, o);
    if (name == kDatasetMetaFile) {
      bring(o, name);  // small, and a dataset without readable metadata fails here
      meta_content_ = cached_content_name(o);
    } else
      shards.push_back(std::move(o));
  }
  std::vector<ShardHeader> headers(shards.size());
  std::vector<char> in_cache(shards.size(), 0);
  ckpt::parallel_for(static_cast<int64_t>(shards.size()), options_.parallel, [&](int64_t i) {
    const ckpt::ObjectInfo& o = shards[static_cast<size_t>(i)];
    const fs::path content = objects_dir_ / cached_content_name(o);
    std::string head;
    if (cached_whole(content, o.size)) {
      head = read_head(content);
      in_cache[static_cast<size_t>(i)] = 1;
    } else {
      auto got = store_->get_range(o.key, 0, static_cast<uint64_t>(kShardHeaderBytes));
      if (!got)
        MT_THROW(IoError, store_->uri(o.key),
                 " disappeared while the dataset was listed; start the run again once the upload "
                 "is complete");
      head = std::move(*got);
    }
    headers[static_cast<size_t>(i)] = parse_shard_header(
        reinterpret_cast<const uint8_t*>(head.data()), head.size(), o.size, store_->uri(o.key));
  });
  uint64_t bytes = 0, cached_bytes = 0;
  int64_t cached_count = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    bytes += shards[i].size;
    cached_bytes += in_cache[i] ? shards[i].size : 0;
    cached_count += in_cache[i];
    const std::string name = dataset_file_name(uri_, shards[i]);
    objects_.emplace(name, Object{std::move(shards[i]), headers[i], State::idle, nullptr});
  }
  int64_t train = 0;
  for (const auto& [name, o] : objects_) train += name.starts_with("train_") ? 1 : 0;
  options_.log(detail::str_cat("dataset ", uri_.str(), ": ", train, " train and ",
                               static_cast<int64_t>(objects_.size()) - train, " val shards (",
                               mib(bytes), "), ", cached_count, " in the cache ", root.string(),
                               " (", mib(cached_bytes),
                               "); the others are fetched as the sampler comes to them"));
  for (int i = 0; i < options_.parallel; ++i) threads_.emplace_back([this] { run(); });
}

RemoteShards::~RemoteShards() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<TokenDataset::RemoteShard> RemoteShards::shards(std::string_view split) const {
  const std::string prefix = std::string(split) + "_";
  std::vector<TokenDataset::RemoteShard> out;
  for (const auto& [name, o] : objects_)  // a map: name order, as find_shards sorts
    if (name.starts_with(prefix)) out.push_back({name, o.header});
  if (out.empty())
    MT_THROW(IoError, "no ", prefix, "*.bin shards at ", uri_.str(),
             "/; prepare the dataset with `meshtrain data prepare --out DIR` and copy DIR's "
             "files there");
  return out;
}

std::string RemoteShards::where(const std::string& name) const {
  return store_->uri(uri_.key(name));
}

RemoteShards::Counts RemoteShards::counts() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void RemoteShards::expect(const std::vector<std::string>& names) {
  bool queued = false;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (!names.empty()) expected_[split_of(names.front())] = names;
    // The given shards go to the front in their order; what was expected before stays behind
    // them (readers of both splits share this object, and what the sampler expected is still
    // to come).
    for (auto it = names.rbegin(); it != names.rend(); ++it) {
      Object& o = objects_.at(*it);
      if (o.state == State::idle) o.state = State::queued;
      if (o.state != State::queued) continue;
      if (!queue_.empty() && queue_.front() == *it) continue;
      queue_.erase(std::remove(queue_.begin(), queue_.end(), *it), queue_.end());
      queue_.push_front(*it);
      queued = true;
    }
  }
  if (queued) cv_.notify_all();
}

std::string RemoteShards::require(const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  Object& o = objects_.at(name);
  std::error_code ec;
  if (o.state == State::ready && !fs::exists(view_dir_ / name, ec))
    o.state = State::idle;  // evicted since, here or by another process of the host
  if (o.state != State::ready && o.state != State::failed) {
    if (o.state != State::fetching) {
      o.state = State::queued;
      queue_.erase(std::remove(queue_.begin(), queue_.end(), name), queue_.end());
      queue_.push_front(name);
      cv_.notify_all();
    }
    const auto start = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return o.state == State::ready || o.state == State::failed; });
    MT_LOG_DEBUG("data", "waited ",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 " s for ", where(name));
  }
  if (o.state == State::failed) std::rethrow_exception(o.error);
  touch(objects_dir_ / cached_content_name(o.info));
  return (view_dir_ / name).string();
}

void RemoteShards::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const std::string name = queue_.front();
    queue_.pop_front();
    Object& o = objects_.at(name);
    if (o.state != State::queued) continue;
    o.state = State::fetching;
    const ckpt::ObjectInfo info = o.info;
    lock.unlock();
    std::exception_ptr error;
    bool downloaded = false;
    try {
      downloaded = bring(info, name);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    o.state = error ? State::failed : State::ready;
    o.error = error;
    if (!error) {
      counts_.fetched += downloaded ? 1 : 0;
      counts_.reused += downloaded ? 0 : 1;
      counts_.fetched_bytes += downloaded ? info.size : 0;
    }
    cv_.notify_all();
  }
}

bool RemoteShards::bring(const ckpt::ObjectInfo& info, const std::string& name) {
  const auto [content, downloaded] = cache_object(*store_, info, options_.cache_root);
  touch(content);
  place_in_view(content, view_dir_ / name);
  if (downloaded)
    options_.log(detail::str_cat("fetched ", store_->uri(info.key), " (", mib(info.size), ")"));
  if (downloaded && options_.cache_limit > 0) {
    std::set<std::string> keep;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      keep = in_use();
    }
    keep.insert(cached_content_name(info));
    evict(keep);
  }
  return downloaded;
}

std::set<std::string> RemoteShards::in_use() const {
  std::set<std::string> keep{meta_content_};
  for (const auto& [name, o] : objects_)
    if (o.state == State::queued || o.state == State::fetching)
      keep.insert(cached_content_name(o.info));
  for (const auto& [split, names] : expected_)
    for (const std::string& name : names) keep.insert(cached_content_name(objects_.at(name).info));
  return keep;
}

void RemoteShards::evict(const std::set<std::string>& keep) {
  // One process of the host evicts at a time; downloads go on meanwhile.
  const FileLock lock((fs::path(options_.cache_root) / ".evict.lock").string(),
                      " (set MESHTRAIN_S3_CACHE to a writable directory)");
  struct Entry {
    fs::file_time_type used;
    std::string name;
    uint64_t size;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(objects_dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || name.ends_with(".tmp") || name.ends_with(".part")) continue;
    const uint64_t size = e.file_size(ec);
    total += size;
    entries.push_back({e.last_write_time(ec), name, size});
  }
  if (total <= options_.cache_limit) return;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.used < b.used; });
  std::map<std::string, std::string> ours;  // content name -> this dataset's shard name
  for (const auto& [name, o] : objects_) ours[cached_content_name(o.info)] = name;
  int64_t evicted = 0;
  for (const Entry& e : entries) {
    if (total <= options_.cache_limit) break;
    if (keep.count(e.name)) continue;
    // Its lock: no process of the host is downloading it or checking it is there.
    const FileLock object_lock(
        (fs::path(options_.cache_root) / "locks" / (e.name + ".lock")).string());
    // Used (or downloaded again) since the scan: not the least recently used any more.
    if (fs::last_write_time(objects_dir_ / e.name, ec) != e.used) continue;
    if (auto it = ours.find(e.name); it != ours.end()) {
      fs::remove(view_dir_ / it->second, ec);
      const std::lock_guard<std::mutex> guard(mu_);
      Object& o = objects_.at(it->second);
      if (o.state == State::ready) o.state = State::idle;
    }
    if (fs::remove(objects_dir_ / e.name, ec)) {
      total -= e.size;
      ++evicted;
    }
  }
  MT_LOG_DEBUG("data", "evicted ", evicted, " object(s) from ", objects_dir_.string());
  if (total > options_.cache_limit && !warned_limit_) {
    warned_limit_ = true;
    options_.log(detail::str_cat(
        "the dataset cache holds ", mib(total), ", over its limit of ", mib(options_.cache_limit),
        ", in shards this run reads now or next; raise data.cache_limit, or lower "
        "data.shard_block or data.prefetch_shards"));
  }
}

std::shared_ptr<RemoteShards> open_remote_shards(const std::string& uri_text,
                                                 uint64_t cache_limit) {
  const ckpt::ObjectUri uri = ckpt::parse_object_uri(uri_text);
  RemoteDatasetOptions options;
  options.cache_root = default_dataset_cache();
  if (const auto parallel = env_count(Env::s3_parallel))
    options.parallel = std::max(1, static_cast<int>(*parallel));
  options.log = [](const std::string& line) { MT_LOG_INFO("data", line); };
  options.cache_limit = cache_limit;
  return std::make_shared<RemoteShards>(ckpt::open_object_store(uri), uri, options);
}

}  // namespace meshtrain::data
