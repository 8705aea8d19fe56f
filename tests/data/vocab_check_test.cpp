// The data/model agreement check: a shard holding an id past the vocabulary is named, with the
// id and the config key, before any step runs; ids below it pass.
#include "meshtrain/data/vocab_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshtrain/data/token_shard.h"
#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using meshtrain::testing::TempDir;

TEST(VocabCheck, NamesTheShardTheIdAndTheKey) {
  TempDir dir;
  std::vector<int32_t> fine(200), bad(200);
  for (size_t i = 0; i < fine.size(); ++i) fine[i] = static_cast<int32_t>(i % 10);
  bad = fine;
  bad[77] = 118;
  write_token_shard(dir.file("train_000000.bin"), fine);
  write_token_shard(dir.file("train_000001.bin"), bad);
  write_token_shard(dir.file("val_000000.bin"), fine);
  const TokenDataset train = TokenDataset::from_dir(dir.path().string(), "train", 16);
  const TokenDataset val = TokenDataset::from_dir(dir.path().string(), "val", 16);
  EXPECT_NO_THROW(check_vocab_fits({&train, &val}, 119));
  EXPECT_NO_THROW(check_vocab_fits({&val}, 10));
  try {
    check_vocab_fits({&train, &val}, 10);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir.file("train_000001.bin")), std::string::npos) << what;
    EXPECT_NE(what.find("token id 118"), std::string::npos) << what;
    EXPECT_NE(what.find("model.vocab_size = 10"), std::string::npos) << what;
    EXPECT_NE(what.find("at least 119"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace meshtrain::data
