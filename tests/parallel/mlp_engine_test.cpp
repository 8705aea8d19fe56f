// A second, non-GPT model through the one engine factory: the MLP classifier
// (models/mlp_source.h) trains under DDP, ZeRO-1/2/3 and a two-stage pipeline on thread ranks,
// and every layout's parameters equal one process's bit for bit (the one process accumulates
// the same micro-batches each rank or stage takes: each gradient is then the same sum of the
// same halves).
#include <gtest/gtest.h>
#include <omp.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/models/mlp_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

constexpr int kSteps = 4;
constexpr int64_t kRows = 6;  // per micro-batch
const std::vector<int64_t> kSizes{8, 16, 12, 3};

// A synthetic classification set: the label is which of three feature groups sums highest.
Batch batch(int step, int part) {
  Generator g(100 + static_cast<uint64_t>(step) * 7 + static_cast<uint64_t>(part));
  std::vector<float> x(static_cast<size_t>(kRows * kSizes.front()));
  std::vector<int32_t> y(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    float best = -1e9f;
    for (int k = 0; k < 3; ++k) {
      float s = 0;
      for (int64_t f = k; f < kSizes.front(); f += 3) {
        const float v = static_cast<float>(g.normal());
        x[static_cast<size_t>(r * kSizes.front() + f)] = v;
        s += v;
      }
      if (s > best) {
        best = s;
        y[static_cast<size_t>(r)] = k;
      }
    }
  }
  return {Tensor::from_vector(x, {kRows, kSizes.front()}), Tensor::from_vector(y, {kRows})};
}

EngineOptions options(int zero_stage, int pp) {
  EngineOptions o;
  o.zero_stage = zero_stage;
  o.adamw.lr = 1e-2f;
  o.weight_decay = 0.1f;
  o.pipeline.stages = pp;
  return o;
}

std::unique_ptr<TrainEngine> mlp_engine(DeviceMesh mesh, EngineOptions o) {
  EngineSpec spec;
  spec.model = std::make_shared<models::MlpSource>(kSizes, 11);
  spec.mesh = std::move(mesh);
  spec.options = std::move(o);
  return make_engine(std::move(spec));
}

StepOptions step_options(int step) {
  StepOptions so;
  so.step = step;
  so.lr = 1e-2f;
  return so;
}

using Params = std::map<std::string, Tensor>;

// One process: each step accumulates the two micro-batches the two ranks (or the two
// micro-batches of a pipeline) take.
Params one_process(std::vector<float>* losses) {
  auto engine = mlp_engine(data_parallel_mesh(nullptr), options(0, 1));
  for (int step = 1; step <= kSteps; ++step)
    losses->push_back(
        engine->train_step({batch(step, 0), batch(step, 1)}, step_options(step)).loss);
  Params out;
  for (auto& [name, t] : engine->gather_parameters()) out[name] = t;
  return out;
}

Params two_ranks(int zero_stage, int pp, std::vector<float>* losses) {
  Params out;
  std::mutex mu;
  testing::run_shm_ranks(2, [&](int rank, const comm::ProcessGroupPtr& group) {
    omp_set_num_threads(1);
    const int dp = pp == 1 ? 2 : 1;
    auto engine =
        mlp_engine(DeviceMesh(group, {{"pp", pp}, {"dp", dp}, {"tp", 1}}), options(zero_stage, pp));
    std::vector<float> mine;
    for (int step = 1; step <= kSteps; ++step) {
      // Data parallel: rank r takes micro-batch r; the pipeline: both micro-batches.
      std::vector<Batch> bs = pp == 1 ? std::vector<Batch>{batch(step, rank)}
                                      : std::vector<Batch>{batch(step, 0), batch(step, 1)};
      mine.push_back(engine->train_step(bs, step_options(step)).loss);
    }
    const nn::NamedTensors whole = engine->gather_parameters();
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0) {
      for (auto& [name, t] : whole) out[name] = t;
      *losses = mine;
    }
  });
  return out;
}

void expect_same(const Params& want, const Params& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(testing::same_bits(t, got.at(name)))
        << name << " differs by " << testing::largest_difference(t, got.at(name));
  }
}

class MlpEngine : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(MlpEngine, EqualsOneProcessBitwise) {
  omp_set_num_threads(1);
  std::vector<float> want_losses, got_losses;
  const Params want = one_process(&want_losses);
  const auto [zero_stage, pp] = GetParam();
  const Params got = two_ranks(zero_stage, pp, &got_losses);
  expect_same(want, got);
  ASSERT_EQ(want_losses.size(), got_losses.size());
  // The first step starts from the same parameters: the losses agree (the mean of two halves'
  // means is the whole's up to rounding).
  EXPECT_NEAR(want_losses.front(), got_losses.front(), 1e-6f);
  // And the model learns.
  EXPECT_LT(got_losses.back(), got_losses.front());
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlpEngine,
                         ::testing::Values(std::pair{0, 1}, std::pair{1, 1}, std::pair{2, 1},
                                           std::pair{3, 1}, std::pair{0, 2}),
                         [](const auto& info) {
                           return info.param.second > 1 ? std::string("pipeline")
                                                        : "zero" + std::to_string(info.param.first);
                         });

TEST(MlpEngine, RefusesTensorParallelism) {
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& group) {
    EXPECT_THROW(mlp_engine(DeviceMesh(group, {{"pp", 1}, {"dp", 1}, {"tp", 2}}), options(0, 1)),
                 ValueError);
  });
}

}  // namespace
}  // namespace meshtrain::parallel
