// Tensor-parallel parts in checkpoints against the whole tensors: every rank of a layout writes
// its nn::TensorShard part (split on dim 0 or 1, the packed q, k, v rows in blocks, a padded
// vocabulary, sizes that do not divide), and the whole tensor, any other layout's parts, row
// ranges and flat ranges (what DDP, other tp degrees and ZeRO read) come back bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/tensor_part.h"
#include "meshtrain/util/error.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

using ::meshtrain::testing::TempDir;
using testing::bitwise_equal;
using testing::pattern;

struct Case {
  std::string name;
  Shape full;
  int64_t dim = 0;
  int64_t blocks = 1;
};

// Sizes that divide and sizes that leave padding, on both dimensions and in blocks.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"rows", {12, 5}, 0, 1},     // Shard(0), column-parallel weights
      {"odd_rows", {7, 3}, 0, 1},  // 7 rows over 2: 4 + 3 (one padding row)
      {"vocab", {31, 8}, 0, 1},    // a vocabulary of 31 over 4: 8, 8, 8, 7
      {"cols", {3, 10}, 1, 1},     // Shard(1), row-parallel weights; 10 over 4: 3, 3, 3, 1
      {"qkv", {12, 4}, 0, 3},      // Shard(0, blocks=3): q, k, v of 4 rows each
      {"qkv_bias", {6}, 0, 3},     // the packed bias: 3 blocks of 2
      {"cube", {2, 6, 3}, 1, 2},   // a middle dimension in 2 blocks
  };
  return c;
}

nn::TensorShard part_of(const Case& c, int index, int parts) {
  return nn::TensorShard{"tp", c.full, c.dim, c.blocks, index, parts};
}

// Writes every case's parts from `parts` thread-ranks (tp only), step 1.
void write_parts(const std::string& root, int parts) {
  testing::ThreadBarrier barrier(parts);
  testing::run_ranks(parts, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = root;
    wo.rank = rank;
    wo.layout = {.world_size = parts, .dp = 1, .tp = parts};
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    RankShards shards;
    for (size_t i = 0; i < cases().size(); ++i) {
      const Case& c = cases()[i];
      const nn::TensorShard s = part_of(c, static_cast<int>(rank), parts);
      add_tensor_part(shards, "model", c.name, s.take(pattern(c.full, static_cast<float>(i))), s);
    }
    writer.save(1, shards, {{"step", 1}});
    writer.wait();
  });
}

class TensorPartCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(TensorPartCheckpoint, AnyLayoutReadsWhatAnotherWrote) {
  const int written = GetParam();
  TempDir dir;
  write_parts(dir.file("ckpt"), written);
  const Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  for (size_t i = 0; i < cases().size(); ++i) {
    const Case& k = cases()[i];
    SCOPED_TRACE(k.name + " written by " + std::to_string(written) + " parts");
    const Tensor whole = pattern(k.full, static_cast<float>(i));
    const TensorRecord& t = c.manifest().tensor(k.name);
    EXPECT_EQ(t.shape, k.full);  // the whole tensor, without padding
    if (written > 1) {
      EXPECT_EQ(t.kind, ShardKind::dim);
      EXPECT_EQ(t.dim, k.dim);
      EXPECT_EQ(t.blocks, k.blocks);
    }
    EXPECT_TRUE(bitwise_equal(c.load_global_tensor(k.name), whole));
    // Every tp degree's parts, padding zero.
    for (int parts = 1; parts <= 4; ++parts)
      for (int r = 0; r < parts; ++r) {
        const nn::TensorShard s = part_of(k, r, parts);
        EXPECT_TRUE(bitwise_equal(load_tensor_part(c, k.name, s), s.take(whole)))
            << "part " << r << " of " << parts;
      }
    // Rows (DDP's load_shard, ZeRO's flat ranges) from a tensor split along another dimension.
    const int64_t rows = k.full[0];
    EXPECT_TRUE(bitwise_equal(c.load_rows(k.name, 1, rows - 2), whole.slice(1, rows - 1).clone()));
    const int64_t n = whole.numel();
    const Tensor flat = c.load_flat_range(k.name, 3, n - 2);
    const std::vector<float> want = whole.to_vector(), got = flat.to_vector();
    ASSERT_EQ(got.size(), static_cast<size_t>(n - 5));
    for (int64_t e = 3; e < n - 2; ++e)
      ASSERT_EQ(got[static_cast<size_t>(e - 3)], want[static_cast<size_t>(e)]) << "element " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, TensorPartCheckpoint, ::testing::Values(1, 2, 3, 4));

TEST(TensorPartCheckpoint, ManifestRecordsTheSplitDimensionAndBlocks) {
  TempDir dir;
  write_parts(dir.file("ckpt"), 2);
  const Manifest m = read_manifest(resolve_checkpoint_dir(dir.file("ckpt")));
  const auto j = m.to_json();
  for (const auto& t : j.at("tensors")) {
    if (t.at("name") == "cols") {
      EXPECT_EQ(t.at("sharding").at("dim"), 1);
      EXPECT_FALSE(t.at("sharding").contains("blocks"));
    }
    if (t.at("name") == "qkv") {
      EXPECT_EQ(t.at("sharding").at("dim"), 0);
      EXPECT_EQ(t.at("sharding").at("blocks"), 3);
      ASSERT_EQ(t.at("sharding").at("shards").size(), 2u);
      EXPECT_EQ(t.at("sharding").at("shards")[1].at("offset"), 2);  // rows 2..3 of each block
      EXPECT_EQ(t.at("sharding").at("shards")[1].at("length"), 2);
    }
  }
  // A vocabulary of 31 over 4 ranks: the last rank's 8 rows hold 7 real ones.
  write_parts(dir.file("ckpt4"), 4);
  const Manifest m4 = read_manifest(resolve_checkpoint_dir(dir.file("ckpt4")));
  const TensorRecord& vocab = m4.tensor("vocab");
  ASSERT_EQ(vocab.shards.size(), 4u);
  EXPECT_EQ(vocab.shards[3].offset, 24);
  EXPECT_EQ(vocab.shards[3].length, 7);
  // "cols" (10 over 4: 3, 3, 3, 1 real columns).
  EXPECT_EQ(m4.tensor("cols").shards[3].length, 1);
}

TEST(TensorPartCheckpoint, ManifestWithABadSplitIsRefusedNamingTheTensor) {
  TempDir dir;
  write_parts(dir.file("ckpt"), 2);
  const Manifest m = read_manifest(resolve_checkpoint_dir(dir.file("ckpt")));
  auto refused = [&](const std::string& tensor, const char* key, int value) {
    nlohmann::json j = nlohmann::json::parse(m.to_json().dump());
    for (auto& t : j["tensors"])
      if (t["name"] == tensor) t["sharding"][key] = value;
    try {
      Manifest::from_json(j, "manifest.json");
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string what = refused("cols", "dim", 2);  // "cols" is 3 x 10
  EXPECT_NE(what.find("tensor 'cols' of shape [3, 10] is sharded on dim 2"), std::string::npos)
      << what;
  what = refused("qkv", "blocks", 5);  // 12 rows are not 5 blocks
  EXPECT_NE(what.find("tensor 'qkv' has 5 blocks"), std::string::npos) << what;
  what = refused("qkv", "blocks", 2);  // 2 blocks of 6 rows: the pieces no longer tile a block
  EXPECT_NE(what.find("tensor 'qkv'"), std::string::npos) << what;
  EXPECT_EQ(what.find("accepted"), std::string::npos);
}

TEST(TensorPartCheckpoint, PartOfAnotherWholeShapeIsOneClearError) {
  TempDir dir;
  write_parts(dir.file("ckpt"), 2);
  const Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  const nn::TensorShard wrong{"tp", {13, 5}, 0, 1, 0, 2};
  try {
    load_tensor_part(c, "rows", wrong);
    FAIL() << "a part of a 13 x 5 tensor loaded from a 12 x 5 one";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tensor 'rows' is [12, 5]"), std::string::npos) << what;
    EXPECT_NE(what.find("cannot be resharded"), std::string::npos) << what;
  }
}

TEST(TensorPartCheckpoint, MissingOrDamagedPieceNamesTheFile) {
  TempDir dir;
  write_parts(dir.file("ckpt"), 2);
  const std::string step = resolve_checkpoint_dir(dir.file("ckpt"));
  testing::flip_byte((std::filesystem::path(step) / "model_rank00001.safetensors").string());
  std::vector<std::string> problems = verify_checkpoint(step);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("model_rank00001.safetensors"), std::string::npos) << problems[0];
  std::filesystem::remove(std::filesystem::path(step) / "model_rank00001.safetensors");
  problems = verify_checkpoint(step);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("model_rank00001.safetensors: missing"), std::string::npos)
      << problems[0];
  EXPECT_THROW(Checkpoint::open(step), IoError);
}

}  // namespace
}  // namespace meshtrain::ckpt
