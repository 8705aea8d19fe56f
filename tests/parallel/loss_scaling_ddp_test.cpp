// f16 loss scaling under data parallelism: gradients are unscaled after the all-reduce, so a
// non-finite gradient on one rank only (injected into its local gradient before the reducer
// sees it) reaches every rank through the sum, every rank skips that step and backs its scale
// off, and the replicas stay bitwise identical without a collective for the decision.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <limits>
#include <thread>

#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 16, kMicro = 2, kSteps = 8, kInjectStep = 3;
// h.1.attn.c_attn.weight: inside the checkpointed block.
constexpr size_t kPoisoned = 16;

struct RankRun {
  std::vector<std::vector<float>> params;  // all parameters, flattened, after each step
  std::vector<float> scales;
  std::vector<bool> skipped;
};

RankRun train_rank(int rank, comm::ProcessGroupPtr pg, int inject_rank, int zero_stage) {
  omp_set_num_threads(1);
  nn::GPTConfig c;
  c.vocab_size = 31;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 4;
  c.checkpointed_blocks = nn::parse_activation_checkpointing("1", c.n_layer);
  auto model = std::make_shared<nn::GPT>(c);
  // Registered before the engine's gradient hooks, so it poisons the local gradient first.
  int64_t step = 0;
  Tensor poisoned = model->named_parameters()[kPoisoned].second;
  if (rank == inject_rank) {
    autograd::register_grad_ready_hook(poisoned, [&step](const Tensor& p) {
      if (step == kInjectStep) p.grad().data<float>()[0] = std::numeric_limits<float>::infinity();
    });
  }
  EngineOptions o;
  o.zero_stage = zero_stage;
  o.optimizer = optim::OptimizerKind::sgd;
  o.sgd.lr = 0.1f;
  o.sgd.momentum = 0.9f;
  o.precision = DType::f16;
  o.loss_scaler = optim::LossScalerOptions{.init_scale = 4096, .growth_interval = 3};
  auto engine_owner = testing::gpt_engine(model, pg, o);
  TrainEngine& engine = *engine_owner;
  RankRun out;
  for (step = 0; step < kSteps; ++step) {
    Generator g(1000 + static_cast<uint64_t>(step));
    std::vector<int32_t> x(static_cast<size_t>(2 * kMicro * kT)), y(x.size());
    for (auto& t : x) t = static_cast<int32_t>(g.below(31));
    for (auto& t : y) t = static_cast<int32_t>(g.below(31));
    Tensor xa = Tensor::from_vector(x, {2 * kMicro, kT}),
           ya = Tensor::from_vector(y, {2 * kMicro, kT});
    StepOptions so;
    so.step = step + 1;
    so.lr = 0.1f;
    so.grad_clip = 1.0;
    const StepOutcome r =
        engine.train_step({{xa.slice(rank * kMicro, (rank + 1) * kMicro).clone(),
                            ya.slice(rank * kMicro, (rank + 1) * kMicro).clone()}},
                          so);
    std::vector<float> flat;
    for (auto& [n, p] : engine.gather_parameters()) {
      auto v = p.to_vector();
      flat.insert(flat.end(), v.begin(), v.end());
    }
    out.params.push_back(std::move(flat));
    out.scales.push_back(r.loss_scale);
    out.skipped.push_back(r.skipped);
  }
  if (rank == inject_rank) autograd::clear_grad_ready_hooks(poisoned);
  return out;
}

class LossScalingDataParallel : public ::testing::TestWithParam<int> {};

TEST_P(LossScalingDataParallel, AnOverflowOnOneRankIsSkippedByEveryRank) {
  std::vector<RankRun> runs(2);
  meshtrain::testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& pg) {
    runs[static_cast<size_t>(r)] = train_rank(r, pg, /*inject_rank=*/1, GetParam());
  });

  for (int r = 0; r < 2; ++r) {
    const RankRun& run = runs[static_cast<size_t>(r)];
    for (int64_t s = 0; s < kSteps; ++s)
      EXPECT_EQ(run.skipped[static_cast<size_t>(s)], s == kInjectStep)
          << "rank " << r << " step " << s;
    EXPECT_EQ(run.params[kInjectStep], run.params[kInjectStep - 1]) << "rank " << r;
  }
  // 3 finite steps grow the scale, the overflow halves it: every rank agrees at every step.
  EXPECT_EQ(runs[0].scales, (std::vector<float>{4096, 4096, 4096, 8192, 4096, 4096, 4096, 8192}));
  EXPECT_EQ(runs[1].scales, runs[0].scales);
  EXPECT_EQ(runs[1].params, runs[0].params);
}

// DDP and every ZeRO stage: the overflow is found in whichever shard holds it.
INSTANTIATE_TEST_SUITE_P(ZeroStages, LossScalingDataParallel, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace meshtrain::parallel
