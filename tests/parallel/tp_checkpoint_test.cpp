// Checkpoints of tensor-parallel engines, ranks as threads over shm: a tp = 2 engine's
// checkpoint holds the plain model's whole tensors (unpadded vocabulary, q, k and v in order),
// loads into a plain engine with exactly the gathered parameters, the plain engine's own
// checkpoint holds the same tensors bit for bit, and it loads back into fresh tp = 2 engines that
// then train on with the same bits as the engines that never stopped. A checkpoint of another model
// is one clear error that leaves the engine as it was.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/placed_state.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"
#include "meshtrain/tensor/random.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

using ::meshtrain::testing::TempDir;

constexpr int64_t kB = 2, kT = 8;

nn::GPTConfig tiny(bool sp) {
  nn::GPTConfig c;
  c.vocab_size = 31;  // pads to 32 over 2 ranks: the second rank's last row is padding
  c.block_size = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  c.dropout = 0.0f;
  c.tie_embeddings = sp;  // both heads: the tied embedding and an untied lm_head
  c.seed = 4;
  return c;
}

Batch batch(int64_t step) {
  Generator g(900 + static_cast<uint64_t>(step));
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(31));
  for (auto& t : y) t = static_cast<int32_t>(g.below(31));
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

EngineOptions options() {
  EngineOptions o;
  o.adamw.lr = 1e-2f;
  o.weight_decay = 0.1f;
  return o;
}

std::unique_ptr<TrainEngine> tp_engine(const comm::ProcessGroupPtr& tp, bool sp) {
  EngineOptions o = options();
  o.sequence_parallel = sp;
  return testing::gpt_engine(tiny(sp), DeviceMesh(tp, {{"pp", 1}, {"dp", 1}, {"tp", tp->size()}}),
                             o);
}

std::vector<float> train(TrainEngine& e, int64_t from, int64_t to) {
  std::vector<float> losses;
  for (int64_t s = from; s < to; ++s) {
    StepOptions so;
    so.step = s + 1;
    so.lr = 1e-2f;
    losses.push_back(e.train_step({batch(s)}, so).loss);
  }
  return losses;
}

// Saves `engine` (this rank's part) at `step` into `root` as rank `rank` of `world`.
nlohmann::json save(TrainEngine& engine, const std::string& root, int64_t step, int rank, int world,
                    int tp, ckpt::testing::ThreadBarrier* barrier) {
  ckpt::WriterOptions wo;
  wo.root = root;
  wo.rank = rank;
  wo.layout = {.world_size = world, .dp = world / tp, .tp = tp};
  if (barrier) wo.barrier = barrier->callback();
  ckpt::CheckpointWriter writer(wo);
  ckpt::RankShards shards;
  const nlohmann::json scalars = engine.checkpoint_state(shards, rank);
  writer.save(step, shards, {{"step", step}, {"optimizer", scalars}});
  writer.wait();
  return scalars;
}

using testing::same_bits;

class TpCheckpoint : public ::testing::TestWithParam<bool> {};

TEST_P(TpCheckpoint, RoundTripsThroughAPlainEngineBitForBit) {
  const bool sp = GetParam();
  omp_set_num_threads(1);
  TempDir dir;
  const std::string tp_root = dir.file("tp"), plain_root = dir.file("plain");
  constexpr int64_t kFirst = 3, kMore = 3;

  // tp = 2 trains kFirst steps and saves; its whole parameters are gathered for comparison.
  std::vector<std::vector<float>> straight(2), resumed(2);
  nn::NamedTensors whole_at_save;
  std::vector<std::map<std::string, Tensor>> local_after(2), resumed_after(2);
  {
    ckpt::testing::ThreadBarrier barrier(2);
    testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
      omp_set_num_threads(1);
      auto e = tp_engine(g, sp);
      train(*e, 0, kFirst);
      save(*e, tp_root, kFirst, r, 2, 2, &barrier);
      nn::NamedTensors whole = e->gather_parameters();
      if (r == 0) whole_at_save = whole;
      straight[static_cast<size_t>(r)] = train(*e, kFirst, kFirst + kMore);
      for (const auto& [name, p] : e->local_parameters())
        local_after[static_cast<size_t>(r)][name] = p.clone();
    });
  }

  // The manifest holds the plain model's tensors: the vocabulary unpadded, split pieces.
  const ckpt::Checkpoint tpc = ckpt::Checkpoint::open(ckpt::resolve_checkpoint_dir(tp_root));
  EXPECT_EQ(tpc.manifest().tensor("wte.weight").shape, (Shape{31, 8}));
  EXPECT_EQ(tpc.manifest().tensor("wte.weight").kind, ckpt::ShardKind::dim);
  EXPECT_EQ(tpc.manifest().tensor("h.0.attn.c_attn.weight").blocks, 3);
  EXPECT_EQ(tpc.manifest().tensor("h.0.attn.c_proj.weight").dim, 1);
  EXPECT_EQ(tpc.manifest().tensor("exp_avg.h.0.mlp.c_fc.weight").kind, ckpt::ShardKind::dim);
  EXPECT_EQ(tpc.manifest().tensor("ln_f.weight").kind, ckpt::ShardKind::replicated);
  EXPECT_EQ(tpc.manifest().tensor("ln_f.weight").shards.size(), 1u);  // tp rank 0 only

  // A plain engine loads exactly the gathered parameters and saves its own checkpoint.
  {
    auto plain_owner = testing::gpt_engine(tiny(sp), nullptr, options());
    TrainEngine& plain = *plain_owner;
    plain.restore(tpc, tpc.train_state().at("optimizer"));
    const nn::NamedTensors mine = plain.gather_parameters();
    ASSERT_EQ(mine.size(), whole_at_save.size());
    const std::map<std::string, Tensor> want(whole_at_save.begin(), whole_at_save.end());
    for (const auto& [name, t] : mine) {
      ASSERT_TRUE(want.count(name)) << name;
      EXPECT_TRUE(same_bits(t, want.at(name))) << name;
    }
    save(plain, plain_root, kFirst, 0, 1, 1, nullptr);
  }
  const ckpt::Checkpoint plainc = ckpt::Checkpoint::open(ckpt::resolve_checkpoint_dir(plain_root));
  // Both checkpoints hold the same global tensors, in the same order, bit for bit: what `ckpt
  // export` writes of either is the same.
  ASSERT_EQ(tpc.tensor_names("model"), plainc.tensor_names("model"));
  ASSERT_EQ(tpc.tensor_names("optim").size(), plainc.tensor_names("optim").size());
  for (const std::string& name : tpc.tensor_names())
    EXPECT_TRUE(same_bits(tpc.load_global_tensor(name), plainc.load_global_tensor(name))) << name;

  // Fresh tp = 2 engines resume from the plain checkpoint and continue with the same bits.
  testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
    omp_set_num_threads(1);
    auto e = tp_engine(g, sp);
    e->restore(plainc, plainc.train_state().at("optimizer"));
    resumed[static_cast<size_t>(r)] = train(*e, kFirst, kFirst + kMore);
    for (const auto& [name, p] : e->local_parameters())
      resumed_after[static_cast<size_t>(r)][name] = p.clone();
  });
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(resumed[r].size(), straight[r].size());
    for (size_t s = 0; s < straight[r].size(); ++s)
      EXPECT_EQ(resumed[r][s], straight[r][s]) << "rank " << r << " step " << kFirst + 1 + s;
    for (const auto& [name, p] : local_after[r])
      EXPECT_TRUE(same_bits(resumed_after[r].at(name), p)) << "rank " << r << " " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TpCheckpoint, ::testing::Bool());

// What a checkpoint of parts can and cannot describe, from ParamInfo alone.
TEST(TpCheckpointErrors, HeldPartFollowsThePlacement) {
  nn::ParamInfo info;
  info.name = "h.0.attn.c_attn.weight";
  info.shape = {12, 4};
  EXPECT_FALSE(held_part(info).defined());  // replicated everywhere
  info.init.shard = nn::TensorShard{"tp", {12, 4}, 0, 3, 1, 2};
  info.placements["tp"] = nn::Placement::shard(0, 3);
  const nn::TensorShard part = held_part(info);
  EXPECT_TRUE(part.defined());
  EXPECT_EQ(part.index, 1);
  EXPECT_EQ(part.blocks, 3);
  info.placements["ep"] = nn::Placement::shard(1);
  try {
    held_part(info);
    ADD_FAILURE() << "a split over two mesh dimensions was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("split over both 'ep' and 'tp'"), std::string::npos)
        << e.what();
  }
  info.placements.erase("ep");
  info.placements["dp"] = nn::Placement::flat_shard(0, 8);
  EXPECT_THROW(held_part(info), ValueError);
}

TEST(TpCheckpointErrors, AnotherModelIsOneClearErrorAndChangesNothing) {
  omp_set_num_threads(1);
  TempDir dir;
  const std::string root = dir.file("plain");
  nn::GPTConfig wider = tiny(false);
  wider.n_embd = 16;
  {
    auto plain_owner = testing::gpt_engine(wider, nullptr, options());
    TrainEngine& plain = *plain_owner;
    train(plain, 0, 1);
    save(plain, root, 1, 0, 1, 1, nullptr);
  }
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(ckpt::resolve_checkpoint_dir(root));
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& g) {
    omp_set_num_threads(1);
    auto e = tp_engine(g, false);
    std::map<std::string, Tensor> before;
    for (const auto& [name, p] : e->local_parameters()) before[name] = p.clone();
    try {
      e->restore(c, c.train_state().at("optimizer"));
      ADD_FAILURE() << "a checkpoint of a wider model loaded";
    } catch (const ValueError& err) {
      const std::string what = err.what();
      EXPECT_NE(what.find("cannot be resharded into this model"), std::string::npos) << what;
      EXPECT_NE(what.find("tensor '"), std::string::npos) << what;
    }
    for (const auto& [name, p] : e->local_parameters())
      EXPECT_TRUE(same_bits(before.at(name), p)) << name;
  });
}

}  // namespace
}  // namespace meshtrain::parallel
