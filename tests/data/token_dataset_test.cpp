// TokenDataset: windows are the text shifted by one, indexing across shards, too-short errors.
#include "meshtrain/data/token_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "meshtrain/data/byte_tokenizer.h"
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
