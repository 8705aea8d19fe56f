// ZeRO-1 and ZeRO-2 over the dp dimension of the 3D mesh (pp 2 x dp 2 x tp 2 thread ranks over
// the shm backend, with and without sequence parallelism) and of tensor parallelism alone (pp 1
// x dp 2 x tp 2), against the same layout at ZeRO-0, over 20 AdamW steps with weight decay,
// dropout, activation checkpointing, tied embeddings (vocabulary shards tied between the first
// and last stage) and active clipping.
//
// ZeRO-1 equals ZeRO-0 bit for bit: the reducer's bucketed average adds every element as the
// flat one does (the shm backend reduces in rank order for both), the norm is taken by the
// pipeline over the same whole averaged gradients (each tp shard once, the replicated parameters
// once), and AdamW is elementwise, so updating a flat shard of a tp part gives the whole part's
// update bits; its checkpoint (each tp part's state put together over dp, written by replica 0)
// holds ZeRO-0's pieces with their bits. ZeRO-2 sums the squares of the norm dp shard by dp shard,
// then the tp parts' over the tp ranks, another order than ZeRO-0's: the norms agree to 1e-12
// relative (measured 4e-15), and the clipping factor derived from them may move the losses,
// parameters and checkpointed state by at most 1e-6 over the run (measured: not at all).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/pipeline_test_inputs.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kB = 2, kT = 8, kVocab = 37;  // 37 rows pad to 38 over tp = 2
constexpr int kSteps = 20, kDP = 2, kTP = 2, kPerReplica = 2;
constexpr double kClip = 0.5;

nn::GPTConfig tiny_gpt() {
  return testing::tiny_pipeline_gpt(kVocab, kT, true);
}

EngineOptions options(int zero_stage, int pp, bool sp) {
  EngineOptions o;
  o.zero_stage = zero_stage;
  // Small buckets: every stage's gradients span several, and tp parts straddle the dp shards.
  o.reducer.first_bucket_bytes = 2048;
  o.reducer.bucket_bytes = 8192;
  o.adamw.lr = 3e-3f;
  o.adamw.weight_decay = 0.1f;
  o.weight_decay = 0.1f;
  o.seed = 5;
  o.pipeline = {pp, pipeline::ScheduleKind::one_f_one_b, 0, 1};
  o.sequence_parallel = sp;
  return o;
}

Batch batch(int step, int k) {
  return testing::step_batch(step, k, kB, kT, kVocab);
}

struct Record {
  std::vector<float> losses;
  std::vector<double> norms;
  int clipped = 0;  // steps whose norm was above the clip
  std::map<std::string, Tensor> params;
  // What this rank writes to a checkpoint: "<group> <name> <offset>" -> its piece (the live
  // tensors, copied), and the optimizer's scalars.
  std::map<std::string, Tensor> pieces;
  std::string scalars;
  std::string describe;
};

std::vector<Record> run(int zero_stage, int pp, bool sp) {
  const int world = pp * kDP * kTP;
  std::vector<Record> records(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", pp}, {"dp", kDP}, {"tp", kTP}});
    auto engine_owner = testing::gpt_engine(tiny_gpt(), mesh, options(zero_stage, pp, sp));
    TrainEngine& engine = *engine_owner;
    Record& r = records[static_cast<size_t>(rank)];
    r.describe = engine.describe();
    const int d = mesh.coord("dp");
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<Batch> bs;
      for (int k = 0; k < kPerReplica; ++k) bs.push_back(batch(step, d * kPerReplica + k));
      StepOptions so;
      so.step = step;
      so.lr = 3e-3f;
      so.grad_clip = kClip;
      const StepOutcome out = engine.train_step(bs, so);
      r.clipped += !out.skipped && out.grad_norm > kClip ? 1 : 0;
      r.losses.push_back(out.loss);
      r.norms.push_back(out.grad_norm);
      // The replicas of each stage's tp parts and the tied embedding's two copies: the same bits.
      engine.check_in_sync(step);
    }
    ckpt::RankShards shards;
    r.scalars = engine.checkpoint_state(shards, rank).dump();
    for (const auto& [g, pieces] : shards.groups())
      for (const ckpt::TensorShard& piece : pieces)
        r.pieces[g + " " + piece.name + " " + std::to_string(piece.offset)] = piece.data.clone();
    for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  });
  return records;
}

using testing::largest_difference;
using testing::same_bits;

struct Layout {
  const char* name;
  int pp;
  bool sp;
};

class PipelineZeroTensorParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineZeroTensorParallel, StagesOneAndTwoMatchZeroStageZero) {
  const Layout l = GetParam();
  const std::vector<Record> plain = run(0, l.pp, l.sp);
  EXPECT_GT(plain[0].clipped, kSteps / 2);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const std::vector<Record> got = run(stage, l.pp, l.sp);
    EXPECT_NE(got[0].describe.find("ZeRO-" + std::to_string(stage) + " over each stage's 2"),
              std::string::npos)
        << got[0].describe;
    float worst_loss = 0, worst_param = 0;
    double worst_norm = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      for (int s = 0; s < kSteps; ++s) {
        // Every rank reports the same loss and norm.
        EXPECT_EQ(got[r].losses[s], got[0].losses[s]) << "rank " << r << " step " << s + 1;
        EXPECT_EQ(std::memcmp(&got[r].norms[s], &got[0].norms[s], sizeof(double)), 0)
            << "rank " << r << " step " << s + 1;
        worst_loss = std::max(worst_loss, std::fabs(got[r].losses[s] - plain[r].losses[s]));
        worst_norm = std::max(worst_norm,
                              std::fabs(got[r].norms[s] - plain[r].norms[s]) / plain[r].norms[s]);
        if (stage == 1) {
          EXPECT_EQ(std::memcmp(&got[r].losses[s], &plain[r].losses[s], sizeof(float)), 0)
              << "rank " << r << " step " << s + 1;
          EXPECT_EQ(got[r].norms[s], plain[r].norms[s]) << "rank " << r << " step " << s + 1;
        }
      }
      ASSERT_EQ(got[r].params.size(), plain[r].params.size());
      for (const auto& [name, t] : plain[r].params) {
        if (stage == 1) {
          EXPECT_TRUE(same_bits(got[r].params.at(name), t)) << name;
        }
        worst_param = std::max(worst_param, largest_difference(got[r].params.at(name), t));
      }
    }
    // The checkpoint: under ZeRO the replicas put each tp part's optimizer state together and
    // replica 0 writes it by placement, so every rank writes the pieces ZeRO-0 writes, with the
    // same bits where the run is the same (ZeRO-1), and the same scalars.
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].scalars, plain[r].scalars) << "rank " << r;
      ASSERT_EQ(got[r].pieces.size(), plain[r].pieces.size()) << "rank " << r;
      for (const auto& [key, t] : plain[r].pieces) {
        ASSERT_TRUE(got[r].pieces.count(key)) << "rank " << r << ": " << key;
        if (stage == 1) {
          EXPECT_TRUE(same_bits(got[r].pieces.at(key), t)) << "rank " << r << ": " << key;
        }
        worst_param = std::max(worst_param, largest_difference(got[r].pieces.at(key), t));
      }
    }
    std::printf(
        "%s ZeRO-%d: largest loss difference %.3g, relative norm difference %.3g, parameter and "
        "checkpoint difference %.3g\n",
        l.name, stage, worst_loss, worst_norm, worst_param);
    EXPECT_LE(worst_norm, 1e-12);
    EXPECT_LE(worst_loss, 1e-6f);
    EXPECT_LE(worst_param, 1e-6f);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineZeroTensorParallel,
                         ::testing::Values(Layout{"pp2dp2tp2", 2, false},
                                           Layout{"pp2dp2tp2sp", 2, true},
                                           Layout{"pp1dp2tp2", 1, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace meshtrain::parallel
