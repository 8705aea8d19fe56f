// ZeRO-1/2 with the parameters on a device: the padded buckets, the reduce-scattered shards, the
// parameter arenas and the optimizer's segments are device memory, exchanged over a device group.
// On the fake device (device memory is host memory, the kernels are the CPU's) with a host group
// that calls itself nccl, every step's loss and the final parameters must be the CPU run's bits,
// on one rank and on two thread ranks.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/zero/zero_shards.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/cuda/zero_training.h"

namespace meshtrain {
namespace {

using test::train_zero;
using test::Trained;

const Device kDev = Device::cuda(0);

class ZeroOnDevice : public test::FakeDeviceTest {};

// Runs `fn` on `world` thread ranks of one shm group; rethrows the first failure.
void on_thread_ranks(int world, const std::function<void(comm::ProcessGroupPtr)>& fn) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  static int made = 0;
  const std::string name = "zero-device-" + std::to_string(made++);
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions po;
        po.name = name;
        fn(comm::make_process_group("shm", store, r, world, po));
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

TEST_F(ZeroOnDevice, StagesOneAndTwoOnOneRankAreTheCpuRunsBits) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    Trained cpu, dev;
    on_thread_ranks(1, [&](comm::ProcessGroupPtr g) { cpu = train_zero(Device::cpu(), stage, g); });
    on_thread_ranks(1, [&](comm::ProcessGroupPtr g) {
      auto nccl = std::make_shared<test::FakeNcclGroup>(g);
      dev = train_zero(kDev, stage, nccl);
      EXPECT_GT(nccl->all_gathers.load(), 0) << "the parameters are gathered on the device";
      if (stage == 2) {
        EXPECT_GT(nccl->reduce_scatters.load(), 0);
      }
    });
    EXPECT_EQ(dev.losses, cpu.losses);
    EXPECT_EQ(dev.params, cpu.params);
  }
  EXPECT_GT(kernels_.calls["adamw_step_many"], 0) << "the segments' update ran on the device";
}

TEST_F(ZeroOnDevice, StagesOneAndTwoOnTwoThreadRanksAreTheCpuRunsBits) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    std::vector<Trained> cpu(2), dev(2);
    on_thread_ranks(2, [&](comm::ProcessGroupPtr g) {
      cpu[static_cast<size_t>(g->rank())] = train_zero(Device::cpu(), stage, g);
    });
    on_thread_ranks(2, [&](comm::ProcessGroupPtr g) {
      const size_t r = static_cast<size_t>(g->rank());
      dev[r] = train_zero(kDev, stage, std::make_shared<test::FakeNcclGroup>(g));
    });
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
      EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
    }
    // Each rank updated its half; the gathered parameters are the same on both.
    EXPECT_EQ(dev[0].params, dev[1].params);
    EXPECT_NE(dev[0].losses, dev[1].losses) << "the ranks trained on batches of their own";
  }
}

TEST_F(ZeroOnDevice, AHostGroupForDeviceParametersIsOneLine) {
  on_thread_ranks(1, [&](comm::ProcessGroupPtr g) {
    nn::GPTConfig gc;
    gc.n_layer = 1;
    gc.n_embd = 16;
    gc.n_head = 2;
    gc.block_size = 8;
    gc.vocab_size = 11;
    nn::GPT model(gc);
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
