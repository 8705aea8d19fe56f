// Expert parallelism with the tokens on a device: the experts' rows travel through host memory
// over the host block group and come back to the device; the experts' gradients are summed over
// their copies through the device group. On the fake device (device memory is host memory, the
// kernels are the CPU's) with host groups that call themselves nccl, every loss, gradient and
// parameter must be the CPU run's bits. Both sides run each expert's MLP on its own (the CPU's
// grouped experts take other product kernels).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/expert/expert_groups.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/cuda/zero_training.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);

class ExpertsOnDevice : public test::FakeDeviceTest {};

nn::GPTConfig experts_config() {
  nn::GPTConfig gc = test::tiny_gpt_config();
  gc.moe.every = 1;
  gc.moe.num_experts = 4;
  gc.moe.top_k = 2;
  gc.moe.grouped_experts = false;
  gc.moe.bias_update_rate = 0.01;
  return gc;
}

struct Pass {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

// One forward and backward of the model with its experts shared out over `group`.
Pass one_pass(Device device, const comm::ProcessGroupPtr& group) {
  nn::GPT model(experts_config(), parallel::group_expert_exchange(group));
  model.to(device);
  model.train();
  Generator gen(40 + static_cast<uint64_t>(group->rank()));
  auto [x, y] = test::random_tokens(gen, 2, device);
  Tensor loss = model.loss(x, y);
  autograd::backward(loss);
  Pass p;
  p.loss = loss.item();
  for (const auto& [name, t] : model.named_parameters()) {
    EXPECT_EQ(t.grad().device(), device) << name;
    p.grads.push_back(t.grad().to(Device::cpu()).to_vector());
  }
  return p;
}

TEST_F(ExpertsOnDevice, TheExchangeThroughHostMemoryGivesTheCpusBits) {
  std::vector<Pass> cpu(2), dev(2);
  testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
    cpu[static_cast<size_t>(r)] = one_pass(Device::cpu(), g);
  });
  kernels_.calls.clear();
  testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
    dev[static_cast<size_t>(r)] = one_pass(kDev, g);
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(dev[r].loss, cpu[r].loss) << "rank " << r;
    EXPECT_EQ(dev[r].grads, cpu[r].grads) << "rank " << r;
  }
  EXPECT_GT(kernels_.calls["gather_rows"], 0);
}

// Through the engine: DDP for the rest, the experts' gradients averaged over their copies (two
// blocks of two on four ranks: a device replica group) or scaled (one block of two).
std::vector<test::Trained> train_experts(Device device, int world) {
  std::vector<test::Trained> out(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& g) {
    parallel::EngineOptions o;
    o.adamw.lr = 3e-3f;
    o.weight_decay = 0.1f;
    o.reducer.first_bucket_bytes = 4 << 10;
    o.reducer.bucket_bytes = 16 << 10;
    parallel::EngineSpec spec;
    spec.model = std::make_shared<models::GptSource>(experts_config());
    spec.mesh = parallel::data_parallel_mesh(g);
    spec.experts = parallel::make_expert_groups(spec.mesh.group("dp"), 2);
    spec.device = device;
    if (!device.is_cpu()) spec.grad_group = std::make_shared<test::FakeNcclGroup>(g);
    spec.options = o;
    auto engine = parallel::make_engine(std::move(spec));
    test::Trained& t = out[static_cast<size_t>(r)];
    t.losses = test::zero_steps(*engine, device, r, 0, 3);
    t.params = test::whole_parameters(*engine);
  });
  return out;
}

TEST_F(ExpertsOnDevice, TheEngineOverTwoAndFourRanksGivesTheCpusBits) {
  for (const int world : {2, 4}) {
    SCOPED_TRACE(world);
    const std::vector<test::Trained> cpu = train_experts(Device::cpu(), world);
    const std::vector<test::Trained> dev = train_experts(kDev, world);
    for (size_t r = 0; r < cpu.size(); ++r) {
      EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
      EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace meshtrain
