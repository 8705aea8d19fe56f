// ZeRO with the parameters on a device: the padded buckets, the reduce-scattered shards, the
// parameter arenas (ZeRO-1/2) or units (ZeRO-3) and the optimizer's segments are device memory,
// exchanged over a device group. On the fake device (device memory is host memory, the kernels are
// the CPU's) with a host group that calls itself nccl, every step's loss and the final parameters
// must be the CPU run's bits, on one rank and on two thread ranks.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/zero/zero_shards.h"
#include "meshtrain/tensor/random.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/cuda/zero_training.h"
#include "tests/parallel/shm_thread_ranks.h"
#include "tests/support/temp_dir.h"

namespace meshtrain {
namespace {

using test::train_zero;
using test::Trained;

const Device kDev = Device::cuda(0);

class ZeroOnDevice : public test::FakeDeviceTest {};

// Each stage on `world` thread ranks, on the CPU and on the fake device: the same losses and
// parameters, bit for bit; returns the device run's collectives on rank 0.
void expect_cpu_bits(int world, int stage, int* all_gathers, int* reduce_scatters,
                     const nn::GPTConfig& gc = test::tiny_gpt_config()) {
  std::vector<Trained> cpu(static_cast<size_t>(world)), dev(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& g) {
    cpu[static_cast<size_t>(r)] = train_zero(Device::cpu(), stage, g, nullptr, gc);
  });
  testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& g) {
    auto nccl = std::make_shared<test::FakeNcclGroup>(g);
    dev[static_cast<size_t>(r)] = train_zero(kDev, stage, g, nccl, gc);
    if (r == 0) {
      *all_gathers = nccl->all_gathers.load();
      *reduce_scatters = nccl->reduce_scatters.load();
    }
  });
  for (size_t r = 0; r < cpu.size(); ++r) {
    EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
    EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
  }
  EXPECT_EQ(dev[0].params, dev[1].params) << "the gathered parameters are the same everywhere";
}

TEST_F(ZeroOnDevice, EveryStageOnTwoThreadRanksIsTheCpuRunsBits) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    int gathers = 0, scatters = 0;
    expect_cpu_bits(2, stage, &gathers, &scatters);
    EXPECT_GT(gathers, 0) << "the parameters are gathered on the device";
    if (stage >= 2) {
      EXPECT_GT(scatters, 0) << "the gradients are reduce-scattered there";
    }
  }
  EXPECT_GT(kernels_.calls["adamw_step_many"], 0) << "the shards' update ran on the device";
}

// Mixture-of-experts blocks through the engine on the device, over DDP and ZeRO-2 on two ranks:
// the engine sums the experts' loads over the ranks and moves the balancing biases (a device
// buffer) after each step; the CPU run's bits. A device runs each expert's MLP on its own, so
// the CPU does too here: its grouped experts take other product kernels (other bits).
TEST_F(ZeroOnDevice, MixtureOfExpertsOverTwoThreadRanksIsTheCpuRunsBits) {
  nn::GPTConfig gc = test::tiny_gpt_config();
  gc.moe.every = 2;
  gc.moe.num_experts = 4;
  gc.moe.top_k = 2;
  gc.moe.bias_update_rate = 0.01;
  gc.moe.grouped_experts = false;
  for (int stage : {0, 2}) {
    SCOPED_TRACE(stage);
    int gathers = 0, scatters = 0;
    kernels_.calls.clear();
    expect_cpu_bits(2, stage, &gathers, &scatters, gc);
    EXPECT_GT(kernels_.calls["scatter_add_rows"], 0) << "the experts' rows moved on the device";
  }
}

// One step of `micro_batches` micro-batches of random tokens (the same ones for a seed).
parallel::StepOutcome step_of(parallel::TrainEngine& engine, int micro_batches, int step) {
  std::vector<parallel::Batch> batches;
  Generator gen(5);
  for (int i = 0; i < micro_batches; ++i) {
    auto [x, y] = test::random_tokens(gen, 2, kDev);
    batches.push_back({x, y});
  }
  parallel::StepOptions so;
  so.step = step;
  so.lr = 1e-3f;
  so.grad_clip = 1.0;
  return engine.train_step(batches, so);
}

// The host reads a step's losses once, after its last micro-batch, not once a micro-batch (which
// would wait for the device between micro-batches): a step of three micro-batches reads from the
// device as often as a step of one.
TEST_F(ZeroOnDevice, AStepReadsItsLossesOnceWhateverItsMicroBatches) {
  testing::run_shm_ranks(1, [&](int, const comm::ProcessGroupPtr& g) {
    auto engine = test::zero_engine(kDev, 0, g, std::make_shared<test::FakeNcclGroup>(g));
    auto reads = [&](int micro_batches, int step) {
      const int before = alloc_.downloads;
      EXPECT_FALSE(step_of(*engine, micro_batches, step).skipped);
      return alloc_.downloads - before;
    };
    const int one = reads(1, 1);
    EXPECT_GT(one, 0);
    EXPECT_EQ(reads(3, 2), one);
  });
}

// A bf16 step's micro-batches share one half copy of each weight: three micro-batches cast as
// often as one (each weight once). ZeRO-3 over two ranks, whose forwards gather their own
// parameters, casts each weight once a micro-batch.
TEST_F(ZeroOnDevice, MicroBatchesShareOneHalfCopyOfEachWeight) {
  for (const int stage : {0, 3}) {
    SCOPED_TRACE(stage);
    const int world = stage == 3 ? 2 : 1;
    std::mutex mu;
    testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& g) {
      parallel::EngineOptions o;
      o.zero_stage = stage;
      o.precision = DType::bf16;
      parallel::EngineSpec spec;
      nn::GPTConfig gc = test::tiny_gpt_config();
      gc.n_head = gc.n_embd / 32;  // heads of 32: flash attention, no activation casts
      spec.model = std::make_shared<models::GptSource>(gc);
      spec.mesh = parallel::data_parallel_mesh(g);
      spec.device = kDev;
      spec.grad_group = std::make_shared<test::FakeNcclGroup>(g);
      spec.options = o;
      auto engine = parallel::make_engine(std::move(spec));
      auto casts = [&](int micro_batches, int step) {
        // The ranks share the table's counts: count the steps apart (all ranks cast alike).
        if (rank == 0) {
          std::lock_guard lock(mu);
          kernels_.calls.clear();
        }
        g->barrier()->wait();
        EXPECT_FALSE(step_of(*engine, micro_batches, step).skipped);
        g->barrier()->wait();
        std::lock_guard lock(mu);
        return kernels_.calls["cast"] / world;
      };
      const int one = casts(1, 1);
      g->barrier()->wait();
      const int three = casts(3, 2);
      EXPECT_GT(one, 0);
      EXPECT_EQ(three, stage == 3 ? 3 * one : one);
    });
  }
}

// A checkpoint of device shards: saved after two steps (the writer copies device tensors to the
// host), loaded into fresh engines on the device (host to device), the next two steps are the
// uninterrupted run's, bit for bit, at every stage.
TEST_F(ZeroOnDevice, CheckpointsOfDeviceShardsResumeBitForBit) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    meshtrain::testing::TempDir dir;
    const std::string root = dir.file("ckpt");
    std::vector<std::vector<float>> straight(2), resumed(2);
    std::vector<std::vector<std::vector<float>>> straight_params(2), resumed_params(2);
    ckpt::testing::ThreadBarrier barrier(2);
    testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
      auto engine = test::zero_engine(kDev, stage, g, std::make_shared<test::FakeNcclGroup>(g));
      test::zero_steps(*engine, kDev, r, 0, 2);
      ckpt::WriterOptions wo;
      wo.root = root;
      wo.rank = r;
      wo.layout = {.world_size = 2, .dp = 2, .tp = 1, .zero_stage = stage};
      wo.barrier = barrier.callback();
      ckpt::CheckpointWriter writer(wo);
      ckpt::RankShards shards;
      const nlohmann::json scalars = engine->checkpoint_state(shards, r);
      writer.save(2, shards, {{"step", 2}, {"optimizer", scalars}});
      writer.wait();
      straight[static_cast<size_t>(r)] = test::zero_steps(*engine, kDev, r, 2, 4);
      straight_params[static_cast<size_t>(r)] = test::whole_parameters(*engine);
    });
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(ckpt::resolve_checkpoint_dir(root));
    testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
      auto engine = test::zero_engine(kDev, stage, g, std::make_shared<test::FakeNcclGroup>(g));
      engine->restore(c, c.train_state().at("optimizer"));
      resumed[static_cast<size_t>(r)] = test::zero_steps(*engine, kDev, r, 2, 4);
      resumed_params[static_cast<size_t>(r)] = test::whole_parameters(*engine);
    });
    EXPECT_EQ(resumed, straight);
    EXPECT_EQ(resumed_params, straight_params);
  }
}

// What one GPU runs (CudaTraining.ZeroStagesOneAndTwoOverAOneRankNcclGroupFollowTheCpu): the
// parts over a one-rank group.
TEST_F(ZeroOnDevice, StagesOneAndTwoThroughTheirPartsOnOneRankAreTheCpuRunsBits) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    Trained cpu, dev;
    testing::run_shm_ranks(1, [&](int, const comm::ProcessGroupPtr& g) {
      cpu = test::train_zero_parts(Device::cpu(), stage, g);
    });
    testing::run_shm_ranks(1, [&](int, const comm::ProcessGroupPtr& g) {
      dev = test::train_zero_parts(kDev, stage, std::make_shared<test::FakeNcclGroup>(g));
    });
    EXPECT_EQ(dev.losses, cpu.losses);
    EXPECT_EQ(dev.params, cpu.params);
  }
}

TEST_F(ZeroOnDevice, AHostGroupForDeviceParametersIsOneLine) {
  testing::run_shm_ranks(1, [&](int, const comm::ProcessGroupPtr& g) {
    nn::GPT model(test::tiny_gpt_config(1));
    model.to(kDev);
    auto params = model.named_parameters();
    try {
      parallel::Reducer reducer(params, g, parallel::ZeroShards::reducer_options({}, 2, g->size()));
      FAIL() << "a host group took device gradients";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("need the nccl backend"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace meshtrain
