// prepare_text: shards and meta.json from a text file, the line-boundary split, and errors.
#include "meshtrain/data/prepare.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/token_shard.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using meshtrain::testing::read_bytes;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_bytes;

std::string shard_text(const std::string& path) {
  TokenShard shard(path);
  std::vector<int32_t> ids(static_cast<size_t>(shard.size()));
  shard.read(0, ids);
  return ByteTokenizer().decode(ids);
}

TEST(Prepare, SplitsAtLineBoundaryAndWritesMeta) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "fortune number " + std::to_string(i) + "\n";
  write_bytes(dir.file("in.txt"), text);
  PrepareResult r = prepare_text(dir.file("in.txt"), dir.file("out"), 0.1);

  const std::string train = shard_text(r.train_path);
  const std::string val = shard_text(r.val_path);
  EXPECT_EQ(train + val, text);
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(train.back(), '\n');  // the split is at the start of a line
  EXPECT_TRUE(val.starts_with("fortune number "));
  const double frac = static_cast<double>(val.size()) / static_cast<double>(text.size());
  EXPECT_NEAR(frac, 0.1, 0.02);
  EXPECT_EQ(r.train_tokens, static_cast<int64_t>(train.size()));
  EXPECT_EQ(r.val_tokens, static_cast<int64_t>(val.size()));

  auto meta = nlohmann::json::parse(read_bytes(r.meta_path));
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 257);
  EXPECT_EQ(meta["train_tokens"], r.train_tokens);
  EXPECT_EQ(meta["val_tokens"], r.val_tokens);
  EXPECT_EQ(meta["source"], dir.file("in.txt"));
  EXPECT_EQ(meta["source_xxh3"], hash_hex(xxh3_64(text)));
  EXPECT_EQ(meta["source_xxh3"], hash_hex(xxh3_64_file(dir.file("in.txt"))));
  EXPECT_NE(prepare_summary(r).find(std::to_string(r.train_tokens)), std::string::npos);
}

TEST(Prepare, ZeroValFractionAndSingleLine) {
  TempDir dir;
  const std::string line = "one line without a newline at all, long enough to split";
  write_bytes(dir.file("a.txt"), line);
  PrepareResult r = prepare_text(dir.file("a.txt"), dir.file("o1"), 0.0);
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_EQ(r.train_tokens, static_cast<int64_t>(line.size()));
  PrepareResult s = prepare_text(dir.file("a.txt"), dir.file("o2"), 0.25);
  EXPECT_EQ(s.train_tokens + s.val_tokens, static_cast<int64_t>(line.size()));
  EXPECT_GT(s.val_tokens, 0);
}

TEST(Prepare, Errors) {
  TempDir dir;
  try {
    prepare_text(dir.file("missing.txt"), dir.file("out"), 0.1);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  write_bytes(dir.file("empty.txt"), "");
  try {
    prepare_text(dir.file("empty.txt"), dir.file("out"), 0.1);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  write_bytes(dir.file("ok.txt"), "a\nb\n");
  EXPECT_THROW(prepare_text(dir.file("ok.txt"), dir.file("out"), 1.0), ValueError);
  EXPECT_THROW(prepare_text(dir.file("ok.txt"), dir.file("out"), -0.5), ValueError);
}

}  // namespace
}  // namespace meshtrain::data
