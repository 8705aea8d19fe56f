// A token dataset on object storage read shard by shard (data.dir = s3://..., data.shard_block
// > 0): the run starts once every shard's header is known (from the cache where the shard is
// there, else a ranged GET of its first KiB), and each shard is fetched into the host's dataset
// cache (dataset_cache.h) when the sampler is about to come to it: expect() queues the shards
// the sampler reads next, threads of this object fetch them in that order, and require() waits
// for one a reader needs now (moving it to the front). The ranks of a host share the cache
// shard by shard: a lock file per object lets one process download it while the others wait
// for it and then use it.
//
// With a cache limit (data.cache_limit) a download that takes the cache's objects past it
// evicts the least recently used objects (a use touches the file's time, whichever process
// used it) that this run does not expect now; a shard evicted here or by another process is
// fetched again when it is needed again. A reader unmaps the shards it has left (TokenDataset::
// expect), so that their space is returned.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/data/remote_dataset.h"
#include "meshtrain/data/shard_source.h"
#include "meshtrain/data/token_dataset.h"

namespace meshtrain::data {

class RemoteShards : public ShardSource {
 public:
  // Lists the dataset, brings meta.json into the cache and reads every shard's header, then
  // starts options.parallel fetching threads. IoError naming the object for a missing
  // meta.json or train shards and for a header that is not a shard's; ObjectStoreError
  // (ObjectStoreAuthError) when the server fails or refuses.
  RemoteShards(std::shared_ptr<ckpt::ObjectStore> store, ckpt::ObjectUri uri,
               RemoteDatasetOptions options);
  // Stops the threads (a download in flight is finished first).
  ~RemoteShards() override;
  RemoteShards(const RemoteShards&) = delete;
  RemoteShards& operator=(const RemoteShards&) = delete;

  // The shards of a split ("train", "val") in name order, with their headers; IoError when
  // the split has none.
  std::vector<TokenDataset::RemoteShard> shards(std::string_view split) const;

  std::string require(const std::string& name) override;
  void expect(const std::vector<std::string>& names) override;
  std::string where(const std::string& name) const override;

  struct Counts {
    int64_t fetched = 0;  // objects this process downloaded
    int64_t reused = 0;   // objects found in the cache
    uint64_t fetched_bytes = 0;
  };
  Counts counts() const;
  // The directory the fetched shards are linked into (for messages and tests).
  const std::filesystem::path& view_dir() const { return view_dir_; }

 private:
  enum class State { idle, queued, fetching, ready, failed };
  struct Object {
    ckpt::ObjectInfo info;
    ShardHeader header;
    State state = State::idle;
    std::exception_ptr error;
  };

  void run();
  // Reuses the cached content or downloads it (cache_object), then links it into the view. True
  // when this process downloaded it.
  bool bring(const ckpt::ObjectInfo& info, const std::string& name);
  // Brings the cache's objects under the limit (options_.cache_limit), sparing what `keep`
  // names (content names).
  void evict(const std::set<std::string>& keep);
  // Content names of the shards this process expects or is fetching (under mu_).
  std::set<std::string> in_use() const;

  std::shared_ptr<ckpt::ObjectStore> store_;
  ckpt::ObjectUri uri_;
  RemoteDatasetOptions options_;
  std::filesystem::path objects_dir_, view_dir_;

  mutable std::mutex mu_;
  std::condition_variable cv_;             // queued work or a finished object
  std::map<std::string, Object> objects_;  // the shards, by file name
  std::deque<std::string> queue_;          // to fetch, the most urgent first
  // The last expect() of each split's reader ("train", "val"): what eviction spares.
  std::map<std::string, std::vector<std::string>> expected_;
  std::string meta_content_;  // meta.json's content name, never evicted
  bool warned_limit_ = false;
  Counts counts_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// data.dir = s3://... read shard by shard through the default dataset cache (bounded by
// `cache_limit` bytes, 0: unbounded), logging what it fetches.
std::shared_ptr<RemoteShards> open_remote_shards(const std::string& uri, uint64_t cache_limit = 0);

}  // namespace meshtrain::data
