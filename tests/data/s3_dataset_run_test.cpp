// data.dir = s3://... end to end against a real S3-compatible server (s3rver): two ranks under
// meshrun train exactly as from the local directory, a second run reuses the host's cache without
// a download, a changed object is fetched again, and a corrupt object or a missing meta.json stops
// the run with one line naming the object, leaving nothing half written in the cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/data/remote_dataset.h"
#include "meshtrain/data/remote_shards.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/data/token_dataset.h"
#include "meshtrain/data/token_shard.h"
#include "tests/runtime/s3_train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class S3DatasetRun : public S3TrainRunTest {
 protected:
  void SetUp() override {
    S3TrainRunTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    store_ = std::make_unique<ckpt::S3ObjectStore>(ckpt::S3Settings::from_environment(),
                                                   server_->bucket());
  }
  // Uploads the prepared dataset's files under `prefix` (all but `skip`).
  void upload(const std::string& prefix, const std::string& skip = "") {
    for (const auto& entry : fs::directory_iterator(data_root_ / "data")) {
      const std::string name = entry.path().filename().string();
      if (name != skip) store_->put_file(prefix + "/" + name, entry.path().string());
    }
  }
  std::string env() const {
    return "env " + server_->env() + "MESHTRAIN_S3_CACHE=" + (dir_ / "cache").string() + " ";
  }
  std::string remote_args(const fs::path& out, const std::string& prefix) const {
    return train_args(out, 6, 6, "--set data.dir=" + server_->uri(prefix));
  }
  // Name -> mtime of every file of the cache's content store.
  std::map<std::string, fs::file_time_type> cached_objects() const {
    std::map<std::string, fs::file_time_type> out;
    const fs::path objects = dir_ / "cache" / "datasets" / "objects";
    if (!fs::exists(objects)) return out;
    for (const auto& e : fs::directory_iterator(objects))
      out[e.path().filename().string()] = e.last_write_time();
    return out;
  }
  static size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  }
  data::RemoteDatasetOptions options() const {
    data::RemoteDatasetOptions o;
    o.cache_root = (dir_ / "cache" / "datasets").string();
    return o;
  }

  // The prepared dataset with its train shard cut into `n` shards, in a local directory and
  // uploaded under `prefix`.
  fs::path cut_and_upload(int n, const std::string& prefix) {
    const fs::path out = dir_ / "sharded";
    fs::create_directories(out);
    const data::TokenShard whole((data_root_ / "data" / "train_000000.bin").string());
    std::vector<int32_t> tokens(static_cast<size_t>(whole.size()));
    whole.read(0, tokens);
    const size_t per = tokens.size() / static_cast<size_t>(n);
    for (int i = 0; i < n; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "train_%06d.bin", i);
      const auto begin = tokens.begin() + static_cast<std::ptrdiff_t>(per * static_cast<size_t>(i));
      data::write_token_shard(
          (out / name).string(),
          std::vector<int32_t>(begin, begin + static_cast<std::ptrdiff_t>(per)));
    }
    for (const char* name : {"val_000000.bin", "meta.json"})
      fs::copy_file(data_root_ / "data" / name, out / name);
    for (const auto& entry : fs::directory_iterator(out))
      store_->put_file(prefix + "/" + entry.path().filename().string(), entry.path().string());
    return out;
  }
  // The train shards of a dataset view.
  static std::set<std::string> train_shards_in(const fs::path& view) {
    std::set<std::string> out;
    if (!fs::exists(view)) return out;
    for (const auto& e : fs::directory_iterator(view)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("train_") && name.ends_with(".bin")) out.insert(name);
    }
    return out;
  }

  std::unique_ptr<ckpt::S3ObjectStore> store_;
};

TEST_F(S3DatasetRun, TwoRanksTrainAsFromTheLocalDirectoryAndASecondRunReusesTheCache) {
  upload("ds");
  const size_t files = static_cast<size_t>(
      std::distance(fs::directory_iterator(data_root_ / "data"), fs::directory_iterator()));
  ASSERT_GE(files, 3u);

  CommandResult local = run_command(meshrun(2) + train_args(dir_ / "local", 6, 6));
  ASSERT_EQ(local.status, 0) << local.output;
  CommandResult first = run_command(env() + meshrun(2) + remote_args(dir_ / "first", "ds"));
  ASSERT_EQ(first.status, 0) << first.output;
  // One rank of the host downloaded every object; the other waited and reused them.
  EXPECT_EQ(count(first.output, "dataset " + server_->uri("ds") + ": " + std::to_string(files) +
                                    " object(s) fetched"),
            1u)
      << first.output;
  EXPECT_EQ(
      count(first.output, "0 object(s) fetched (0.0 MiB), " + std::to_string(files) + " reused"),
      1u)
      << first.output;
  bool same_bits = false;
  EXPECT_EQ(weights_difference(dir_ / "local", dir_ / "first", &same_bits), 0.0f);
  EXPECT_TRUE(same_bits);
  const auto cached = cached_objects();
  EXPECT_EQ(cached.size(), files);

  CommandResult second = run_command(env() + meshrun(2) + remote_args(dir_ / "second", "ds"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_EQ(second.output.find("fetching "), std::string::npos) << second.output;
  EXPECT_EQ(count(second.output, "0 object(s) fetched"), 2u) << second.output;
  EXPECT_EQ(cached_objects(), cached);  // nothing written again
  EXPECT_EQ(weights_difference(dir_ / "local", dir_ / "second", &same_bits), 0.0f);
  EXPECT_TRUE(same_bits);
}

TEST_F(S3DatasetRun, ShardByShardTwoRanksTrainAsFromTheLocalDirectoryFetchingOnlyWhatIsNear) {
  const fs::path local_dir = cut_and_upload(40, "ds40");
  const std::string blocks = " --set data.shard_block=1 --set data.prefetch_shards=1";
  CommandResult local =
      run_command(meshrun(2) + train_args(dir_ / "local", 6, 6,
                                          "--set data.dir=" + local_dir.string() + blocks));
  ASSERT_EQ(local.status, 0) << local.output;
  CommandResult remote =
      run_command(env() + meshrun(2) + remote_args(dir_ / "remote", "ds40") + blocks);
  ASSERT_EQ(remote.status, 0) << remote.output;
  bool same_bits = false;
  EXPECT_EQ(weights_difference(dir_ / "local", dir_ / "remote", &same_bits), 0.0f);
  EXPECT_TRUE(same_bits);
  // Six steps of 2 x 4 windows stay in the first block (one shard of about 170 windows): the
  // host holds that shard and the one after it, each downloaded by one of the two ranks.
  const fs::path view = dir_ / "cache" / "datasets" / "views" / server_->bucket() / "ds40";
  const std::set<std::string> held = train_shards_in(view);
  EXPECT_EQ(held.size(), 2u) << remote.output;
  data::SamplerOptions so{.seed = 1337, .num_replicas = 2};
  const data::TokenDataset sharded = data::TokenDataset::from_dir(local_dir.string(), "train", 32);
  so.num_windows = sharded.num_windows();
  so.shard_ends = sharded.shard_window_ends();
  so.shard_block = 1;
  const std::vector<int64_t> first = data::Sampler(so).upcoming_shards(1);
  ASSERT_EQ(first.size(), 2u);
  for (const int64_t s : first) {
    char name[32];
    std::snprintf(name, sizeof name, "train_%06d.bin", static_cast<int>(s));
    EXPECT_EQ(held.count(name), 1u) << name << "\n" << remote.output;
    EXPECT_EQ(count(remote.output, "fetched " + server_->uri("ds40/") + name), 1u) << name << "\n"
                                                                                   << remote.output;
  }
  EXPECT_EQ(count(remote.output, "40 train and 1 val shards"), 2u) << remote.output;

  // A second run finds them in the cache and downloads nothing it had.
  CommandResult again =
      run_command(env() + meshrun(2) + remote_args(dir_ / "again", "ds40") + blocks);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(again.output.find("data: fetched "), std::string::npos) << again.output;
  EXPECT_EQ(count(again.output, "3 in the cache"), 2u) << again.output;
  EXPECT_EQ(weights_difference(dir_ / "local", dir_ / "again", &same_bits), 0.0f);
  EXPECT_TRUE(same_bits);
}

TEST_F(S3DatasetRun, ShardByShardACorruptShardReachedMidRunIsOneLine) {
  const fs::path local_dir = cut_and_upload(40, "ds40");
  // The shard the sampler's second block reads (one process, blocks of one shard).
  const data::TokenDataset sharded = data::TokenDataset::from_dir(local_dir.string(), "train", 32);
  data::SamplerOptions so{.num_windows = sharded.num_windows(), .seed = 1337};
  so.shard_ends = sharded.shard_window_ends();
  so.shard_block = 1;
  data::Sampler sampler(so);
  const int64_t first = sampler.upcoming_shards(0).at(0);
  const std::vector<int64_t> two = sampler.upcoming_shards(1);
  ASSERT_EQ(two.size(), 2u);
  ASSERT_EQ(two[0], first);
  char name[32];
  std::snprintf(name, sizeof name, "train_%06d.bin", static_cast<int>(two[1]));
  const fs::path stored =
      dir_ / "s3" / "data" / server_->bucket() / "ds40" / (std::string(name) + "._S3rver_object");
  ASSERT_TRUE(fs::exists(stored));
  {
    std::fstream f(stored, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('\x5a');
  }
  const int64_t first_windows = so.shard_ends[static_cast<size_t>(first)] -
                                (first == 0 ? 0 : so.shard_ends[static_cast<size_t>(first - 1)]);
  const int64_t steps = first_windows / 4 + 10;  // into the second block
  CommandResult r = run_command(
      env() + kMeshtrainBin + " " +
      train_args(dir_ / "a", steps, 0,
                 "--set data.dir=" + server_->uri("ds40") + " --set data.shard_block=1"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, server_->uri("ds40/") + name + " is corrupt"), 1u) << r.output;
  // It trained through the first block before it met the shard.
  EXPECT_NE(r.output.find("step " + std::to_string(first_windows / 4 - 1) + "/"), std::string::npos)
      << r.output;
  for (const auto& [object, t] : cached_objects())
    EXPECT_FALSE(object.ends_with(".tmp") || object.ends_with(".part")) << object;
  EXPECT_EQ(train_shards_in(dir_ / "cache" / "datasets" / "views" / server_->bucket() / "ds40")
                .count(name),
            0u);
}

TEST_F(S3DatasetRun, ShardByShardABoundedCacheEvictsWhatTheSamplerLeftAndFetchesItAgain) {
  const fs::path local_dir = cut_and_upload(40, "ds40");
  const uint64_t shard_bytes = fs::file_size(local_dir / "train_000000.bin");
  data::RemoteDatasetOptions o = options();
  o.cache_limit = 6 * shard_bytes;
  auto source = std::make_shared<data::RemoteShards>(
      std::make_shared<ckpt::S3ObjectStore>(ckpt::S3Settings::from_environment(),
                                            server_->bucket()),
      ckpt::parse_object_uri(server_->uri("ds40")), o);
  auto remote = std::make_shared<data::TokenDataset>(source->shards("train"), source, 32);
  auto local = std::make_shared<data::TokenDataset>(
      data::TokenDataset::from_dir(local_dir.string(), "train", 32));
  data::SamplerOptions so{.seed = 7};
  so.shard_block = 1;
  data::DataLoader from_remote(remote, so, 4, /*shards_ahead=*/1);
  data::DataLoader from_local(local, so, 4);
  const int64_t batches = local->num_windows() * 3 / 2 / 4;  // an epoch and a half
  uint64_t most = 0;
  for (int64_t b = 0; b < batches; ++b) {
    auto [x, y] = from_remote.next();
    auto [lx, ly] = from_local.next();
    ASSERT_EQ(x.to_vector(), lx.to_vector()) << "batch " << b;
    ASSERT_EQ(y.to_vector(), ly.to_vector()) << "batch " << b;
    uint64_t held = 0;
    std::error_code ec;  // an object may be evicted while this looks
    for (const auto& e : fs::directory_iterator(dir_ / "cache" / "datasets" / "objects", ec)) {
      const uint64_t size = e.file_size(ec);
      if (!ec && !e.path().string().ends_with(".tmp") && !e.path().string().ends_with(".part"))
        held += size;
    }
    most = std::max(most, held);
  }
  // A fetch may finish between its eviction and the look above: one shard over the limit at most.
  EXPECT_LE(most, o.cache_limit + shard_bytes);
  // The first epoch's shards left the cache and came back in the second.
  EXPECT_GT(source->counts().fetched, 40);
}

TEST_F(S3DatasetRun, AChangedObjectIsFetchedAgainAndTheOthersReused) {
  upload("ds");
  const data::LocalDataset first =
      data::fetch_remote_dataset(*store_, ckpt::parse_object_uri(server_->uri("ds")), options());
  EXPECT_GE(first.fetched, 3);
  EXPECT_EQ(first.reused, 0);

  const std::string meta = file_bytes(data_root_ / "data" / "meta.json") + "\n";
  store_->put_bytes("ds/meta.json", meta);
  const data::LocalDataset second =
      data::fetch_remote_dataset(*store_, ckpt::parse_object_uri(server_->uri("ds")), options());
  EXPECT_EQ(second.dir, first.dir);
  EXPECT_EQ(second.fetched, 1);
  EXPECT_EQ(second.reused, first.fetched - 1);
  EXPECT_EQ(file_bytes(fs::path(second.dir) / "meta.json"), meta);

  // A shard removed from the bucket leaves the directory the loader reads.
  store_->remove("ds/val_000000.bin");
  const data::LocalDataset third =
      data::fetch_remote_dataset(*store_, ckpt::parse_object_uri(server_->uri("ds")), options());
  EXPECT_EQ(third.fetched, 0);
  EXPECT_FALSE(fs::exists(fs::path(third.dir) / "val_000000.bin"));
  EXPECT_TRUE(fs::exists(fs::path(third.dir) / "train_000000.bin"));
}

TEST_F(S3DatasetRun, TheLeftoversOfAKilledDownloadAreRemovedByTheNextFetch) {
  upload("ds");
  const fs::path objects = dir_ / "cache" / "datasets" / "objects";
  fs::create_directories(objects);
  // What a process killed in the middle of a download leaves: a temporary name, never the final.
  const auto info = store_->head("ds/train_000000.bin");
  ASSERT_TRUE(info.has_value());
  for (const std::string& name : {info->etag + ".4242.tmp", info->etag + ".4242.tmp.part"})
    std::ofstream(objects / name) << "half";
  const data::LocalDataset d =
      data::fetch_remote_dataset(*store_, ckpt::parse_object_uri(server_->uri("ds")), options());
  EXPECT_GE(d.fetched, 3);
  const auto cached = cached_objects();
  EXPECT_EQ(cached.size(), static_cast<size_t>(d.fetched));
  for (const auto& [name, t] : cached)
    EXPECT_FALSE(name.ends_with(".tmp") || name.ends_with(".part")) << name;
  EXPECT_EQ(fs::file_size(fs::path(d.dir) / "train_000000.bin"), info->size);
}

TEST_F(S3DatasetRun, DataFetchWarmsTheCacheBeforeAJob) {
  upload("ds");
  CommandResult fetch = run_command(env() + kMeshtrainBin + " data fetch " + server_->uri("ds"));
  ASSERT_EQ(fetch.status, 0) << fetch.output;
  const fs::path view = dir_ / "cache" / "datasets" / "views" / server_->bucket() / "ds";
  EXPECT_NE(fetch.output.find(view.string() + "\n"), std::string::npos) << fetch.output;
  EXPECT_TRUE(fs::exists(view / "train_000000.bin"));
  CommandResult run = run_command(env() + kMeshtrainBin + " " + remote_args(dir_ / "a", "ds"));
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.output.find("fetching "), std::string::npos) << run.output;
  EXPECT_EQ(count(run.output, "0 object(s) fetched"), 1u) << run.output;

  CommandResult local =
      run_command(env() + kMeshtrainBin + " data fetch " + (data_root_ / "data").string());
  EXPECT_EQ(local.status, 2) << local.output;
  EXPECT_NE(local.output.find("takes an s3://bucket/prefix URI"), std::string::npos)
      << local.output;
}

TEST_F(S3DatasetRun, ACorruptObjectIsOneLineAndNothingHalfWrittenStays) {
  upload("ds");
  // The server's copy changes behind its back: it still answers the ETag of what was uploaded.
  const fs::path stored =
      dir_ / "s3" / "data" / server_->bucket() / "ds" / "train_000000.bin._S3rver_object";
  ASSERT_TRUE(fs::exists(stored));
  {
    std::fstream f(stored, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('\x5a');
  }
  CommandResult r = run_command(env() + kMeshtrainBin + " " + remote_args(dir_ / "a", "ds"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, server_->uri("ds/train_000000.bin") + " is corrupt"), 1u) << r.output;
  EXPECT_NE(r.output.find("upload the file again"), std::string::npos) << r.output;
  const auto cached = cached_objects();
  for (const auto& [name, t] : cached) {
    EXPECT_FALSE(name.ends_with(".tmp") || name.ends_with(".part")) << name;
  }
  const auto info = store_->head("ds/train_000000.bin");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(cached.count(info->etag), 0u);
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "datasets" / "views" / server_->bucket() / "ds" /
                          "train_000000.bin"));
}

TEST_F(S3DatasetRun, AMissingMetaJsonIsOneLine) {
  upload("ds", "meta.json");
  CommandResult r = run_command(env() + kMeshtrainBin + " " + remote_args(dir_ / "a", "ds"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, server_->uri("ds/meta.json") + " is missing"), 1u) << r.output;
  EXPECT_NE(r.output.find("meshtrain data prepare"), std::string::npos) << r.output;
  EXPECT_TRUE(cached_objects().empty());
}

TEST_F(S3DatasetRun, WrongCredentialsAreOneLine) {
  upload("ds");
  const std::string cmd = "env AWS_ENDPOINT_URL=" + server_->endpoint() +
                          " AWS_ACCESS_KEY_ID=NOTAKEY AWS_SECRET_ACCESS_KEY=hush-hush-secret " +
                          "MESHTRAIN_S3_CACHE=" + (dir_ / "cache").string() + " " + kMeshtrainBin +
                          " " + remote_args(dir_ / "a", "ds");
  CommandResult r = run_command(cmd);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("hush-hush"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "access denied"), 1u) << r.output;
}

}  // namespace
}  // namespace meshtrain::testing
