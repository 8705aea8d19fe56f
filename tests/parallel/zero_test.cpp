// ZeRO-1 and ZeRO-2 against DDP through the training engine: the same batches on thread ranks
// over the shm backend must give the same parameters at every step. They must be bitwise equal
// where only the update is sharded (AdamW and SGD are elementwise, and the reduce-scatter
// averages each element in the all-reduce's rank order); with clipping, ZeRO-2 sums the
// gradient norm shard by shard and then across ranks, so the clip factor may differ in its last
// bits and the parameters are compared to 1e-6 relative instead.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/zero/fsdp_units.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/engines.h"

namespace meshtrain::parallel {
namespace {

constexpr int64_t kT = 16, kB = 2;

struct TrainSetup {
  int world = 2;
  int stage = 0;
  int steps = 20;
  int accum = 1;
  double clip = 0.0;
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;
  DType precision = DType::f32;
  size_t bucket_bytes = 4096;  // several buckets, and parameters cut by the shard boundaries
  std::string checkpointing = "none";
  int layers = 2;
};

nn::GPTConfig tiny_gpt(const std::string& checkpointing = "none", int layers = 2) {
  nn::GPTConfig c;
  c.vocab_size = 37;
  c.block_size = kT;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 11;
  c.checkpointed_blocks = nn::parse_activation_checkpointing(checkpointing, c.n_layer);
  return c;
}

// Rank r's micro-batch a of step s: the same on every run.
Batch batch(int rank, int64_t step, int a) {
  Generator gen(1000 + static_cast<uint64_t>(step) * 97 + static_cast<uint64_t>(a) * 13 +
                static_cast<uint64_t>(rank));
  Tensor x = Tensor::empty({kB, kT}, DType::i32);
  Tensor y = Tensor::empty({kB, kT}, DType::i32);
  for (int64_t i = 0; i < kB * kT; ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 37);
    y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 37);
  }
  return {x, y};
}

// Every parameter of rank 0 after each step, flattened in registration order.
using Trajectory = std::vector<std::vector<float>>;

// In-place collectives the shm group ran on rank 0: reduce-scatters, all-gathers.
struct InPlace {
  uint64_t reduce_scatters = 0, all_gathers = 0;
};

Trajectory train(const TrainSetup& s, std::vector<double>* norms = nullptr,
                 InPlace* in_place = nullptr) {
  Trajectory out;
  std::mutex mu;
  testing::run_shm_ranks(s.world, [&](int rank, const comm::ProcessGroupPtr& pg) {
    omp_set_num_threads(1);
    EngineOptions o;
    o.zero_stage = s.stage;
    o.optimizer = s.optimizer;
    o.adamw.lr = 1e-2f;
    o.sgd.lr = 0.1f;
    o.sgd.momentum = 0.9f;
    o.weight_decay = 0.1f;
    o.precision = s.precision;
    if (s.precision == DType::f16) {
      o.loss_scaler = optim::LossScalerOptions{};
      o.loss_scaler->init_scale = 256.0;
    }
    o.reducer.bucket_bytes = s.bucket_bytes;
    o.reducer.first_bucket_bytes = 1024;
    auto engine_owner = testing::gpt_engine(tiny_gpt(s.checkpointing, s.layers), pg, o);
    TrainEngine& engine = *engine_owner;
    // The strategy under test really runs: ZeRO-3 as units of one block each.
    if (s.stage == 3) {
      ASSERT_NE(engine.fsdp(), nullptr);
      ASSERT_EQ(engine.fsdp()->num_units(), s.layers + 1);
    } else {
      ASSERT_EQ(engine.fsdp(), nullptr);
    }
    for (int step = 1; step <= s.steps; ++step) {
      std::vector<Batch> mbs;
      for (int a = 0; a < s.accum; ++a) mbs.push_back(batch(rank, step, a));
      StepOptions so;
      so.step = step;
      so.lr = 1e-2f;
      so.grad_clip = s.clip;
      const StepOutcome r = engine.train_step(mbs, so);
      ASSERT_FALSE(r.skipped) << "step " << step;
      // Collective (ZeRO-3 gathers its shards), so every rank calls it.
      const nn::NamedTensors whole = engine.gather_parameters();
      if (rank != 0) continue;
      std::vector<float> flat;
      for (const auto& [name, p] : whole)
        flat.insert(flat.end(), p.data<float>(), p.data<float>() + p.numel());
      std::lock_guard<std::mutex> lock(mu);
      out.push_back(std::move(flat));
      if (norms) norms->push_back(r.grad_norm);
    }
    // Under ZeRO the replicas are whole again after each step's all-gather.
    engine.check_in_sync(s.steps);
    if (in_place && rank == 0) {
      const auto& shm = dynamic_cast<const comm::ShmProcessGroup&>(*pg);
      in_place->reduce_scatters = shm.in_place_reduce_scatters();
      in_place->all_gathers = shm.in_place_all_gathers();
    }
  });
  return out;
}

void expect_bitwise(const Trajectory& a, const Trajectory& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    ASSERT_EQ(0, std::memcmp(a[s].data(), b[s].data(), a[s].size() * 4))
        << what << ": parameters differ after step " << s + 1;
  }
}

void expect_close(const Trajectory& a, const Trajectory& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a[s].size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[s][i]) - b[s][i]));
      norm = std::max(norm, std::fabs(static_cast<double>(a[s][i])));
    }
    EXPECT_LE(diff, rel * norm) << what << ": step " << s + 1;
  }
}

class ZeroVsDdp : public ::testing::TestWithParam<int> {};

TEST_P(ZeroVsDdp, AdamWBitwiseAtEveryStep) {
  TrainSetup s;
  s.world = GetParam();
  const Trajectory ddp = train(s);
  ASSERT_EQ(ddp.size(), 20u);
  for (int stage : {1, 2, 3}) {
    s.stage = stage;
    expect_bitwise(ddp, train(s), "ZeRO-" + std::to_string(stage));
  }
}

TEST_P(ZeroVsDdp, AccumulationSgdAndF16Bitwise) {
  TrainSetup s;
  s.world = GetParam();
  s.steps = 6;
  s.accum = 2;
  s.optimizer = optim::OptimizerKind::sgd;
  s.precision = DType::f16;
  const Trajectory ddp = train(s);
  for (int stage : {1, 2, 3}) {
    s.stage = stage;
    expect_bitwise(ddp, train(s), "ZeRO-" + std::to_string(stage) + " sgd f16 accumulation");
  }
}

TEST_P(ZeroVsDdp, ClippingOnTheGlobalNorm) {
  TrainSetup s;
  s.world = GetParam();
  s.steps = 8;
  s.clip = 0.05;  // below the gradient norm of every step: clipping is active
  std::vector<double> ddp_norms, z2_norms;
  const Trajectory ddp = train(s, &ddp_norms);
  for (double n : ddp_norms) ASSERT_GT(n, s.clip);
  // ZeRO-1 holds the whole averaged gradient and sums the norm as DDP does.
  s.stage = 1;
  expect_bitwise(ddp, train(s), "ZeRO-1 clipped");
  // ZeRO-2 sums it per shard and then across ranks: another order of the same sum.
  s.stage = 2;
  const Trajectory z2 = train(s, &z2_norms);
  for (size_t i = 0; i < ddp_norms.size(); ++i)
    EXPECT_NEAR(z2_norms[i], ddp_norms[i], 1e-9 * ddp_norms[i]);
  expect_close(ddp, z2, 1e-6, "ZeRO-2 clipped");
  // ZeRO-3 sums it per unit shard: the same bound.
  s.stage = 3;
  std::vector<double> z3_norms;
  const Trajectory z3 = train(s, &z3_norms);
  for (size_t i = 0; i < ddp_norms.size(); ++i)
    EXPECT_NEAR(z3_norms[i], ddp_norms[i], 1e-9 * ddp_norms[i]);
  expect_close(ddp, z3, 1e-6, "ZeRO-3 clipped");
}

// bf16 autocast rounds the matrix products' inputs; the gradients and updates stay f32, so every
// stage still gives DDP's bits.
TEST_P(ZeroVsDdp, Bf16AutocastBitwise) {
  TrainSetup s;
  s.world = GetParam();
  s.steps = 6;
  s.precision = DType::bf16;
  const Trajectory ddp = train(s);
  for (int stage : {1, 2, 3}) {
    s.stage = stage;
    expect_bitwise(ddp, train(s), "ZeRO-" + std::to_string(stage) + " bf16");
  }
}

// Recomputation under ZeRO-3 runs after the block's parameters were gathered for backward, so
// checkpointed blocks give DDP's bits too; four blocks exercise the two alternating unit
// buffers and the prefetch of the block before.
TEST_P(ZeroVsDdp, ActivationCheckpointingUnderZero3Bitwise) {
  TrainSetup s;
  s.world = GetParam();
  s.steps = 5;
  s.layers = 4;
  s.checkpointing = "every:2";
  const Trajectory ddp = train(s);
  s.stage = 3;
  expect_bitwise(ddp, train(s), "ZeRO-3 with activation checkpointing");
}

// With the shm group's shared-buffer threshold lowered to this model's bucket sizes, ZeRO's
// reduce-scatters and all-gathers read the peers' arenas in place instead of staging copies,
// and the parameters are still DDP's bit for bit.
TEST_P(ZeroVsDdp, ShardsAreReducedAndGatheredInPlaceWithDdpBits) {
  ::setenv("MESHTRAIN_SHM_SHARED_MIN_BYTES", "1", 1);
  TrainSetup s;
  s.world = GetParam();
  s.steps = 4;
  const Trajectory ddp = train(s);
  for (int stage : {1, 2, 3}) {
    s.stage = stage;
    InPlace counts;
    expect_bitwise(ddp, train(s, nullptr, &counts), "ZeRO-" + std::to_string(stage) + " in place");
    EXPECT_GT(counts.all_gathers, 0u) << "ZeRO-" << stage;
    if (stage >= 2) {
      EXPECT_GT(counts.reduce_scatters, 0u) << "ZeRO-" << stage;
    }
  }
  ::unsetenv("MESHTRAIN_SHM_SHARED_MIN_BYTES");
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroVsDdp, ::testing::Values(2, 4));

}  // namespace
}  // namespace meshtrain::parallel
