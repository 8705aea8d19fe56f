// data.dir = s3://... end to end against a real S3-compatible server (s3rver): two ranks under
// meshrun train exactly as from the local directory, a second run reuses the host's cache without
// a download, a changed object is fetched again, and a corrupt object or a missing meta.json stops
// the run with one line naming the object, leaving nothing half written in the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/data/remote_dataset.h"
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
