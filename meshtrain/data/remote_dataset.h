// Token datasets on object storage (data.dir = s3://bucket/prefix): the prefix holds what
// `meshtrain data prepare` writes (meta.json, train_*.bin, val_*.bin). Before the loader opens
// the shards, every object is brought into a host-local cache and the run reads a local
// directory of the usual layout:
//
//   CACHE/objects/<etag>                  one file per object content, named by its checksum
//   CACHE/views/<bucket>/<prefix>/<name>  hard links to those files: the directory the loader reads
//   CACHE/.lock                           flock held while one process fetches
//   CACHE/locks/<etag>.lock               flock held while one process downloads that object
//
// Keying the content by the server's ETag (the MD5 of a plain upload) makes an unchanged object
// reused across runs and datasets, and a changed one fetched again. Every download goes to a
// temporary name, is checked (size, and MD5 against the ETag where the ETag is an MD5) and only
// then renamed, so a killed download never leaves a partial object under its final name. The ranks
// of a host share the cache through the locks: the first fetches, the others wait and reuse.
//
// This fetches the whole dataset before training, objects in parallel: what a global shuffle,
// whose first batches draw from every shard, needs. With data.shard_block > 0 a run reads shard
// by shard instead (remote_shards.h), sharing the same cache (dataset_cache.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "meshtrain/ckpt/object_store.h"

namespace meshtrain::data {

struct RemoteDatasetOptions {
  std::string cache_root;  // CACHE above
  int parallel = 4;        // objects downloaded at a time
  // Shard by shard (remote_shards.h): the most the cache's objects may hold, in bytes (0: no
  // bound); the least recently used shards that no reader expects go first.
  uint64_t cache_limit = 0;
  std::function<void(const std::string&)> log;
};

struct LocalDataset {
  std::string dir;      // the view directory to open as a local dataset
  int64_t fetched = 0;  // objects downloaded by this call
  int64_t reused = 0;   // objects found in the cache
  uint64_t fetched_bytes = 0;
};

// Brings the dataset at `uri` into the cache. IoError, one line naming the object and what to do,
// when meta.json or the train shards are missing or an object arrives corrupt (nothing is left
// under a final name then); ObjectStoreError (ObjectStoreAuthError) when the server fails or
// refuses.
LocalDataset fetch_remote_dataset(ckpt::ObjectStore& store, const ckpt::ObjectUri& uri,
                                  const RemoteDatasetOptions& options);

// The cache for datasets: MESHTRAIN_S3_CACHE/datasets (default ~/.cache/meshtrain/s3/datasets).
std::string default_dataset_cache();

// data.dir as the loader opens it: a local directory as given; an s3:// URI fetched through the
// default cache (logging what it fetched and reused) and its view directory returned.
std::string resolve_data_dir(const std::string& dir);

}  // namespace meshtrain::data
