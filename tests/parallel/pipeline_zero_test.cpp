// ZeRO-1 and ZeRO-2 over the dp dimension of a pipeline (pp 2 x dp 2 thread ranks over the shm
// backend) against the same layout without ZeRO, over 20 AdamW steps with weight decay, dropout,
// activation checkpointing, tied embeddings and active clipping, in f32 and under f16's loss
// scaling.
//
// ZeRO-1 equals ZeRO-0 bit for bit: the bucketed all-reduce averages every element as the flat
// one does (the shm backend reduces in rank order for both), the norm is taken over the same
// whole gradients, and AdamW is elementwise, so updating a shard gives a whole-tensor update's
// bits. ZeRO-2 sums the squares of the gradient norm shard by shard and then over the replicas,
// another order than over whole tensors: the norms agree to 1e-12 relative, and the clipping
// factor derived from them moves the losses and the parameters by at most 1e-6 over the run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

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

constexpr int64_t kB = 2, kT = 8, kVocab = 37;
constexpr int kSteps = 20, kPP = 2, kDP = 2, kPerReplica = 2;

nn::GPTConfig tiny_gpt() {
  return testing::tiny_pipeline_gpt(kVocab, kT, true);
}

// f16 starts from a loss scale of 2^20: the first steps overflow and are skipped while it backs
// off, and the scale grows again every 4 clean steps, so later steps overflow too.
EngineOptions options(int zero_stage, DType precision, const pipeline::PipelineOptions& p) {
  EngineOptions o;
  o.zero_stage = zero_stage;
  o.precision = precision;
  if (precision == DType::f16) {
    o.loss_scaler = optim::LossScalerOptions{};
    o.loss_scaler->init_scale = 1048576.0;
    o.loss_scaler->growth_interval = 4;
  }
  // Small buckets: every stage's gradients span several, and parameters straddle the shards.
  o.reducer.first_bucket_bytes = 2048;
  o.reducer.bucket_bytes = 8192;
  o.adamw.lr = 3e-3f;
  o.adamw.weight_decay = 0.1f;
  o.weight_decay = 0.1f;
  o.seed = 5;
  o.pipeline = p;
  return o;
}

Batch batch(int step, int k) {
  return testing::step_batch(step, k, kB, kT, kVocab);
}

struct Record {
  std::vector<float> losses;
  std::vector<double> norms;
  int overflows = 0;
  int clipped = 0;  // steps whose norm was above the clip
  std::map<std::string, Tensor> params;
  // Optimizer-state elements this rank writes to a checkpoint, per state tensor.
  std::map<std::string, int64_t> state_elements;
  std::string describe;
  int grads_in_buckets = 0;  // parameters whose gradient is a view of its reducer bucket
  int local_params = 0;
};

constexpr double kClip = 0.5;

std::vector<Record> run(int zero_stage, DType precision,
                        const pipeline::PipelineOptions& p = {
                            kPP, pipeline::ScheduleKind::one_f_one_b, 0, 1}) {
  std::vector<Record> records(kPP * kDP);
  testing::run_shm_ranks(kPP * kDP, [&](int rank, const comm::ProcessGroupPtr& group) {
    const DeviceMesh mesh(group, {{"pp", kPP}, {"dp", kDP}, {"tp", 1}});
    auto engine_owner = testing::gpt_engine(tiny_gpt(), mesh, options(zero_stage, precision, p));
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
      r.overflows += out.overflow ? 1 : 0;
      r.clipped += !out.skipped && out.grad_norm > kClip ? 1 : 0;
      r.losses.push_back(out.loss);
      r.norms.push_back(out.grad_norm);
      // The replicas of each stage and the tied embedding's two copies: the same bits.
      engine.check_in_sync(step);
    }
    for (size_t i = 0; i < engine.local_parameters().size(); ++i) {
      const Tensor g = engine.local_parameters()[i].second.grad();
      ++r.local_params;
      if (engine.reducer() && g.defined() &&
          g.data_ptr() == engine.reducer()->bucket_view(i).data_ptr())
        ++r.grads_in_buckets;
    }
    ckpt::RankShards shards;
    engine.checkpoint_state(shards, rank);
    for (const auto& [g, pieces] : shards.groups())
      if (g == "optim")
        for (const ckpt::TensorShard& piece : pieces)
          r.state_elements[piece.name] += piece.data.numel();
    for (auto& [name, t] : engine.gather_parameters()) r.params[name] = t;
  });
  return records;
}

using testing::largest_difference;
using testing::same_bits;

// Every state tensor's elements are written once over the job (the tied copy's by stage 0
// only), and under ZeRO no rank writes a whole stage's state.
void expect_state_sharded(const std::vector<Record>& zero, const std::vector<Record>& plain) {
  std::map<std::string, int64_t> total, whole;
  for (const Record& r : plain)
    for (const auto& [name, n] : r.state_elements) whole[name] += n;
  int64_t largest_rank = 0, all = 0;
  for (const Record& r : zero) {
    int64_t mine = 0;
    for (const auto& [name, n] : r.state_elements) {
      total[name] += n;
      mine += n;
    }
    largest_rank = std::max(largest_rank, mine);
    all += mine;
  }
  EXPECT_EQ(total, whole);
  // Two stages x two replicas: a rank holds about a quarter (a stage's half), never the whole.
  EXPECT_LT(largest_rank, all / 2) << "a rank holds " << largest_rank << " of " << all;
}

class PipelineZero : public ::testing::TestWithParam<DType> {};

TEST_P(PipelineZero, StagesOneAndTwoMatchThePlainPipeline) {
  const DType precision = GetParam();
  const std::vector<Record> plain = run(0, precision);
  // The run exercises what it claims: clipping, and under f16 skipped steps.
  std::printf("%s: %d of %d steps clipped, %d skipped for overflow\n",
              std::string(dtype_name(precision)).c_str(), plain[0].clipped, kSteps,
              plain[0].overflows);
  EXPECT_GT(plain[0].clipped, kSteps / 2);
  if (precision == DType::f16) {
    EXPECT_GT(plain[0].overflows, 0);
    EXPECT_LT(plain[0].overflows, kSteps / 2);
  }
  for (int stage : {1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const std::vector<Record> got = run(stage, precision);
    EXPECT_NE(got[0].describe.find("ZeRO-" + std::to_string(stage) + " over each stage's 2"),
              std::string::npos)
        << got[0].describe;
    expect_state_sharded(got, plain);
    // ZeRO-1 keeps the gradients in the reducer's buckets (the backwards accumulate into them);
    // ZeRO-2 keeps only its shards between steps.
    for (const Record& r : got)
      EXPECT_EQ(r.grads_in_buckets, stage == 1 ? r.local_params : 0) << r.describe;
    float worst_loss = 0, worst_param = 0;
    double worst_norm = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].overflows, plain[r].overflows) << "rank " << r;
      for (int s = 0; s < kSteps; ++s) {
        // Every rank reports the same loss and norm.
        EXPECT_EQ(got[r].losses[s], got[0].losses[s]) << "rank " << r << " step " << s + 1;
        EXPECT_EQ(std::memcmp(&got[r].norms[s], &got[0].norms[s], sizeof(double)), 0)
            << "rank " << r << " step " << s + 1;
        worst_loss = std::max(worst_loss, std::fabs(got[r].losses[s] - plain[r].losses[s]));
        if (std::isfinite(plain[r].norms[s]))
          worst_norm = std::max(worst_norm,
                                std::fabs(got[r].norms[s] - plain[r].norms[s]) / plain[r].norms[s]);
        if (stage == 1) {
          EXPECT_EQ(std::memcmp(&got[r].losses[s], &plain[r].losses[s], sizeof(float)), 0)
              << "rank " << r << " step " << s + 1;
          if (std::isfinite(plain[r].norms[s])) {
            EXPECT_EQ(got[r].norms[s], plain[r].norms[s]) << "rank " << r << " step " << s + 1;
          }
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
    std::printf(
        "ZeRO-%d (%s): largest loss difference %.3g, relative norm difference %.3g, "
        "parameter difference %.3g\n",
        stage, std::string(dtype_name(precision)).c_str(), worst_loss, worst_norm, worst_param);
    EXPECT_LE(worst_norm, 1e-12);
    EXPECT_LE(worst_loss, 1e-6f);
    EXPECT_LE(worst_param, 1e-6f);
  }
}

// Interleaved: each rank holds two chunks (the last stage's second one with the tied copy); the
// reducer and the shards span both.
TEST(PipelineZeroInterleaved, StageTwoOverTwoChunksPerRankMatchesThePlainPipeline) {
  const pipeline::PipelineOptions p{kPP, pipeline::ScheduleKind::interleaved, 0, 2};
  const std::vector<Record> plain = run(0, DType::f32, p), got = run(2, DType::f32, p);
  EXPECT_GT(plain[0].clipped, kSteps / 2);
  expect_state_sharded(got, plain);
  float worst = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    for (int s = 0; s < kSteps; ++s)
      worst = std::max(worst, std::fabs(got[r].losses[s] - plain[r].losses[s]));
    for (const auto& [name, t] : plain[r].params)
      worst = std::max(worst, largest_difference(got[r].params.at(name), t));
  }
  EXPECT_LE(worst, 1e-6f);
}

INSTANTIATE_TEST_SUITE_P(Precisions, PipelineZero, ::testing::Values(DType::f32, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace meshtrain::parallel
