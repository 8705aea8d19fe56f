// See remote_dataset.h.
#include "meshtrain/data/remote_dataset.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "meshtrain/data/dataset_cache.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/file_lock.h"
#include "meshtrain/util/log.h"

namespace meshtrain::data {
namespace fs = std::filesystem;

LocalDataset fetch_remote_dataset(ckpt::ObjectStore& store, const ckpt::ObjectUri& uri,
                                  const RemoteDatasetOptions& options) {
  auto log = options.log ? options.log : [](const std::string&) {};
  const std::vector<ckpt::ObjectInfo> objects = list_dataset(store, uri);
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

  std::vector<const ckpt::ObjectInfo*> missing;
  uint64_t missing_bytes = 0;
  for (const ckpt::ObjectInfo& o : objects) {
    if (cached_whole(objects_dir / cached_content_name(o), o.size)) continue;
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
    if (o->key == uri.key(kDatasetMetaFile)) cache_object(store, *o, root);
  std::mutex mu;
  int64_t done = 0;
  ckpt::parallel_for(static_cast<int64_t>(missing.size()), std::max(1, options.parallel),
                     [&](int64_t i) {
                       const ckpt::ObjectInfo& o = *missing[static_cast<size_t>(i)];
                       if (o.key != uri.key(kDatasetMetaFile)) cache_object(store, o, root);
                       std::lock_guard<std::mutex> guard(mu);
                       ++done;
                       log(detail::str_cat("fetched ", store.uri(o.key), " (", mib(o.size), ", ",
                                           done, " of ", missing.size(), ")"));
                     });
  out.fetched = static_cast<int64_t>(missing.size());
  out.fetched_bytes = missing_bytes;

  std::set<std::string> names;
  for (const ckpt::ObjectInfo& o : objects) {
    const std::string name = dataset_file_name(uri, o);
    names.insert(name);
    place_in_view(objects_dir / cached_content_name(o), view / name);
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
