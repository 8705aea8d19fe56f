// The 3D mesh in the engine (TrainEngine from a DeviceMesh with pp and tp > 1) on thread ranks
// over the shm backend, against the engine of one rank holding the whole model and given the
// same batches: 20 AdamW steps with weight decay, clipping, dropout and activation
// checkpointing, tied embeddings (vocabulary shards tied between the first and last stage).
//
// Not bitwise: a tensor-parallel rank sums a row-parallel product's partial sums over tp (and
// sequence parallelism sums the replicated parameters' gradients over tp), which adds in
// another order than one rank's matrix products. So losses and gradient norms must agree to
// 1e-5 relative at every step and the final parameters to 2e-5 absolute (measured: at most
// 7e-8 relative for the losses and 5e-6 for the parameters after 20 steps; AdamW's division by
// the square root of small second moments lets rounding differences grow a little each step).
// Within the 3D run every rank holds the same loss and norm bits, and the replicas and tied
// copies stay identical (the divergence guard checks them every step).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt_stage.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/pipeline_test_inputs.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"

namespace meshtrain::parallel {
namespace {

using pipeline::ScheduleKind;

constexpr int64_t kB = 2, kT = 8, kVocab = 37;  // 37 rows pad to 38 over tp = 2
constexpr int kSteps = 20;

nn::GPTConfig tiny_gpt(bool tied) {
  return testing::tiny_pipeline_gpt(kVocab, kT, tied);
}

EngineOptions options(const pipeline::PipelineOptions& p, bool sp) {
  EngineOptions o;
  o.adamw.lr = 3e-3f;
  o.adamw.weight_decay = 0.1f;
  o.weight_decay = 0.1f;
  o.seed = 5;
  o.pipeline = p;
  o.sequence_parallel = sp;
  return o;
}

// Batch k of a step's data stream: different data every step.
Batch batch(int step, int k) {
  return testing::step_batch(step, k, kB, kT, kVocab);
}

std::vector<Batch> batches(int step, int first, int n) {
  std::vector<Batch> out;
  for (int k = first; k < first + n; ++k) out.push_back(batch(step, k));
  return out;
}

StepOptions step_options(int step) {
  StepOptions so;
  so.step = step;
  so.lr = 3e-3f;
  so.grad_clip = 0.5;  // below the norms of these steps: clipping is active
  return so;
}

struct Record {
  std::vector<float> losses;
  std::vector<double> norms;
  float val_end = 0;
  std::map<std::string, Tensor> params;
};

// One rank with the whole model, `per_step` batches a step, accumulated in the order data
// parallelism numbers them (micro-batch m of replica d is the engine's m * replicas + d, which
// selects its dropout masks).
Record one_rank(const nn::GPTConfig& config, int per_step, int replicas) {
  auto engine_owner = testing::gpt_engine(config, nullptr, options({}, false));
  TrainEngine& engine = *engine_owner;
  Record r;
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<Batch> bs;
    for (int a = 0; a < per_step; ++a)
      bs.push_back(batch(step, (a % replicas) * (per_step / replicas) + a / replicas));
    const StepOutcome out = engine.train_step(bs, step_options(step));
    r.losses.push_back(out.loss);
    r.norms.push_back(out.grad_norm);
  }
  r.val_end = engine.evaluate(batches(99, 0, 2));
  for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  return r;
}

// pp x dp x tp ranks; replica d reads batches [d * per_replica, (d + 1) * per_replica).
std::vector<Record> mesh_ranks(const nn::GPTConfig& config, const pipeline::PipelineOptions& p,
                               int dp, int tp, bool sp, int per_replica) {
  const int world = p.stages * dp * tp;
  std::vector<Record> records(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", p.stages}, {"dp", dp}, {"tp", tp}});
    auto engine_owner = testing::gpt_engine(config, mesh, options(p, sp));
    TrainEngine& engine = *engine_owner;
    Record& r = records[static_cast<size_t>(rank)];
    const int d = mesh.coord("dp");
    for (int step = 1; step <= kSteps; ++step) {
      const StepOutcome out =
          engine.train_step(batches(step, d * per_replica, per_replica), step_options(step));
      r.losses.push_back(out.loss);
      r.norms.push_back(out.grad_norm);
      engine.check_in_sync(step);
    }
    r.val_end = engine.evaluate(batches(99, 0, 2));
    for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  });
  return records;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

struct Case {
  ScheduleKind kind;
  int V;  // chunks per stage
  int dp;
  bool sp;
  bool tied;
};

class PipelineTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineTensorParallel, MatchesOneRank) {
  const Case c = GetParam();
  const nn::GPTConfig config = tiny_gpt(c.tied);
  constexpr int kPerStep = 4;
  const Record want = one_rank(config, kPerStep, c.dp);
  const std::vector<Record> got =
      mesh_ranks(config, {2, c.kind, 0, c.V}, c.dp, 2, c.sp, kPerStep / c.dp);
  double worst_loss = 0, worst_norm = 0;
  float worst_param = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].losses.size(), static_cast<size_t>(kSteps));
    EXPECT_TRUE(same_bits(got[r].val_end, got[0].val_end)) << "rank " << r;
    for (int s = 0; s < kSteps; ++s) {
      // Every rank of the mesh holds the same bits, so all take the same decisions.
      EXPECT_TRUE(same_bits(got[r].losses[s], got[0].losses[s])) << "rank " << r;
      EXPECT_EQ(got[r].norms[s], got[0].norms[s]) << "rank " << r << " step " << s + 1;
      const double rel = std::fabs(got[r].losses[s] - want.losses[s]) / want.losses[s];
      EXPECT_LE(rel, 1e-5) << "rank " << r << " step " << s + 1 << ": " << got[r].losses[s]
                           << " vs " << want.losses[s];
      worst_loss = std::max(worst_loss, rel);
      const double norm_rel = std::fabs(got[r].norms[s] - want.norms[s]) / want.norms[s];
      EXPECT_LE(norm_rel, 1e-5) << "step " << s + 1;
      worst_norm = std::max(worst_norm, norm_rel);
    }
    EXPECT_NEAR(got[r].val_end, want.val_end, 1e-5 * want.val_end) << "rank " << r;
    ASSERT_EQ(got[r].params.size(), want.params.size());
    for (const auto& [name, t] : want.params) {
      ASSERT_EQ(got[r].params.at(name).shape(), t.shape()) << name;
      const std::vector<float> a = got[r].params.at(name).to_vector(), b = t.to_vector();
      float diff = 0;
      for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
      EXPECT_LE(diff, 2e-5f) << "rank " << r << ": " << name;
      worst_param = std::max(worst_param, diff);
    }
  }
  std::printf(
      "largest relative loss difference to one rank over %d steps %.3g, gradient norm %.3g, "
      "largest parameter difference %.3g\n",
      kSteps, worst_loss, worst_norm, worst_param);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineTensorParallel,
                         ::testing::Values(Case{ScheduleKind::one_f_one_b, 1, 1, false, true},
                                           Case{ScheduleKind::one_f_one_b, 1, 1, true, true},
                                           Case{ScheduleKind::gpipe, 1, 1, false, true},
                                           Case{ScheduleKind::gpipe, 1, 1, true, false},
                                           Case{ScheduleKind::interleaved, 2, 1, true, true},
                                           Case{ScheduleKind::one_f_one_b, 1, 2, true, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           const std::string kind = c.kind == ScheduleKind::gpipe ? "GPipe"
                                                    : c.kind == ScheduleKind::interleaved
                                                        ? "Interleaved_V2"
                                                        : "OneFOneB";
                           return kind + "_dp" + std::to_string(c.dp) + "_pp2_tp2" +
                                  (c.sp ? "_sp" : "") + (c.tied ? "_tied" : "");
                         });

// Each rank holds its stage's tp shards under the whole model's names, with the whole shapes
// and Shard placements in its ParamInfo, and values that are the slices of the whole model's.
TEST(PipelineTensorParallelLayout, StagesHoldShardsOfTheWholeModel) {
  const nn::GPTConfig config = tiny_gpt(true);
  const nn::GPT whole(config);
  std::map<std::string, Tensor> want;
  for (const auto& [name, t] : whole.named_parameters()) want[name] = t;
  std::mutex mu;
  std::map<std::string, int> holders;  // name -> ranks holding a part of it
  testing::run_shm_ranks(4, [&](int, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", 2}, {"dp", 1}, {"tp", 2}});
    auto engine_owner =
        testing::gpt_engine(config, mesh, options({2, ScheduleKind::one_f_one_b, 0, 1}, true));
    TrainEngine& engine = *engine_owner;
    const nn::NamedTensors& params = engine.local_parameters();
    const std::vector<nn::ParamInfo> infos = engine.local_param_infos();
    ASSERT_EQ(params.size(), infos.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::ParamInfo& info = infos[i];
      ASSERT_EQ(info.name, params[i].first);
      ASSERT_TRUE(want.count(info.name)) << info.name;
      const Tensor& w = want.at(info.name);
      EXPECT_EQ(info.shape, w.shape()) << info.name;
      const nn::Placement pl = info.placement("tp");
      Tensor expected = w;
      if (info.init.shard.defined()) {
        EXPECT_EQ(pl.kind, nn::Placement::Kind::shard) << info.name;
        EXPECT_EQ(pl.dim, info.init.shard.dim) << info.name;
        EXPECT_EQ(info.init.shard.index, mesh.coord("tp")) << info.name;
        expected = info.init.shard.take(w);
      } else {
        EXPECT_EQ(pl.kind, nn::Placement::Kind::replicate) << info.name;
      }
      ASSERT_EQ(params[i].second.shape(), expected.shape()) << info.name;
      EXPECT_EQ(std::memcmp(params[i].second.data_ptr(), expected.data_ptr(), expected.nbytes()), 0)
          << info.name;
      if (info.name == "wte.weight") {
        EXPECT_EQ(info.tie_group, "wte");
      }
      std::lock_guard<std::mutex> lock(mu);
      ++holders[info.name];
    }
  });
  // Every parameter somewhere; wte.weight on both ends of the pipeline, twice per tp rank pair.
  for (const auto& [name, t] : want) EXPECT_EQ(holders[name], name == "wte.weight" ? 4 : 2) << name;
}

// What crosses stages on each tp rank: the whole hidden state, or with sequence parallelism its
// tp-th along the sequence (the pipeline's transfers shrink by tp).
TEST(PipelineTensorParallelLayout, StagesSendTheirSequenceShard) {
  const nn::GPTConfig config = tiny_gpt(true);
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& group) {
    for (bool sp : {false, true}) {
      const tp::TpContext ctx{group, sp};
      const tp::TpGPTStage first(config, ctx, 0, 3), last(config, ctx, 3, 6);
      EXPECT_TRUE(first.is_first() && !first.is_last());
      EXPECT_TRUE(!last.is_first() && last.is_last());
      const Shape hidden = sp ? Shape{kB, kT / 2, 16} : Shape{kB, kT, 16};
      EXPECT_EQ(first.input_shape(kB, kT), (Shape{kB, kT}));
      EXPECT_EQ(first.output_shape(kB, kT), hidden);
      EXPECT_EQ(last.input_shape(kB, kT), hidden);
      EXPECT_EQ(last.output_shape(kB, kT), Shape{});
    }
    // A width that tp does not split is the config's error, naming the keys.
    nn::GPTConfig odd = config;
    odd.n_embd = 15;
    odd.n_head = 3;
    try {
      tp::TpGPTStage stage(odd, tp::TpContext{group, false}, 0, 3);
      ADD_FAILURE() << "an n_embd of 15 split over 2 ranks was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("model.n_embd (15) is not divisible by parallel.tp (2)"),
                std::string::npos)
          << e.what();
    }
  });
}

// The divergence guard in the 3D mesh: a flipped bit in one tp rank's copy of the tied
// vocabulary shard, and in one replica of a stage's shard, are named.
std::vector<std::string> sync_errors_after_flipping(int dp, int flip_rank,
                                                    const std::string& name) {
  std::mutex mu;
  std::vector<std::string> errors;
  testing::run_shm_ranks(2 * dp * 2, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", 2}, {"dp", dp}, {"tp", 2}});
    auto engine_owner = testing::gpt_engine(tiny_gpt(true), mesh,
                                            options({2, ScheduleKind::one_f_one_b, 0, 1}, false));
    TrainEngine& engine = *engine_owner;
    engine.train_step(batches(1, 0, 2), step_options(1));
    engine.check_in_sync(1);  // in sync after a step
    if (rank == flip_rank)
      for (auto& [n, t] : engine.local_parameters())
        if (n == name) t.data<float>()[3] = std::nextafter(t.data<float>()[3], 1.0f);
    try {
      engine.check_in_sync(2);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  return errors;
}

TEST(PipelineTensorParallelGuard, ADivergedTiedShardIsNamed) {
  // pp 2 x dp 1 x tp 2: rank 3 is stage 1, tp rank 1; its pp group is ranks 1 and 3.
  const std::vector<std::string> errors = sync_errors_after_flipping(1, 3, "wte.weight");
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors)
    EXPECT_NE(e.find("tied parameter 'wte.weight'"), std::string::npos) << e;
}

TEST(PipelineTensorParallelGuard, ADivergedReplicaOfAShardIsNamed) {
  // pp 2 x dp 2 x tp 2: rank 7 is stage 1, replica 1, tp rank 1; its replica group is 5 and 7.
  const std::vector<std::string> errors = sync_errors_after_flipping(2, 7, "h.3.mlp.c_fc.weight");
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("stage 1"), std::string::npos) << e;
    EXPECT_NE(e.find("'h.3.mlp.c_fc.weight'"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace meshtrain::parallel
