// train.log_layer_norms in the engine: per-layer gradient norms over the unique shards. On two
// thread ranks, under DDP and every ZeRO stage, the norms must equal those computed from a plain
// model's gradients of the same global batch, the squares must add up to the global norm's
// square, and every rank must report the same bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/layer_grad_norms.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 8, kB = 2;
constexpr int kWorld = 2;
using Norms = std::vector<std::pair<std::string, double>>;

nn::GPTConfig tiny() {
  nn::GPTConfig g;
  g.vocab_size = 31;
  g.block_size = kT;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 8;
  g.seed = 5;
  return g;
}

Batch batch(int rank, int64_t step) {
  Generator gen(400 + static_cast<uint64_t>(step) * 19 + static_cast<uint64_t>(rank));
  Tensor x = Tensor::empty({kB, kT}, DType::i32);
  Tensor y = Tensor::empty({kB, kT}, DType::i32);
  for (int64_t i = 0; i < kB * kT; ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 31);
    y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 31);
  }
  return {x, y};
}

TEST(LayerOf, BlocksAndTopLevelModules) {
  EXPECT_EQ(layer_of("h.3.attn.c_attn.weight"), "h.3");
  EXPECT_EQ(layer_of("h.12.ln_1.bias"), "h.12");
  EXPECT_EQ(layer_of("wte.weight"), "wte");
  EXPECT_EQ(layer_of("ln_f.bias"), "ln_f");
  EXPECT_EQ(layer_of("h.x.weight"), "h");
  EXPECT_EQ(layer_of("bias"), "bias");
}

struct StepNorms {
  Norms layers;
  double global = 0;
};

// Per rank, per step: the engine's layer norms and global norm.
std::map<int, std::vector<StepNorms>> run(int stage, int steps) {
  std::map<int, std::vector<StepNorms>> out;
  std::mutex mu;
  testing::run_shm_ranks(kWorld, [&](int rank, const comm::ProcessGroupPtr& pg) {
    omp_set_num_threads(1);
    EngineOptions o;
    o.zero_stage = stage;
    o.reducer.bucket_bytes = 2048;  // several buckets, parameters cut by shard boundaries
    o.reducer.first_bucket_bytes = 512;
    auto engine_owner = testing::gpt_engine(tiny(), pg, o);
    TrainEngine& engine = *engine_owner;
    std::vector<StepNorms> mine;
    for (int step = 1; step <= steps; ++step) {
      StepOptions so;
      so.step = step;
      so.lr = 1e-2f;
      so.grad_clip = 0.5;  // the norms are taken before clipping
      so.layer_norms = true;
      const StepOutcome r = engine.train_step({batch(rank, step)}, so);
      mine.push_back({r.layer_grad_norms, r.grad_norm});
    }
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = mine;
  });
  return out;
}

// The plain model's per-layer norms for step 1: the gradient of the mean of the ranks' losses.
Norms plain_norms() {
  nn::GPT model(tiny());
  for (int r = 0; r < kWorld; ++r) {
    const Batch b = batch(r, 1);
    autograd::backward(model.loss(b.inputs, b.targets),
                       Tensor::scalar(1.0f / static_cast<float>(kWorld)));
  }
  const nn::NamedTensors params = model.named_parameters();
  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  const LayerGroups layers(names);
  return layers.norms(layers.grad_squares(params));
}

TEST(LayerGradNorms, EqualThePlainModelsAndAddUpToTheGlobalNormUnderEveryStage) {
  const Norms plain = plain_norms();
  ASSERT_EQ(plain.size(), 5u);  // wte, wpe, h.0, h.1, ln_f (the head is tied to wte)
  std::map<int, Norms> first_step;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    const auto per_rank = run(stage, 3);
    const std::vector<StepNorms>& r0 = per_rank.at(0);
    // Every rank holds the same bits.
    for (size_t s = 0; s < r0.size(); ++s) {
      ASSERT_EQ(per_rank.at(1)[s].layers.size(), r0[s].layers.size());
      for (size_t l = 0; l < r0[s].layers.size(); ++l) {
        EXPECT_EQ(per_rank.at(1)[s].layers[l].first, r0[s].layers[l].first);
        EXPECT_EQ(std::memcmp(&per_rank.at(1)[s].layers[l].second, &r0[s].layers[l].second, 8), 0)
            << "step " << s + 1 << " layer " << r0[s].layers[l].first;
      }
    }
    // The squares add up to the global norm's square at every step.
    for (size_t s = 0; s < r0.size(); ++s) {
      double sum = 0;
      for (const auto& [layer, n] : r0[s].layers) sum += n * n;
      EXPECT_NEAR(sum, r0[s].global * r0[s].global, 1e-12 * sum) << "step " << s + 1;
    }
    // Step 1 against the plain model's gradients (the ranks' average differs from the plain sum
    // of halves only by f32 rounding).
    ASSERT_EQ(r0[0].layers.size(), plain.size());
    for (size_t l = 0; l < plain.size(); ++l) {
      EXPECT_EQ(r0[0].layers[l].first, plain[l].first);
      EXPECT_NEAR(r0[0].layers[l].second, plain[l].second, 1e-5 * plain[l].second)
          << plain[l].first;
      EXPECT_GT(plain[l].second, 0.0) << plain[l].first;
    }
    first_step[stage] = r0[0].layers;
  }
  // The sharded stages sum the same gradient elements as DDP, only in another order.
  for (int stage : {1, 2, 3})
    for (size_t l = 0; l < plain.size(); ++l)
      EXPECT_NEAR(first_step[stage][l].second, first_step[0][l].second,
                  1e-12 * first_step[0][l].second)
          << "ZeRO-" << stage << " " << plain[l].first;
}

TEST(LayerGradNorms, OffByDefault) {
  auto engine_owner = testing::gpt_engine(tiny(), comm::ProcessGroupPtr{});
  TrainEngine& engine = *engine_owner;
  StepOptions so;
  so.step = 1;
  so.lr = 1e-3f;
  EXPECT_TRUE(engine.train_step({batch(0, 1)}, so).layer_grad_norms.empty());
}

}  // namespace
}  // namespace meshtrain::parallel
