// The S3 client and the checkpoint mirror against a real S3-compatible server (s3rver, started
// by each test): objects round-trip (multipart with parts in parallel too), wrong credentials
// are one line without the secret, an unreachable server is a transient error, checkpoints
// upload (manifest last) and come back into an empty root, a process SIGKILLed in the middle of
// an upload leaves the previous checkpoint the remote newest, and a corrupt remote object is
// named while the previous checkpoint is used.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/ckpt/remote_checkpoints.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/capability.h"
#include "tests/support/child_process.h"
#include "tests/support/s3_server.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::S3Server;
using meshtrain::testing::TempDir;
using meshtrain::testing::wait_until;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ObjectStore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = S3Server::missing()) MT_SKIP_UNLESS("s3rver", false, *why);
    server_ = std::make_unique<S3Server>(dir_.path() / "s3");
    ASSERT_TRUE(server_->start()) << read_all(dir_.file("s3/s3rver.log"));
    server_->set_env();
  }
  std::shared_ptr<ckpt::ObjectStore> store(TransferOptions o = {}) {
    return std::make_shared<S3ObjectStore>(S3Settings::from_environment(), server_->bucket(), o);
  }
  // Checkpoints of `steps` written into root by one rank.
  static void write_steps(const std::string& root, const std::vector<int64_t>& steps) {
    WriterOptions wo;
    wo.root = root;
    CheckpointWriter writer(wo);
    for (int64_t s : steps) {
      writer.save(s, testing::shards_for_step(s), {{"step", s}});
      writer.wait();
    }
  }
  TempDir dir_;
  std::unique_ptr<S3Server> server_;
};

// The file checksums uploads and downloads are checked with: the whole file and a range of an
// open one, against MD5's reference value for "abc" (RFC 1321).
TEST(ObjectMd5, FilesAndRangesHashAsTheirBytes) {
  TempDir dir;
  const std::string whole = dir.file("abc"), padded = dir.file("xabcx");
  std::ofstream(whole, std::ios::binary) << "abc";
  std::ofstream(padded, std::ios::binary) << "xabcx";
  const std::string want = "900150983cd24fb0d6963f7d28e17f72";
  EXPECT_EQ(md5_hex("abc", 3), want);
  EXPECT_EQ(md5_file_hex(whole), want);
  const int fd = ::open(padded.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(md5_file_hex(fd, 1, 3, "xabcx"), want);
  try {
    (void)md5_file_hex(fd, 1, 10, "the body of s3://b/k");
    ADD_FAILURE() << "a range past the end was hashed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("the body of s3://b/k"), std::string::npos) << e.what();
  }
  ::close(fd);
  EXPECT_THROW((void)md5_file_hex(dir.file("missing")), IoError);
}

TEST_F(ObjectStore, ObjectsRoundTripAlsoMultipartInParallel) {
  TransferOptions o;
  o.part_size = 5 << 20;
  o.multipart_threshold = 5 << 20;
  o.parallel = 4;
  auto s = store(o);
  s->put_bytes("a/small", "hello");
  EXPECT_EQ(s->get_bytes("a/small").value_or(""), "hello");
  EXPECT_FALSE(s->get_bytes("a/none").has_value());

  std::string big(23 << 20, '\0');  // 5 parts, the last one short
  std::mt19937_64 rng(7);
  for (auto& c : big) c = static_cast<char>(rng());
  const std::string src = dir_.file("big.bin");
  std::ofstream(src, std::ios::binary).write(big.data(), static_cast<std::streamsize>(big.size()));
  s->put_file("a/big", src);
  const auto info = s->head("a/big");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->size, big.size());
  ASSERT_TRUE(s->get_file("a/big", dir_.file("back.bin")));
  EXPECT_TRUE(read_all(dir_.file("back.bin")) == big);
  // Ranges: the first KiB (a shard's header), one inside the third part, one past the end.
  EXPECT_TRUE(s->get_range("a/big", 0, 1024).value_or("") == big.substr(0, 1024));
  EXPECT_TRUE(s->get_range("a/big", (11 << 20) + 3, 777).value_or("") ==
              big.substr((11 << 20) + 3, 777));
  EXPECT_TRUE(s->get_range("a/big", big.size() - 10, 100).value_or("") ==
              big.substr(big.size() - 10));
  EXPECT_FALSE(s->get_range("a/none", 0, 16).has_value());

  const auto listed = s->list("a/");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "a/big");
  EXPECT_EQ(listed[1].key, "a/small");
  s->remove("a/small");
  s->remove("a/small");  // a missing object is no error
  EXPECT_EQ(s->list("a/").size(), 1u);
}

TEST_F(ObjectStore, WrongCredentialsAreOneLineWithoutTheSecret) {
  S3Settings bad = S3Settings::from_environment();
  bad.access_key = "WRONGKEYID";
  bad.secret_key = "TOPSECRET-do-not-print";
  S3ObjectStore s(bad, server_->bucket());
  try {
    s.list("x/");
    FAIL() << "listing with a wrong key succeeded";
  } catch (const ObjectStoreAuthError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.find("TOPSECRET"), std::string::npos) << what;
    EXPECT_NE(what.find("access denied"), std::string::npos) << what;
    EXPECT_NE(what.find("InvalidAccessKeyId"), std::string::npos) << what;
  }
}

TEST_F(ObjectStore, AnUnreachableServerIsATransientError) {
  S3Settings gone = S3Settings::from_environment();
  server_->stop();
  TransferOptions o;
  o.retries = 1;
  o.backoff_s = 0.01;
  S3ObjectStore s(gone, server_->bucket(), o);
  try {
    s.put_bytes("x/y", "z");
    FAIL() << "a put to a stopped server succeeded";
  } catch (const ObjectStoreAuthError&) {
    FAIL() << "not an auth error";
  } catch (const ObjectStoreError& e) {
    EXPECT_TRUE(e.transient()) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 tries"), std::string::npos) << e.what();
  }
}

TEST_F(ObjectStore, MirrorUploadsKeepsRetentionAndAnEmptyRootResumes) {
  const std::string root = dir_.file("local");
  write_steps(root, {4, 8, 12});
  auto s = store();
  const ObjectUri uri = parse_object_uri(server_->uri("run1"));
  {
    MirrorOptions mo;
    mo.uri = uri;
    mo.local_root = root;
    mo.retention.keep_last = 2;
    CheckpointMirror mirror(s, mo);
    for (int64_t step : {4, 8, 12}) mirror.enqueue(step);
    ASSERT_TRUE(mirror.drain(60));
    EXPECT_EQ(mirror.status().newest_step, 12);
    EXPECT_EQ(mirror.status().uploaded, 3);
  }
  const auto remote = remote_complete_steps(*s, uri);
  ASSERT_EQ(remote.size(), 2u);  // keep_last = 2 on the remote copy too
  EXPECT_EQ(remote[0].step, 8);
  EXPECT_EQ(remote[1].step, 12);
  EXPECT_EQ(read_remote_pointer(*s, uri, kLatestFile), 12);
  EXPECT_TRUE(s->list(uri.key("step_4/")).empty());

  const std::string fresh = dir_.file("fresh");
  const FetchResult r = fetch_newest(*s, uri, fresh);
  EXPECT_TRUE(r.rejections.empty());
  ASSERT_EQ(r.step, 12);
  EXPECT_EQ(read_latest(fresh), "step_12");
  const Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(fresh));  // verified
  EXPECT_EQ(c.step(), 12);
  // A second fetch finds nothing newer.
  EXPECT_FALSE(fetch_newest(*s, uri, fresh).step.has_value());
}

TEST_F(ObjectStore, SigkillDuringAnUploadLeavesThePreviousCheckpointNewest) {
  const std::string root = dir_.file("local");
  write_steps(root, {4, 8});
  const ObjectUri uri = parse_object_uri(server_->uri("killed"));
  {
    MirrorOptions mo;
    mo.uri = uri;
    mo.local_root = root;
    CheckpointMirror mirror(store(), mo);
    mirror.enqueue(4);
    ASSERT_TRUE(mirror.drain(60));
  }
  const std::string marker = dir_.file("uploading");
  // A process that uploads step 8 and stops for good after its first object: SIGKILLed there.
  meshtrain::testing::ChildProcess child = meshtrain::testing::fork_child([&] {
    MirrorOptions mo;
    mo.uri = uri;
    mo.local_root = root;
    mo.parallel = 1;  // one object at a time: the first is complete when the second starts
    int puts = 0;
    mo.before_put = [&](const std::string&) {
      if (++puts == 2) {
        std::ofstream(marker) << "1";
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    };
    CheckpointMirror mirror(store(), mo);
    mirror.enqueue(8);
    mirror.drain(600);
    return 0;
  });
  ASSERT_TRUE(wait_until([&] { return fs::exists(marker); }, std::chrono::seconds(60)));
  child.kill_and_reap();
  auto s = store();
  EXPECT_FALSE(s->list(uri.key("step_8/")).empty());  // half uploaded
  const auto remote = remote_complete_steps(*s, uri);
  ASSERT_EQ(remote.size(), 1u);
  EXPECT_EQ(remote.back().step, 4);
  EXPECT_EQ(read_remote_pointer(*s, uri, kLatestFile), 4);
  const FetchResult r = fetch_newest(*s, uri, dir_.file("fresh"));
  EXPECT_EQ(r.step, 4);
  // The next upload of the step completes it and removes nothing it needs.
  MirrorOptions mo;
  mo.uri = uri;
  mo.local_root = root;
  CheckpointMirror mirror(s, mo);
  mirror.enqueue(8);
  ASSERT_TRUE(mirror.drain(60));
  EXPECT_EQ(remote_complete_steps(*s, uri).back().step, 8);
}

TEST_F(ObjectStore, ACorruptRemoteObjectIsNamedAndThePreviousCheckpointUsed) {
  const std::string root = dir_.file("local");
  write_steps(root, {4, 8});
  auto s = store();
  const ObjectUri uri = parse_object_uri(server_->uri("corrupt"));
  {
    MirrorOptions mo;
    mo.uri = uri;
    mo.local_root = root;
    CheckpointMirror mirror(s, mo);
    mirror.enqueue(4);
    mirror.enqueue(8);
    ASSERT_TRUE(mirror.drain(60));
  }
  const std::string file = shard_file_name("model", 0);
  std::string bytes = s->get_bytes(uri.key("step_8/" + file)).value();
  bytes[bytes.size() - 1] ^= 0x5a;
  s->put_bytes(uri.key("step_8/" + file), bytes);
  const std::string fresh = dir_.file("fresh");
  const FetchResult r = fetch_newest(*s, uri, fresh);
  ASSERT_EQ(r.rejections.size(), 1u);
  EXPECT_NE(r.rejections[0].find(server_->uri("corrupt/step_8/" + file) + " is corrupt"),
            std::string::npos)
      << r.rejections[0];
  EXPECT_EQ(r.step, 4);
  EXPECT_EQ(list_complete_steps(fresh), std::vector<int64_t>{4});
  EXPECT_EQ(Checkpoint::open(resolve_checkpoint_dir(fresh)).step(), 4);
}

}  // namespace
}  // namespace meshtrain::ckpt
