// TokenDataset: windows are the text shifted by one, indexing across shards, too-short errors.
#include "meshtrain/data/token_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using meshtrain::testing::TempDir;

std::string sample_text(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i) s += "line " + std::to_string(i * 31 % 97) + " of text\n";
  s.resize(n);
  return s;
}

TEST(TokenDataset, WindowsAreTextShiftedByOne) {
  TempDir dir;
  const std::string text = sample_text(1000);
  ByteTokenizer tok;
  write_token_shard(dir.file("train_000000.bin"), tok.encode(text));
  const int64_t T = 16;
  TokenDataset ds = TokenDataset::from_dir(dir.path().string(), "train", T);
  EXPECT_EQ(ds.num_windows(), (1000 - (T + 1)) / T + 1);
  EXPECT_EQ(ds.num_tokens(), 1000);

  std::vector<int64_t> idx = {0, 5, ds.num_windows() - 1, 5};
  auto [x, y] = ds.get_batch(idx);
  ASSERT_EQ(x.shape(), (Shape{4, T}));
  ASSERT_EQ(y.shape(), (Shape{4, T}));
  ASSERT_EQ(x.dtype(), DType::i32);
  const int32_t* xs = x.data<int32_t>();
  const int32_t* ys = y.data<int32_t>();
  for (size_t b = 0; b < idx.size(); ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const size_t pos = static_cast<size_t>(idx[b] * T + t);
      EXPECT_EQ(xs[b * T + t], static_cast<unsigned char>(text[pos]));
      EXPECT_EQ(ys[b * T + t], static_cast<unsigned char>(text[pos + 1]));
    }
  }
  EXPECT_THROW(ds.get_batch({ds.num_windows()}), ValueError);
  EXPECT_THROW(ds.get_batch({-1}), ValueError);
}

TEST(TokenDataset, StrideAndShards) {
  TempDir dir;
  std::vector<int32_t> a(100), b(50), c(5);
  for (int i = 0; i < 100; ++i) a[i] = i;
  for (int i = 0; i < 50; ++i) b[i] = 1000 + i;
  for (int i = 0; i < 5; ++i) c[i] = 2000 + i;
  write_token_shard(dir.file("train_000000.bin"), a);
  write_token_shard(dir.file("train_000001.bin"), b);
  write_token_shard(dir.file("train_000002.bin"), c);  // too short: skipped
  write_token_shard(dir.file("val_000000.bin"), c);    // not part of the train split
  const int64_t T = 8, stride = 3;
  TokenDataset ds = TokenDataset::from_dir(dir.path().string(), "train", T, stride);
  EXPECT_EQ(ds.num_shards(), 2);
  const int64_t wa = (100 - 9) / 3 + 1, wb = (50 - 9) / 3 + 1;
  ASSERT_EQ(ds.num_windows(), wa + wb);
  std::vector<int32_t> x(T), y(T);
  ds.window(wa - 1, x.data(), y.data());
  EXPECT_EQ(x[0], (wa - 1) * 3);
  EXPECT_EQ(y[T - 1], (wa - 1) * 3 + T);
  EXPECT_LE(y[T - 1], 99);
  ds.window(wa, x.data(), y.data());  // first window of the second shard
  EXPECT_EQ(x[0], 1000);
  EXPECT_EQ(y[0], 1001);
  ds.window(wa + wb - 1, x.data(), y.data());
  EXPECT_EQ(x[0], 1000 + (wb - 1) * 3);
  EXPECT_LE(y[T - 1], 1049);
}

TEST(TokenDataset, TooShortNamesFileAndNumbers) {
  TempDir dir;
  std::vector<int32_t> tokens(50, 7);
  write_token_shard(dir.file("val_000000.bin"), tokens);
  try {
    TokenDataset ds = TokenDataset::from_dir(dir.path().string(), "val", 128);
    FAIL() << "short dataset accepted";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("val_000000.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has 50 tokens, needs at least 129 for context 128"), std::string::npos)
        << msg;
  }
  // Exactly one window fits with T + 1 tokens.
  TokenDataset ok = TokenDataset::from_dir(dir.path().string(), "val", 49);
  EXPECT_EQ(ok.num_windows(), 1);
}

TEST(TokenDataset, MissingDirectoryOrShards) {
  TempDir dir;
  try {
    TokenDataset::from_dir(dir.file("absent"), "train", 8);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos);
  }
  try {
    TokenDataset::from_dir(dir.path().string(), "train", 8);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("train_*.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenDataset({dir.file("x.bin")}, 0), ValueError);
  // A relative directory says where it was looked for; an absolute one needs no such note.
  try {
    TokenDataset::from_dir("relative/absent_data", "train", 8);
    FAIL();
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("data directory relative/absent_data (a relative path, resolved from the "
                        "current directory " +
                        std::filesystem::current_path().string() + ") does not exist"),
              std::string::npos)
        << what;
  }
  try {
    TokenDataset::from_dir(dir.file("absent"), "train", 8);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).find("relative path"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::data

namespace meshtrain::data {
namespace {

// Shards in a local directory handed out by name, recording what was asked for.
class RecordingSource : public ShardSource {
 public:
  explicit RecordingSource(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string require(const std::string& name) override {
    const std::lock_guard<std::mutex> lock(mu_);
    required.push_back(name);
    return (dir_ / name).string();
  }
  void expect(const std::vector<std::string>& names) override {
    const std::lock_guard<std::mutex> lock(mu_);
    expected.push_back(names);
  }
  std::string where(const std::string& name) const override { return "remote:" + name; }

  std::vector<std::string> required;
  std::vector<std::vector<std::string>> expected;

 private:
  std::filesystem::path dir_;
  std::mutex mu_;
};

TEST(TokenDataset, OnDemandShardsOpenWhenFirstReadAndMatchTheLocalDataset) {
  TempDir dir;
  ByteTokenizer tok;
  std::vector<TokenDataset::RemoteShard> remote;
  for (int i = 0; i < 4; ++i) {
    const std::string name = "train_00000" + std::to_string(i) + ".bin";
    write_token_shard(dir.file(name), tok.encode(sample_text(200 + 100 * static_cast<size_t>(i))));
    remote.push_back({name, TokenShard(dir.file(name)).header()});
  }
  const int64_t T = 16;
  const TokenDataset local = TokenDataset::from_dir(dir.path().string(), "train", T);
  auto source = std::make_shared<RecordingSource>(dir.path());
  auto lazy = std::make_shared<TokenDataset>(remote, source, T);
  ASSERT_TRUE(lazy->on_demand());
  EXPECT_EQ(lazy->num_windows(), local.num_windows());
  EXPECT_EQ(lazy->shard_window_ends(), local.shard_window_ends());
  EXPECT_TRUE(source->required.empty());  // headers only until a window is read

  // A window of the third shard opens that shard alone; its tokens are the local dataset's.
  const int64_t w = lazy->shard_window_ends()[1] + 3;
  auto [x, y] = lazy->get_batch({w});
  auto [lx, ly] = local.get_batch({w});
  EXPECT_EQ(x.to_vector(), lx.to_vector());
  EXPECT_EQ(y.to_vector(), ly.to_vector());
  EXPECT_EQ(source->required, std::vector<std::string>{"train_000002.bin"});
  lazy->get_batch({w + 1});
  EXPECT_EQ(source->required.size(), 1u);  // opened once
  EXPECT_EQ(lazy->shard_label(0), "remote:train_000000.bin");
  EXPECT_EQ(lazy->shard_max_token(1), local.shard_max_token(1));  // from the header

  // A loader over shard blocks tells the source, before each batch, the block it reads and
  // the next shard; every window it reads is in a shard it expected.
  SamplerOptions so{.seed = 3};
  so.shard_block = 1;
  DataLoader loader(lazy, so, 4, /*shards_ahead=*/1);
  for (int b = 0; b < 30; ++b) {
    const size_t before = source->required.size();
    loader.next();
    ASSERT_EQ(source->expected.size(), static_cast<size_t>(b + 1));
    const std::vector<std::string>& exp = source->expected.back();
    ASSERT_EQ(exp.size(), 2u);
    for (size_t i = before; i < source->required.size(); ++i)
      EXPECT_NE(std::find(exp.begin(), exp.end(), source->required[i]), exp.end());
  }
  // Every shard opened; a shard the loader has left is closed, and opened again on its next visit
  // (30 batches of 4 are more than the 86 windows of an epoch).
  EXPECT_EQ(std::set<std::string>(source->required.begin(), source->required.end()).size(), 4u);
  EXPECT_GT(source->required.size(), 4u);
  EXPECT_LE(source->required.size(), 8u);
}

TEST(TokenDataset, AnOnDemandShardThatChangedSinceItsHeaderWasReadIsOneLine) {
  TempDir dir;
  ByteTokenizer tok;
  write_token_shard(dir.file("train_000000.bin"), tok.encode(sample_text(300)));
  ShardHeader header = TokenShard(dir.file("train_000000.bin")).header();
  header.num_tokens = 280;  // what the listing said before the object was replaced
  TokenDataset lazy({{"train_000000.bin", header}}, std::make_shared<RecordingSource>(dir.path()),
                    16);
  try {
    lazy.get_batch({0});
    FAIL() << "a changed shard was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("remote:train_000000.bin changed while the run read it"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::data
