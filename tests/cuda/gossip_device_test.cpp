// Gossip averaging with the replicas on a device: each replica steps on its own gradients on the
// device, then its parameters go to host memory, are averaged with its neighbours' over the host
// group with the CPU's arithmetic, and come back. On the fake device (device memory is host
// memory, the kernels are the CPU's) every loss and parameter of every replica must be the CPU
// run's bits.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/gossip/gossip_graph.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/cuda/zero_training.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);

class GossipOnDevice : public test::FakeDeviceTest {};

std::vector<test::Trained> train_gossip(Device device, parallel::GossipGraph graph, int world) {
  std::vector<test::Trained> out(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int r, const comm::ProcessGroupPtr& g) {
    parallel::EngineOptions o;
    o.adamw.lr = 3e-3f;
    o.weight_decay = 0.1f;
    o.gossip = graph;
    parallel::EngineSpec spec;
    spec.model = std::make_shared<models::GptSource>(test::tiny_gpt_config());
    spec.mesh = parallel::data_parallel_mesh(g);
    spec.device = device;
    spec.options = o;
    auto engine = parallel::make_engine(std::move(spec));
    test::Trained& t = out[static_cast<size_t>(r)];
    t.losses = test::zero_steps(*engine, device, r, 0, 3);
    for (const auto& [name, p] : engine->local_parameters())
      t.params.push_back(p.to(Device::cpu()).to_vector());
  });
  return out;
}

TEST_F(GossipOnDevice, TheReplicasAverageWithTheCpusBits) {
  for (const auto& [graph, world] : std::vector<std::pair<parallel::GossipGraph, int>>{
           {parallel::GossipGraph::ring, 3}, {parallel::GossipGraph::exponential, 4}}) {
    SCOPED_TRACE(world);
    const std::vector<test::Trained> cpu = train_gossip(Device::cpu(), graph, world);
    kernels_.calls.clear();
    const std::vector<test::Trained> dev = train_gossip(kDev, graph, world);
    for (size_t r = 0; r < cpu.size(); ++r) {
      EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
      EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
    }
    // The replicas differ (each stepped on its own batches) and were drawn together.
    EXPECT_NE(dev[0].params, dev[1].params);
    EXPECT_GT(kernels_.calls["adamw_step_many"], 0) << "the update ran on the device";
  }
}

}  // namespace
}  // namespace meshtrain
