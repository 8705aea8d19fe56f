// Tensor and sequence parallelism with the model on a device: the activations' collectives go
// through the device group's tp groups, the gradients' through its dp groups, and the
// vocabulary-parallel table and loss run as device kernels. On the fake device (device memory is
// host memory, the kernels are the CPU's) with host groups that call themselves nccl and check
// that every buffer they are handed is device memory, every loss and parameter must be the CPU
// run's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/tensor_parallel/vocab_parallel_cross_entropy.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/cuda/zero_training.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);

class TensorParallelOnDevice : public test::FakeDeviceTest {};

Tensor counting(int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) - 7.5f;
  return Tensor::from_vector(v, {n}).to(dtype);
}

TEST_F(TensorParallelOnDevice, NarrowAndCatCopyBlocksWithinTheDevice) {
  for (const DType dtype : {DType::f32, DType::i32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor a = counting(2 * 6 * 5, dtype).view({2, 6, 5});
    const Tensor b = counting(2 * 3 * 5, dtype).view({2, 3, 5});
    const Tensor da = a.to(kDev), db = b.to(kDev);
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(dim);
      const int64_t len = a.size(dim) - 1;
      const Tensor n = ops::narrow(da, dim, 1, len);
      EXPECT_EQ(n.device(), kDev);
      EXPECT_TRUE(ops::equal(n, ops::narrow(a, dim, 1, len)));
    }
    const int copies = alloc_.copies;
    const Tensor c = ops::cat({da, db, da}, 1);
    EXPECT_EQ(c.device(), kDev);
    EXPECT_TRUE(ops::equal(c, ops::cat({a, b, a}, 1)));
    // One strided copy a part (a row each under the fake allocator's default): no host trip.
    EXPECT_EQ(alloc_.copies - copies, 3 * 2 + 1) << "the parts' rows, then the check's download";
  }
  // The gradient of a narrow is the incoming gradient between zeros, on the device.
  Tensor x = counting(4 * 3, DType::f32).view({4, 3}).to(kDev);
  x.set_requires_grad(true);
  Tensor y = autograd::narrow(x, 1, 1, 1);
  autograd::backward(y, Tensor::ones(y.shape(), DType::f32, kDev));
  EXPECT_EQ(x.grad().device(), kDev);
  EXPECT_EQ(x.grad().to(Device::cpu()).to_vector(),
            (std::vector<float>{0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0}));
}

// The loss alone on one rank: the CPU's bits, its mean and count left on the device (the host
// reads nothing: a negative target gives NaN there, where the CPU refuses it in one line).
TEST_F(TensorParallelOnDevice, TheVocabParallelLossStaysOnTheDevice) {
  Generator gen(17);
  const Tensor logits = randn({6, 9}, gen);
  const Tensor targets = Tensor::from_vector(std::vector<int32_t>{3, -1, 0, 8, 2, -1}, {6});
  const auto loss_and_grad = [&](Device d) {
    Tensor x = logits.to(d).clone();
    x.set_requires_grad(true);
    Tensor loss = parallel::tp::vocab_parallel_cross_entropy(x, targets.to(d), 0, 8, nullptr, -1);
    EXPECT_EQ(loss.device(), d);
    autograd::backward(loss);
    return std::make_pair(loss.item(), x.grad().to(Device::cpu()).to_vector());
  };
  const int downloads = alloc_.downloads;
  const auto dev = loss_and_grad(kDev);
  EXPECT_EQ(alloc_.downloads - downloads, 2) << "the loss and the gradient, read by this test";
  EXPECT_EQ(dev, loss_and_grad(Device::cpu()));
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{3, -5, 0, 8, 2, -1}, {6});
  EXPECT_TRUE(std::isnan(
      parallel::tp::vocab_parallel_cross_entropy(logits.to(kDev), bad.to(kDev), 0, 8, nullptr, -1)
          .item()));
  EXPECT_THROW(parallel::tp::vocab_parallel_cross_entropy(logits, bad, 0, 8, nullptr, -1), Error);
}

struct Layout {
  int world = 2;
  int tp = 2;
  bool sequence_parallel = false;
  float dropout = 0.0f;
  int zero_stage = 0;  // ZeRO-1/2 over the replicas runs as a pipeline of one stage
};

std::string describe(const Layout& l) {
  return "world " + std::to_string(l.world) + " tp " + std::to_string(l.tp) +
         (l.sequence_parallel ? " sp" : "") + (l.dropout > 0 ? " dropout" : "") + " zero" +
         std::to_string(l.zero_stage);
}

parallel::EngineOptions tp_options(const Layout& l) {
  parallel::EngineOptions o;
  o.adamw.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.reducer.first_bucket_bytes = 4 << 10;
  o.reducer.bucket_bytes = 16 << 10;
  o.sequence_parallel = l.sequence_parallel;
  o.zero_stage = l.zero_stage;
  return o;
}

// Three steps through the engine on `world` ranks: tp-sized blocks of neighbouring ranks, each
// block one data-parallel replica with batches of its own.
std::vector<test::Trained> train_tp(Device device, const Layout& l,
                                    const std::shared_ptr<test::FakeNcclGroup::Shared>& shared) {
  std::vector<test::Trained> out(static_cast<size_t>(l.world));
  testing::run_shm_ranks(l.world, [&](int r, const comm::ProcessGroupPtr& g) {
    nn::GPTConfig gc = test::tiny_gpt_config();
    gc.dropout = l.dropout;
    parallel::EngineSpec spec;
    spec.model = std::make_shared<models::GptSource>(gc);
    spec.mesh = parallel::DeviceMesh(g, {{"pp", 1}, {"dp", l.world / l.tp}, {"tp", l.tp}});
    const int replica = spec.mesh.coord("dp");
    spec.device = device;
    if (!device.is_cpu()) spec.grad_group = std::make_shared<test::FakeNcclGroup>(g, shared);
    spec.options = tp_options(l);
    auto engine = parallel::make_engine(std::move(spec));
    test::Trained& t = out[static_cast<size_t>(r)];
    t.losses = test::zero_steps(*engine, device, replica, 0, 3);
    t.params = test::whole_parameters(*engine);
  });
  return out;
}

TEST_F(TensorParallelOnDevice, TheEngineGivesTheCpusBits) {
  for (const Layout& l :
       {Layout{2, 2, false, 0.0f}, Layout{2, 2, true, 0.1f}, Layout{4, 2, true, 0.0f},
        Layout{4, 4, false, 0.1f}, Layout{4, 2, false, 0.1f, 1}, Layout{4, 2, true, 0.0f, 2}}) {
    SCOPED_TRACE(describe(l));
    const std::vector<test::Trained> cpu = train_tp(Device::cpu(), l, nullptr);
    kernels_.calls.clear();
    const auto shared = test::FakeNcclGroup::checking(alloc_);
    const std::vector<test::Trained> dev = train_tp(kDev, l, shared);
    for (size_t r = 0; r < cpu.size(); ++r) {
      EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
      EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
      // The tp ranks of a replica hold the same whole model.
      EXPECT_EQ(dev[r].params, dev[r - r % static_cast<size_t>(l.tp)].params) << "rank " << r;
    }
    EXPECT_GT(kernels_.calls["vocab_lookup_forward"], 0);
    EXPECT_GT(kernels_.calls["vocab_lookup_backward"], 0);
    EXPECT_GT(kernels_.calls["vocab_parallel_row_sums"], 0);
    EXPECT_GT(kernels_.calls["vocab_parallel_backward"], 0);
    EXPECT_GT(kernels_.calls["vocab_parallel_loss_mean"], 0);
    if (l.dropout > 0) {
      EXPECT_GT(kernels_.calls["dropout"], 0);
    }
    // The activations (and, over two replicas, the gradients) went through the device groups.
    EXPECT_GT(shared->collectives.load(), 3 * 2 * 2);
  }
}

TEST_F(TensorParallelOnDevice, WhatItCannotRunIsRefusedInOneLine) {
  const auto refused = [&](const std::function<void(parallel::EngineOptions&)>& change,
                           const std::string& expected) {
    testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& g) {
      parallel::EngineSpec spec;
      spec.model = std::make_shared<models::GptSource>(test::tiny_gpt_config());
      spec.mesh = parallel::DeviceMesh(g, {{"pp", 1}, {"dp", 1}, {"tp", 2}});
      spec.device = kDev;
      spec.grad_group = std::make_shared<test::FakeNcclGroup>(g);
      spec.options = tp_options(Layout{});
      change(spec.options);
      try {
        parallel::make_engine(std::move(spec));
        ADD_FAILURE() << "accepted; expected: " << expected;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    });
  };
  refused([](parallel::EngineOptions& o) { o.precision = DType::bf16; }, "f32");
  // Without the device's group there is nothing to carry the activations.
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& g) {
    parallel::EngineSpec spec;
    spec.model = std::make_shared<models::GptSource>(test::tiny_gpt_config());
    spec.mesh = parallel::DeviceMesh(g, {{"pp", 1}, {"dp", 1}, {"tp", 2}});
    spec.device = kDev;
    EXPECT_THROW(parallel::make_engine(std::move(spec)), Error);
  });
}

}  // namespace
}  // namespace meshtrain
