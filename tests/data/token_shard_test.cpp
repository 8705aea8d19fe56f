// Token shards: llm.c layout byte for byte, round trips, and clear errors for damaged files.
#include "meshtrain/data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using meshtrain::testing::read_bytes;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_bytes;

std::vector<int32_t> sample_tokens(size_t n, int32_t max) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + 13) % (max + 1));
  return t;
}

template <typename T>
T at(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

TEST(TokenShard, WritesLlmcLayout) {
  TempDir dir;
  const std::string path = dir.file("train_000000.bin");
  std::vector<int32_t> tokens = {1, 2, 65535, 0, 300};
  write_token_shard(path, tokens);
  std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024 + 2 * tokens.size());
  EXPECT_EQ(at<int32_t>(bytes, 0), 20240520);
  EXPECT_EQ(at<int32_t>(bytes, 4), 1);
  EXPECT_EQ(at<int32_t>(bytes, 8), 5);
  // Ints 3 and 4 record the largest token id (llm.c leaves them zero and ignores them).
  EXPECT_EQ(at<int32_t>(bytes, 12), kShardMaxTokenTag);
  EXPECT_EQ(at<int32_t>(bytes, 16), 65535);
  for (size_t i = 5; i < 256; ++i) EXPECT_EQ(at<int32_t>(bytes, 4 * i), 0) << i;
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(at<uint16_t>(bytes, 1024 + 2 * i), tokens[i]);
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShard, RoundTripU16AndU32) {
  TempDir dir;
  for (TokenWidth width : {TokenWidth::u16, TokenWidth::u32}) {
    const std::string path = dir.file("shard.bin");
    std::vector<int32_t> tokens = sample_tokens(10007, width == TokenWidth::u16 ? 65535 : 200000);
    write_token_shard(path, tokens, width);
    TokenShard shard(path);
    EXPECT_EQ(shard.width(), width);
    ASSERT_EQ(shard.size(), static_cast<int64_t>(tokens.size()));
    std::vector<int32_t> back(tokens.size());
    shard.read(0, back);
    EXPECT_EQ(back, tokens);
    EXPECT_EQ(shard[1234], tokens[1234]);
    std::vector<int32_t> part(10);
    shard.read(500, part);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), tokens.begin() + 500));
  }
}

// A shard written before the largest id was recorded (or by llm.c) has zeros there: the
// tokens are scanned instead, with the same answer.
TEST(TokenShard, LargestTokenIsRecordedOrScanned) {
  TempDir dir;
  for (TokenWidth width : {TokenWidth::u16, TokenWidth::u32}) {
    const std::string path = dir.file("shard.bin");
    std::vector<int32_t> tokens = sample_tokens(5000, 300);
    tokens[4321] = width == TokenWidth::u16 ? 40000 : 150000;
    write_token_shard(path, tokens, width);
    {
      TokenShard shard(path);
      EXPECT_TRUE(shard.max_token_recorded());
      EXPECT_EQ(shard.max_token(), tokens[4321]);
    }
    std::string bytes = read_bytes(path);
    std::memset(bytes.data() + 12, 0, 8);
    write_bytes(path, bytes);
    TokenShard old(path);
    EXPECT_FALSE(old.max_token_recorded());
    EXPECT_EQ(old.max_token(), tokens[4321]);
    // A recorded value the tokens cannot hold is not believed.
    const int32_t bogus[2] = {kShardMaxTokenTag, -7};
    std::memcpy(bytes.data() + 12, bogus, 8);
    write_bytes(path, bytes);
    TokenShard odd(path);
    EXPECT_FALSE(odd.max_token_recorded());
    EXPECT_EQ(odd.max_token(), tokens[4321]);
  }
  write_token_shard(dir.file("e.bin"), {});
  EXPECT_EQ(TokenShard(dir.file("e.bin")).max_token(), -1);
}

TEST(TokenShard, EmptyShardIsValid) {
  TempDir dir;
  write_token_shard(dir.file("e.bin"), {});
  TokenShard shard(dir.file("e.bin"));
  EXPECT_EQ(shard.size(), 0);
}

TEST(TokenShard, RejectsTokensThatDoNotFit) {
  TempDir dir;
  std::vector<int32_t> tokens = {1, 70000};
  EXPECT_THROW(write_token_shard(dir.file("x.bin"), tokens), ValueError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin.tmp")));
}

TEST(TokenShard, TruncatedFileNamesFileAndSizes) {
  TempDir dir;
  const std::string path = dir.file("train_000000.bin");
  write_token_shard(path, sample_tokens(100, 255));
  std::filesystem::resize_file(path, 1024 + 2 * 60);
  try {
    TokenShard shard(path);
    FAIL() << "truncated shard accepted";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(1024 + 2 * 100)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(1024 + 2 * 60)), std::string::npos) << msg;
    EXPECT_NE(msg.find("meshtrain data prepare"), std::string::npos) << msg;
  }
  // Shorter than the header itself.
  std::filesystem::resize_file(path, 100);
  EXPECT_THROW(TokenShard{path}, IoError);
  write_bytes(path, "");
  EXPECT_THROW(TokenShard{path}, IoError);
}

TEST(TokenShard, BadMagicAndVersion) {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  write_token_shard(path, sample_tokens(10, 255));
  std::string bytes = read_bytes(path);

  std::string bad_magic = bytes;
  int32_t magic = 12345;
  std::memcpy(bad_magic.data(), &magic, 4);
  write_bytes(path, bad_magic);
  try {
    TokenShard shard(path);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }

  std::string bad_version = bytes;
  int32_t version = 2;
  std::memcpy(bad_version.data() + 4, &version, 4);
  write_bytes(path, bad_version);
  try {
    TokenShard shard(path);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("version 2"), std::string::npos) << e.what();
  }

  std::string negative = bytes;
  int32_t count = -5;
  std::memcpy(negative.data() + 8, &count, 4);
  write_bytes(path, negative);
  EXPECT_THROW(TokenShard{path}, IoError);

  std::string longer = bytes + "xx";
  write_bytes(path, longer);
  EXPECT_THROW(TokenShard{path}, IoError);
}

TEST(TokenShard, MissingFile) {
  TempDir dir;
  try {
    TokenShard shard(dir.file("nope.bin"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.bin"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshtrain::data
