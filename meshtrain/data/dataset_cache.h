// The host-local cache of datasets on object storage, shared by the whole-dataset fetch
// (remote_dataset.h) and the shard-by-shard source (remote_shards.h):
//
//   CACHE/objects/<etag>                  one file per object content, named by its checksum
//   CACHE/views/<bucket>/<prefix>/<name>  hard links to those files: the directory a run reads
//
// Every download goes to a temporary name, is checked (size, and MD5 against the ETag where the
// ETag is an MD5) and only then renamed, so a killed download never leaves a partial object
// under its final name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/ckpt/object_store.h"

namespace meshtrain::data {

inline constexpr const char* kDatasetMetaFile = "meta.json";

// meta.json, train_*.bin or val_*.bin.
bool is_dataset_file(const std::string& name);
// The objects of the dataset at `uri` (its files directly under the prefix). IoError, one line
// saying what to do, when meta.json or the train shards are missing.
std::vector<ckpt::ObjectInfo> list_dataset(ckpt::ObjectStore& store, const ckpt::ObjectUri& uri);
// The object's file name under the dataset's prefix.
std::string dataset_file_name(const ckpt::ObjectUri& uri, const ckpt::ObjectInfo& object);
// The cache's name for an object's content: its ETag where it has one, else a hash of where and
// when it was written.
std::string cached_content_name(const ckpt::ObjectInfo& object);
// Whether `content` (a cache object file) is there whole: a regular file of `size` bytes.
bool cached_whole(const std::filesystem::path& content, uint64_t size);
// Brings the object's content into CACHE/objects (CACHE = `root`) under the object's lock file,
// CACHE/locks/<content>.lock: the host's other processes wanting it wait there, and the leftovers
// of a killed download of it are removed first. The content's path, and whether this call
// downloaded it (false: it was there).
std::pair<std::filesystem::path, bool> cache_object(ckpt::ObjectStore& store,
                                                    const ckpt::ObjectInfo& object,
                                                    const std::filesystem::path& root);
// Removes the temporary files of downloads that never finished (a killed process) from `dir`,
// those whose names start with `prefix`. Only for files no live download writes: call it
// holding the lock that guards them.
void remove_download_leftovers(const std::filesystem::path& dir, const std::string& prefix = "");
// Downloads `object` to `target` through a temporary name, checked before the rename; IoError
// naming the object when it arrives corrupt or disappeared (nothing left under a final name).
void download_checked(ckpt::ObjectStore& store, const ckpt::ObjectInfo& object,
                      const std::filesystem::path& target);
// Makes `link` the file `content` (a hard link; a copy where links are not possible).
void place_in_view(const std::filesystem::path& content, const std::filesystem::path& link);
// "1.2 MiB"
std::string mib(uint64_t bytes);

}  // namespace meshtrain::data
