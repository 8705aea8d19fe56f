// See remote_dataset.h.
#include "meshtrain/data/remote_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/file_lock.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMetaFile = "meta.json";

bool is_dataset_file(const std::string& name) {
  auto shard = [&](const std::string& split) {
    return name.size() > split.size() + 4 && name.starts_with(split) && name.ends_with(".bin");
  };
  return name == kMetaFile || shard("train_") || shard("val_");
}

bool is_md5_hex(const std::string& etag) {
  if (etag.size() != 32) return false;
  for (const char c : etag)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The cache's name for an object's content: its ETag where it has one (S3's MD5 of the bytes, or
// "<md5>-<parts>" for a multipart upload), else a hash of where and when it was written.
std::string content_name(const ckpt::ObjectInfo& o) {
  std::string name;
  for (const char c : o.etag)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-') name += c;
  if (!name.empty()) return name;
  return "noetag-" + hash_hex(xxh3_64(detail::str_cat(o.key, " ", o.size, " ", o.modified_unix_s)));
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

// Temporary files of downloads that never finished (a killed process). Only called under the
// lock, so no download is in flight.
void remove_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp") || name.ends_with(".part")) fs::remove(entry.path(), ec);
  }
}

// Downloads one object to `target` through a temporary name, checked before the rename.
void download(ckpt::ObjectStore& store, const ckpt::ObjectInfo& o, const fs::path& target) {
  const fs::path tmp = target.string() + "." + std::to_string(::getpid()) + ".tmp";
  std::error_code ec;
  try {
    if (!store.get_file(o.key, tmp.string()))
      MT_THROW(IoError, store.uri(o.key),
               " disappeared while the dataset was fetched; start the run again once the upload "
               "is complete");
    const uint64_t size = fs::file_size(tmp);
    const std::string md5 = is_md5_hex(o.etag) ? ckpt::md5_file_hex(tmp.string()) : std::string();
    if (size != o.size || md5 != (is_md5_hex(o.etag) ? o.etag : std::string()))
      MT_THROW(IoError, store.uri(o.key), " is corrupt: received ", size, " bytes",
               md5.empty() ? std::string() : " with MD5 " + md5, ", the server lists ", o.size,
               " bytes", md5.empty() ? std::string() : " with ETag " + o.etag,
               "; upload the file again");
    fs::rename(tmp, target, ec);
    if (ec) MT_THROW(IoError, "cannot rename ", tmp.string(), ": ", ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    fs::remove(tmp.string() + ".part", ec);
    throw;
  }
}

// Makes view/name the file `content` (a hard link; a copy where links are not possible).
void place(const fs::path& content, const fs::path& link) {
  std::error_code ec;
  if (fs::exists(link, ec) && fs::equivalent(link, content, ec)) return;
  const fs::path tmp = link.string() + "." + std::to_string(::getpid()) + ".tmp";
  fs::remove(tmp, ec);
  fs::create_hard_link(content, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(content, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec)
      MT_THROW(IoError, "cannot place ", link.string(), " in the dataset cache: ", ec.message());
  }
  fs::rename(tmp, link, ec);
  if (ec) MT_THROW(IoError, "cannot rename ", tmp.string(), ": ", ec.message());
}

}  // namespace

LocalDataset fetch_remote_dataset(ckpt::ObjectStore& store, const ckpt::ObjectUri& uri,
                                  const RemoteDatasetOptions& options) {
  auto log = options.log ? options.log : [](const std::string&) {};
  const std::string base = uri.prefix.empty() ? "" : uri.prefix + "/";
  std::vector<ckpt::ObjectInfo> objects;
  bool has_meta = false, has_train = false;
  for (ckpt::ObjectInfo& o : store.list(base)) {
    const std::string name = o.key.substr(base.size());
    if (name.find('/') != std::string::npos || !is_dataset_file(name)) continue;
    has_meta = has_meta || name == kMetaFile;
    has_train = has_train || name.starts_with("train_");
    objects.push_back(std::move(o));
  }
  const std::string upload_hint =
      " (prepare it with `meshtrain data prepare --out DIR` and copy "
      "DIR's files to " +
      uri.str() + "/)";
  if (!has_meta)
    MT_THROW(IoError, store.uri(uri.key(kMetaFile)), " is missing: no dataset at ", uri.str(),
             upload_hint);
  if (!has_train) MT_THROW(IoError, "no train_*.bin shards at ", uri.str(), "/", upload_hint);

  const fs::path root(options.cache_root);
  const fs::path objects_dir = root / "objects";
  const fs::path view = root / "views" / uri.bucket / uri.prefix;
  fs::create_directories(objects_dir);
  fs::create_directories(view);

  LocalDataset out;
  out.dir = view.string();
  // One process of the host fetches; the others wait and then find the objects in place.
  const FileLock lock((root / ".lock").string(),
                      " (set MESHTRAIN_S3_CACHE to a writable directory)");
  remove_leftovers(objects_dir);
  remove_leftovers(view);

  std::vector<const ckpt::ObjectInfo*> missing;
  uint64_t missing_bytes = 0;
  for (const ckpt::ObjectInfo& o : objects) {
    std::error_code ec;
    const fs::path content = objects_dir / content_name(o);
    if (fs::is_regular_file(content, ec) && fs::file_size(content, ec) == o.size) continue;
    missing.push_back(&o);
    missing_bytes += o.size;
  }
  out.reused = static_cast<int64_t>(objects.size() - missing.size());
  if (!missing.empty())
    log(detail::str_cat("fetching ", missing.size(), " of ", objects.size(), " objects (",
                        mib(missing_bytes), ") of ", uri.str(), " into ", root.string()));
  // meta.json sorts before the shards' names only by chance; fetch it first so that a dataset
  // without readable metadata fails before the large downloads.
  for (const ckpt::ObjectInfo* o : missing)
    if (o->key == uri.key(kMetaFile)) download(store, *o, objects_dir / content_name(*o));
  std::mutex mu;
  int64_t done = 0;
  ckpt::parallel_for(static_cast<int64_t>(missing.size()), std::max(1, options.parallel),
                     [&](int64_t i) {
                       const ckpt::ObjectInfo& o = *missing[static_cast<size_t>(i)];
                       const fs::path content = objects_dir / content_name(o);
                       if (o.key != uri.key(kMetaFile)) download(store, o, content);
                       std::lock_guard<std::mutex> guard(mu);
                       ++done;
                       log(detail::str_cat("fetched ", store.uri(o.key), " (", mib(o.size), ", ",
                                           done, " of ", missing.size(), ")"));
                     });
  out.fetched = static_cast<int64_t>(missing.size());
  out.fetched_bytes = missing_bytes;

  std::set<std::string> names;
  for (const ckpt::ObjectInfo& o : objects) {
    const std::string name = o.key.substr(base.size());
    names.insert(name);
    place(objects_dir / content_name(o), view / name);
  }
  // Shards removed from the bucket leave the view too: the loader opens every train_*.bin.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(view, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && is_dataset_file(name) && !names.count(name))
      fs::remove(entry.path(), ec);
  }
  log(detail::str_cat("dataset ", uri.str(), ": ", out.fetched, " object(s) fetched (",
                      mib(out.fetched_bytes), "), ", out.reused, " reused from the cache ",
                      root.string()));
  return out;
}

std::string default_dataset_cache() {
  return (fs::path(ckpt::object_cache_root()) / "datasets").string();
}

std::string resolve_data_dir(const std::string& dir) {
  if (!ckpt::is_object_uri(dir)) return dir;
  const ckpt::ObjectUri uri = ckpt::parse_object_uri(dir);
  const std::unique_ptr<ckpt::ObjectStore> store = ckpt::open_object_store(uri);
  RemoteDatasetOptions options;
  options.cache_root = default_dataset_cache();
  if (const auto parallel = env_count(Env::s3_parallel))
    options.parallel = std::max(1, static_cast<int>(*parallel));
  options.log = [](const std::string& line) { MT_LOG_INFO("data", line); };
  return fetch_remote_dataset(*store, uri, options).dir;
}

}  // namespace meshtrain::data
