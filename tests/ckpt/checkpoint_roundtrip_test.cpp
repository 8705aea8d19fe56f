// Checkpoint round trips: a GPT with its AdamW state and train state on one rank resumes
// bitwise; 2-4 simulated ranks (threads) write replicated and dim-0-sharded tensors that load
// back whole and reshard onto other world sizes (4 -> 2, 2 -> 3).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/tensor/random.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;
using testing::bitwise_equal;
using testing::pattern;

nn::GPTConfig tiny_gpt(uint64_t seed) {
  nn::GPTConfig c;
  c.vocab_size = 32;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = seed;
  return c;
}

// Deterministic pseudo-gradients for step s, so two models can take "the same" steps.
void set_grads(nn::GPT& model, int step) {
  int i = 0;
  for (auto& [name, p] : model.named_parameters()) {
    std::vector<float> g(static_cast<size_t>(p.numel()));
    for (size_t k = 0; k < g.size(); ++k)
      g[k] = std::sin(static_cast<float>(step * 31 + i * 7 + static_cast<int>(k % 97)));
    Tensor pp = p;
    pp.set_grad(Tensor::from_vector(g, p.shape()));
    ++i;
  }
}

optim::AdamWOptions adamw_options() {
  return {.lr = 0.01f, .beta2 = 0.95f, .weight_decay = 0.1f};
}

TEST(CheckpointRoundTrip, ModelOptimizerAndTrainStateResumeBitwise) {
  TempDir dir;
  const std::string root = dir.file("ckpt");

  nn::GPT model(tiny_gpt(1));
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1f), adamw_options());
  for (int s = 0; s < 2; ++s) {
    set_grads(model, s);
    opt.step();
  }
  data::Sampler sampler({.num_windows = 100, .seed = 5});
  sampler.next(37);
  Generator gen(99);
  for (int i = 0; i < 11; ++i) gen.next_u64();

  {
    WriterOptions wo;
    wo.root = root;
    CheckpointWriter writer(wo);
    RankShards shards;
    shards.add_replicated("model", model.state_dict());
    nlohmann::json state = {{"step", 2},
                            {"epoch", sampler.state().epoch},
                            {"sampler", sampler.state().to_json()},
                            {"rng", {{"data", generator_to_json(gen)}}},
                            {"lr_scheduler", {{"last_step", 2}}},
                            {"loss_scaler", {{"scale", 65536.0}, {"growth_tracker", 3}}}};
    state["optimizer"] = add_optimizer_state(shards, opt.state_dict());
    writer.save(2, shards, state);
    writer.wait();
    EXPECT_EQ(writer.last_saved_step(), 2);
  }
  ASSERT_EQ(read_latest(root), std::optional<std::string>("step_2"));

  CheckpointLoader loader(root);
  std::optional<Checkpoint> c = loader.load_latest();
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(loader.rejections().empty());
  EXPECT_EQ(c->step(), 2);
  EXPECT_EQ(c->manifest().software_version, MESHTRAIN_VERSION);
  EXPECT_EQ(c->manifest().world.world_size, 1);

  nn::GPT restored(tiny_gpt(2));  // different initialisation, overwritten by the load
  NamedTensors weights = c->load_group("model");
  restored.load_state_dict(std::map<std::string, Tensor>(weights.begin(), weights.end()));
  optim::AdamW opt2(optim::decay_groups(restored.named_parameters(), 0.1f), adamw_options());
  opt2.load_state_dict(load_optimizer_state(*c, c->train_state().at("optimizer")));
  data::Sampler sampler2({.num_windows = 100, .seed = 5});
  sampler2.set_state(data::SamplerState::from_json(c->train_state().at("sampler")));
  Generator gen2;
  generator_from_json(gen2, c->train_state().at("rng").at("data"));

  EXPECT_EQ(sampler2.state(), sampler.state());
  EXPECT_EQ(gen2.next_u64(), gen.next_u64());
  EXPECT_EQ(sampler2.next(5), sampler.next(5));
  EXPECT_EQ(c->train_state().at("loss_scaler").at("growth_tracker"), 3);
  EXPECT_EQ(opt2.step_count(), opt.step_count());

  // One more identical step on both: the resumed run matches the uninterrupted one bitwise.
  set_grads(model, 2);
  opt.step();
  set_grads(restored, 2);
  opt2.step();
  auto a = model.state_dict(), b = restored.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

// Writes one checkpoint from `world` thread-ranks. Every rank holds the replicated "emb" and
// "bias"; "table" (10 x 3) and "vec" (7) are split on dim 0 with even_rows; with tp = 2, "col"
// (6 x 2) is split in two and each half held by two ranks (copies).
void write_sharded(const std::string& root, int64_t world, int64_t step, int64_t tp = 1) {
  const Tensor table = pattern({10, 3}, 0.5f), vec = pattern({7}, 1.0f), col = pattern({6, 2});
  testing::ThreadBarrier barrier(world);
  testing::run_ranks(world, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = root;
    wo.rank = rank;
    wo.layout = {.world_size = world, .dp = world / tp, .tp = tp, .zero_stage = 1};
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    RankShards shards;
    shards.add_replicated("model", "emb", pattern({4, 5}));
    shards.add_replicated("model", "bias", pattern({5}, 0.25f));
    const RowRange t = even_rows(10, rank, world), v = even_rows(7, rank, world);
    shards.add_dim0("optim", "table", table.slice(t.offset, t.offset + t.length), 10, t.offset);
    shards.add_dim0("optim", "vec", vec.slice(v.offset, v.offset + v.length), 7, v.offset);
    if (tp > 1) {
      const RowRange cr = even_rows(6, rank % tp, tp);
      shards.add_dim0("model", "col", col.slice(cr.offset, cr.offset + cr.length), 6, cr.offset);
    }
    writer.save(step, shards, {{"step", step}, {"epoch", 1}});
    writer.wait();
  });
}

class ShardedCheckpoint : public ::testing::TestWithParam<int64_t> {};

TEST_P(ShardedCheckpoint, ReassemblesGlobalTensors) {
  const int64_t world = GetParam();
  TempDir dir;
  write_sharded(dir.file("ckpt"), world, 7);
  Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  const Manifest& m = c.manifest();
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.epoch, 1);
  EXPECT_EQ(m.world.world_size, world);
  EXPECT_EQ(m.world.zero_stage, 1);
  EXPECT_EQ(m.files.size(), static_cast<size_t>(3 * world));  // model, optim, record per rank
  EXPECT_EQ(m.tensor("emb").kind, ShardKind::replicated);
  EXPECT_EQ(m.tensor("emb").shards.size(), static_cast<size_t>(world));
  EXPECT_EQ(m.tensor("table").kind, ShardKind::dim);
  EXPECT_EQ(m.tensor("table").shape, (Shape{10, 3}));
  EXPECT_EQ(m.tensor("table").group, "optim");
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("emb"), pattern({4, 5})));
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("bias"), pattern({5}, 0.25f)));
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("table"), pattern({10, 3}, 0.5f)));
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("vec"), pattern({7}, 1.0f)));
  for (int64_t r = 0; r < world; ++r)
    EXPECT_TRUE(fs::exists(fs::path(c.dir()) / shard_file_name("optim", r))) << r;
  EXPECT_EQ(c.tensor_names("model"), (std::vector<std::string>{"emb", "bias"}));
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedCheckpoint, ::testing::Values(1, 2, 3, 4));

void expect_reshard(const Checkpoint& c, int64_t new_world) {
  const Tensor table = pattern({10, 3}, 0.5f), vec = pattern({7}, 1.0f);
  int64_t rows = 0;
  for (int64_t r = 0; r < new_world; ++r) {
    const RowRange t = even_rows(10, r, new_world), v = even_rows(7, r, new_world);
    Tensor mine = c.load_shard("table", r, new_world);
    EXPECT_TRUE(bitwise_equal(mine, table.slice(t.offset, t.offset + t.length).clone())) << r;
    EXPECT_TRUE(bitwise_equal(c.load_shard("vec", r, new_world),
                              vec.slice(v.offset, v.offset + v.length).clone()))
        << r;
    EXPECT_TRUE(bitwise_equal(c.load_shard("emb", r, new_world), pattern({4, 5}))) << r;
    rows += mine.size(0);
  }
  EXPECT_EQ(rows, 10);
}

TEST(Reshard, FourRanksOntoTwo) {
  TempDir dir;
  write_sharded(dir.file("ckpt"), 4, 3, /*tp=*/2);
  Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  expect_reshard(c, 2);
  // A tensor split across tp and copied across dp reassembles from one copy of each half.
  const TensorRecord& col = c.manifest().tensor("col");
  EXPECT_EQ(col.shards.size(), 4u);
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("col"), pattern({6, 2})));
  EXPECT_TRUE(bitwise_equal(c.load_rows("col", 2, 3), pattern({6, 2}).slice(2, 5).clone()));
}

TEST(Reshard, TwoRanksOntoThree) {
  TempDir dir;
  write_sharded(dir.file("ckpt"), 2, 3);
  Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  expect_reshard(c, 3);
}

TEST(Reshard, TwoRanksOntoThreeThenSavedAndLoadedOntoOne) {
  TempDir dir;
  write_sharded(dir.file("a"), 2, 3);
  Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("a")));
  // Three new ranks take their slices and write a new checkpoint, which one rank then reads.
  testing::ThreadBarrier barrier(3);
  testing::run_ranks(3, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = dir.file("b");
    wo.rank = rank;
    wo.layout.world_size = 3;
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    RankShards shards;
    const RowRange t = even_rows(10, rank, 3);
    shards.add_dim0("optim", "table", c.load_shard("table", rank, 3), 10, t.offset);
    writer.save(4, shards);
    writer.wait();
  });
  Checkpoint d = Checkpoint::open(resolve_checkpoint_dir(dir.file("b")));
  EXPECT_EQ(d.manifest().world.world_size, 3);
  EXPECT_TRUE(bitwise_equal(d.load_global_tensor("table"), pattern({10, 3}, 0.5f)));
}

TEST(ShardedCheckpointEmptyRanks, OnlyRankZeroWritesReplicatedState) {
  // Plain data parallelism: every rank has the same state, so only rank 0 contributes it; the
  // others still call save() (they take part in the barrier) with nothing to write.
  TempDir dir;
  testing::ThreadBarrier barrier(3);
  testing::run_ranks(3, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = dir.file("ckpt");
    wo.rank = rank;
    wo.layout = {.world_size = 3, .dp = 3};
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    RankShards shards;
    if (rank == 0) shards.add_replicated("model", "w", pattern({3, 3}));
    writer.save(1, shards, {{"step", 1}});
    writer.wait();
  });
  Checkpoint c = Checkpoint::open(resolve_checkpoint_dir(dir.file("ckpt")));
  EXPECT_EQ(c.manifest().files.size(), 4u);  // rank 0's model file and three rank records
  EXPECT_EQ(c.manifest().tensor("w").shards.size(), 1u);
  EXPECT_TRUE(bitwise_equal(c.load_shard("w", 2, 3), pattern({3, 3})));
}

TEST(Manifest, RejectsRanksThatDisagree) {
  TempDir dir;
  testing::ThreadBarrier barrier(2);
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = dir.file("ckpt");
    wo.rank = rank;
    wo.layout.world_size = 2;
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    RankShards shards;
    shards.add_replicated("model", "w", pattern({rank + 2}));  // shapes differ across ranks
    writer.save(1, shards);
    try {
      writer.wait();
    } catch (const IoError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("disagree on tensor 'w'"), std::string::npos) << errors[0];
  EXPECT_FALSE(read_latest(dir.file("ckpt")).has_value());
  EXPECT_TRUE(list_complete_steps(dir.file("ckpt")).empty());
}

}  // namespace
}  // namespace meshtrain::ckpt
