// Buffers under data parallelism: with broadcast_buffers (the default, PyTorch DDP's), every step
// starts from the first replica's running statistics, so two replicas that take the same batch
// in a step end it with the same buffers whatever they saw before; without it each replica keeps
// statistics of its own batches only.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/models/resnet_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::parallel {
namespace {

Batch images(uint64_t seed) {
  Generator g(seed);
  Tensor x = Tensor::empty({4, 1, 8, 8});
  normal_(x, g);
  std::vector<int32_t> y{0, 3, 5, 9};
  return {x, Tensor::from_vector(y, {4})};
}

// Rank r's buffers after two steps: in step 1 each rank takes its own batch, in step 2 both take
// the same one.
std::vector<std::map<std::string, Tensor>> buffers_after_two_steps(bool broadcast) {
  std::vector<std::map<std::string, Tensor>> out(2);
  std::mutex mu;
  testing::run_shm_ranks(2, [&](int rank, const comm::ProcessGroupPtr& group) {
    nn::ResNetConfig config = nn::resnet_config("tiny", 1, 10);
    config.seed = 3;
    EngineSpec spec;
    spec.model = std::make_shared<models::ResNetSource>(config, false);
    spec.mesh = data_parallel_mesh(group);
    spec.options.optimizer = optim::OptimizerKind::sgd;
    spec.options.sgd.lr = 0.1f;
    spec.options.broadcast_buffers = broadcast;
    auto engine = make_engine(std::move(spec));
    StepOptions so;
    so.lr = 0.1f;
    so.step = 1;
    engine->train_step({images(10 + static_cast<uint64_t>(rank))}, so);
    so.step = 2;
    engine->train_step({images(20)}, so);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [name, t] : engine->model().named_buffers())
      out[static_cast<size_t>(rank)][name] = t.clone();
  });
  return out;
}

TEST(BroadcastBuffers, EveryStepStartsFromTheFirstReplicasStatistics) {
  const auto with = buffers_after_two_steps(true);
  ASSERT_FALSE(with[0].empty());
  ASSERT_EQ(with[0].size(), with[1].size());
  for (const auto& [name, t] : with[0])
    EXPECT_TRUE(testing::same_bits(t, with[1].at(name))) << name;
  const auto without = buffers_after_two_steps(false);
  EXPECT_FALSE(
      testing::same_bits(without[0].at("bn1.running_mean"), without[1].at("bn1.running_mean")));
}

}  // namespace
}  // namespace meshtrain::parallel
