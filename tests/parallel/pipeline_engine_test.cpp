// The engine's pipeline mode (TrainEngine from a DeviceMesh) on thread ranks over the shm
// backend, against the engine of one rank holding the whole model and given the same batches:
// losses, gradient norms, validation losses and the final parameters, with AdamW, weight decay,
// clipping, dropout and activation checkpointing. Bitwise with one replica, tied embeddings
// included; pp x dp against one rank with the global batch to 1e-6, because the replicas'
// average adds the micro-batches' gradients in another order (each replica's mean, then the mean
// of those) than one rank accumulating them all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/pipeline_test_inputs.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

using pipeline::ScheduleKind;

constexpr int64_t kB = 2, kT = 8, kVocab = 37;
constexpr int kSteps = 6;

nn::GPTConfig tiny_gpt(bool tied) {
  return testing::tiny_pipeline_gpt(kVocab, kT, tied);
}

// f16 starts from a loss scale of 2^40, so that the first steps' gradients overflow and are
// skipped while the scale backs off.
EngineOptions options(const pipeline::PipelineOptions& p, DType precision = DType::f32) {
  EngineOptions o;
  o.precision = precision;
  if (precision == DType::f16) {
    o.loss_scaler = optim::LossScalerOptions{};
    o.loss_scaler->init_scale = 1099511627776.0;
  }
  o.adamw.lr = 3e-3f;
  o.adamw.weight_decay = 0.1f;
  o.weight_decay = 0.1f;
  o.seed = 5;
  o.pipeline = p;
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

Batch joined(const std::vector<Batch>& bs) {
  std::vector<Tensor> xs, ys;
  for (const Batch& b : bs) {
    xs.push_back(b.inputs);
    ys.push_back(b.targets);
  }
  return {ops::cat(xs, 0), ops::cat(ys, 0)};
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
  int overflows = 0;
  float val0 = 0, val_end = 0;
  std::map<std::string, Tensor> params;
};

// The reference: one rank with the whole model, `per_step` batches a step (joined in groups of
// `join`). With `replicas` > 1 it accumulates the batches of that many replicas in the order
// data parallelism numbers them (micro-batch m of replica d is the engine's m * replicas + d,
// which selects its dropout masks).
Record one_rank(const nn::GPTConfig& config, int per_step, int join, int replicas = 1,
                DType precision = DType::f32) {
  auto engine_owner = testing::gpt_engine(config, nullptr, options({}, precision));
  TrainEngine& engine = *engine_owner;
  Record r;
  const std::vector<Batch> val = batches(99, 0, 2);
  r.val0 = engine.evaluate(val);
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<Batch> bs;
    for (int a = 0; a < per_step; ++a)
      bs.push_back(batch(step, (a % replicas) * (per_step / replicas) + a / replicas));
    std::vector<Batch> mbs;
    for (int k = 0; k < per_step; k += join)
      mbs.push_back(joined(std::vector<Batch>(bs.begin() + k, bs.begin() + k + join)));
    const StepOutcome out = engine.train_step(mbs, step_options(step));
    r.overflows += out.overflow ? 1 : 0;
    r.losses.push_back(out.loss);
    r.norms.push_back(out.grad_norm);
  }
  r.val_end = engine.evaluate(val);
  for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  return r;
}

// pp x dp ranks; replica d reads batches [d * per_replica, (d + 1) * per_replica) of each step.
std::vector<Record> pipeline_ranks(const nn::GPTConfig& config, const pipeline::PipelineOptions& p,
                                   int dp, int per_replica, DType precision = DType::f32) {
  const int world = p.stages * dp;
  std::vector<Record> records(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", p.stages}, {"dp", dp}, {"tp", 1}});
    auto engine_owner = testing::gpt_engine(config, mesh, options(p, precision));
    TrainEngine& engine = *engine_owner;
    Record& r = records[static_cast<size_t>(rank)];
    const std::vector<Batch> val = batches(99, 0, 2);
    r.val0 = engine.evaluate(val);
    const int d = mesh.coord("dp");
    for (int step = 1; step <= kSteps; ++step) {
      const StepOutcome out =
          engine.train_step(batches(step, d * per_replica, per_replica), step_options(step));
      r.overflows += out.overflow ? 1 : 0;
      r.losses.push_back(out.loss);
      r.norms.push_back(out.grad_norm);
      engine.check_in_sync(step);
    }
    r.val_end = engine.evaluate(val);
    for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  });
  return records;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}
using testing::same_bits;

struct Case {
  ScheduleKind kind;
  int P, V;
  int micro_batches;  // 0: one per batch
  bool tied = false;
};

class PipelineEngine : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEngine, MatchesOneRankBitwise) {
  const Case c = GetParam();
  const nn::GPTConfig config = tiny_gpt(c.tied);
  constexpr int kPerStep = 4;
  const int join = c.micro_batches > 0 ? kPerStep / c.micro_batches : 1;
  const Record want = one_rank(config, kPerStep, join);
  const std::vector<Record> got =
      pipeline_ranks(config, {c.P, c.kind, c.micro_batches, c.V}, 1, kPerStep);
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_TRUE(same_bits(got[r].val0, want.val0)) << "rank " << r;
    EXPECT_TRUE(same_bits(got[r].val_end, want.val_end)) << "rank " << r;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_TRUE(same_bits(got[r].losses[s], want.losses[s]))
          << "rank " << r << " step " << s + 1 << ": " << got[r].losses[s] << " vs "
          << want.losses[s];
      // The pipeline sums the squares stage by stage: the same value to rounding.
      EXPECT_NEAR(got[r].norms[s], want.norms[s], 1e-6 * want.norms[s]) << "step " << s + 1;
      EXPECT_EQ(got[r].norms[s], got[0].norms[s]) << "rank " << r;
    }
    ASSERT_EQ(got[r].params.size(), want.params.size());
    for (const auto& [name, t] : want.params)
      EXPECT_TRUE(same_bits(got[r].params.at(name), t)) << "rank " << r << ": " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEngine,
                         ::testing::Values(Case{ScheduleKind::gpipe, 2, 1, 0},
                                           Case{ScheduleKind::one_f_one_b, 2, 1, 0},
                                           Case{ScheduleKind::interleaved, 2, 2, 0},
                                           Case{ScheduleKind::one_f_one_b, 4, 1, 0},
                                           Case{ScheduleKind::one_f_one_b, 2, 1, 2},
                                           Case{ScheduleKind::one_f_one_b, 2, 1, 0, true},
                                           Case{ScheduleKind::interleaved, 2, 2, 0, true},
                                           Case{ScheduleKind::gpipe, 4, 1, 2, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(pipeline::schedule_kind_name(c.kind) == "1f1b"
                                                  ? "OneFOneB"
                                                  : pipeline::schedule_kind_name(c.kind)) +
                                  "_P" + std::to_string(c.P) + "_V" + std::to_string(c.V) + "_M" +
                                  std::to_string(c.micro_batches) + (c.tied ? "_tied" : "");
                         });

// Mixed precision: autocast's rounding of the matrix products in each stage's forward, and
// under f16 the loss scale the backwards start from and the unscaling before the norm, as one
// rank does them.
TEST(PipelineEngineMixedPrecision, Bf16AndF16MatchOneRankBitwise) {
  for (DType precision : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(precision)));
    const nn::GPTConfig config = tiny_gpt(true);
    const Record want = one_rank(config, 4, 1, 1, precision);
    const std::vector<Record> got =
        pipeline_ranks(config, {2, ScheduleKind::one_f_one_b, 0, 1}, 1, 4, precision);
    if (precision == DType::f16) {
      EXPECT_GT(want.overflows, 0);
    }
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].overflows, want.overflows) << "rank " << r;
      EXPECT_TRUE(same_bits(got[r].val_end, want.val_end)) << "rank " << r;
      for (int s = 0; s < kSteps; ++s)
        EXPECT_TRUE(same_bits(got[r].losses[s], want.losses[s]))
            << "rank " << r << " step " << s + 1;
      for (const auto& [name, t] : want.params)
        EXPECT_TRUE(same_bits(got[r].params.at(name), t)) << "rank " << r << ": " << name;
    }
  }
}

// Two replicas of a two-stage pipeline against one rank accumulating both replicas' batches.
TEST(PipelineEngineDataParallel, TwoByTwoMatchesOneRankWithTheGlobalBatch) {
  for (bool tied : {false, true}) {
    const nn::GPTConfig config = tiny_gpt(tied);
    const Record want = one_rank(config, 4, 1, 2);
    const std::vector<Record> got =
        pipeline_ranks(config, {2, ScheduleKind::one_f_one_b, 0, 1}, 2, 2);
    float worst_param = 0, worst_loss = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_TRUE(same_bits(got[r].val_end, got[0].val_end)) << "rank " << r;
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_TRUE(same_bits(got[r].losses[s], got[0].losses[s])) << "rank " << r;
        worst_loss = std::max(worst_loss, std::fabs(got[r].losses[s] - want.losses[s]));
      }
      for (const auto& [name, t] : want.params) {
        EXPECT_TRUE(same_bits(got[r].params.at(name), got[0].params.at(name))) << name;
        const std::vector<float> a = got[r].params.at(name).to_vector(), b = t.to_vector();
        for (size_t i = 0; i < a.size(); ++i)
          worst_param = std::max(worst_param, std::fabs(a[i] - b[i]));
      }
    }
    std::printf("tied=%d: largest loss difference %.3g, parameter difference %.3g\n", tied,
                worst_loss, worst_param);
    EXPECT_LE(worst_loss, 1e-6f);
    EXPECT_LE(worst_param, 1e-6f);
  }
}

// The divergence guard covers both kinds of copies a pipeline keeps: a stage's data-parallel
// replicas and the tied embedding's two copies.
std::vector<std::string> sync_errors_after_flipping(int pp, int dp, int flip_rank,
                                                    const std::string& name) {
  std::mutex mu;
  std::vector<std::string> errors;
  testing::run_shm_ranks(pp * dp, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", pp}, {"dp", dp}, {"tp", 1}});
    auto engine_owner =
        testing::gpt_engine(tiny_gpt(true), mesh, options({pp, ScheduleKind::one_f_one_b, 0, 1}));
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

TEST(PipelineEngineGuard, ADivergedTiedCopyIsNamedOnEveryRank) {
  const std::vector<std::string> errors = sync_errors_after_flipping(2, 1, 1, "wte.weight");
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("tied parameter 'wte.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("step 2"), std::string::npos) << e;
  }
}

TEST(PipelineEngineGuard, ADivergedReplicaOfAStageIsNamed) {
  // Rank 3 is stage 1 of replica 1 (pp varies slowest): its replica group is ranks 1 and 3.
  const std::vector<std::string> errors = sync_errors_after_flipping(2, 2, 3, "ln_f.weight");
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("stage 1"), std::string::npos) << e;
    EXPECT_NE(e.find("'ln_f.weight'"), std::string::npos) << e;
  }
}

// A pipeline's checkpoint state is the whole model's, by name: the union of the stages' parts
// is what one rank holding the whole model writes, and the optimizer's per-parameter step counts
// of every stage reach the scalars rank 0 writes.
TEST(PipelineEngineCheckpoint, TheStagesWriteTheWholeModelOnce) {
  const nn::GPTConfig config = tiny_gpt(true);
  auto whole_owner = testing::gpt_engine(config, nullptr, options({}));
  TrainEngine& whole = *whole_owner;
  whole.train_step(batches(1, 0, 2), step_options(1));
  ckpt::RankShards want;
  const nlohmann::json want_scalars = whole.checkpoint_state(want, 0);
  std::mutex mu;
  std::map<std::string, int> written;  // group/name -> how many ranks wrote it
  std::vector<nlohmann::json> scalars(2);
  testing::run_shm_ranks(2, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", 2}, {"dp", 1}, {"tp", 1}});
    auto engine_owner =
        testing::gpt_engine(config, mesh, options({2, ScheduleKind::one_f_one_b, 0, 1}));
    TrainEngine& engine = *engine_owner;
    engine.train_step(batches(1, 0, 2), step_options(1));
    ckpt::RankShards shards;
    nlohmann::json s = engine.checkpoint_state(shards, rank);
    std::lock_guard<std::mutex> lock(mu);
    scalars[static_cast<size_t>(rank)] = s;
    for (const auto& [g, pieces] : shards.groups())
      for (const auto& piece : pieces) ++written[g + "/" + piece.name];
  });
  size_t n = 0;
  for (const auto& [g, pieces] : want.groups())
    for (const auto& piece : pieces) {
      EXPECT_EQ(written[g + "/" + piece.name], 1) << g << "/" << piece.name;
      ++n;
    }
  EXPECT_EQ(written.size(), n);
  EXPECT_EQ(scalars[0], want_scalars);
}

}  // namespace
}  // namespace meshtrain::parallel
