// A parameter-server job whose workers train on a device: each worker's gradient chunks go to
// the host as they are pushed and the servers' parameters come back to the device; the server
// runs on the CPU. Thread ranks on the shm backend (two workers, one server, sync): on the fake
// device (device memory is host memory, the kernels are the CPU's) every worker's losses and
// parameters must be the CPU job's bits.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/param_server/parameter_server.h"
#include "meshtrain/parallel/param_server/ps_layout.h"
#include "meshtrain/parallel/param_server/ps_links.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/cuda/zero_training.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);
constexpr int kWorkers = 2;

class ParamServerOnDevice : public test::FakeDeviceTest {};

parallel::EngineOptions job_options() {
  parallel::EngineOptions o;
  o.adamw.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.broadcast_buffers = false;
  return o;
}

// The workers' records; the server's slot stays empty.
std::vector<test::Trained> run_job(Device device) {
  std::vector<test::Trained> out(kWorkers + 1);
  testing::run_shm_ranks(kWorkers + 1, [&](int r, const comm::ProcessGroupPtr& job) {
    std::vector<int> workers(kWorkers);
    std::iota(workers.begin(), workers.end(), 0);
    // Both splits on every rank, in this order: each is collective over the job.
    const comm::ProcessGroupPtr worker_group = job->split(workers);
    job->split({kWorkers});
    const auto source = std::make_shared<models::GptSource>(test::tiny_gpt_config());
    const parallel::EngineOptions o = job_options();
    if (r == kWorkers) {
      const nn::NamedTensors params = source->build({})->module().named_parameters();
      std::vector<int64_t> sizes;
      for (const auto& [name, p] : params) sizes.push_back(p.numel());
      parallel::ParameterServerOptions so;
      so.grad_clip = 1.0;
      so.weight_decay = o.weight_decay;
      parallel::ParameterServer server(
          params, parallel::PsLayout(kWorkers, 1, sizes), 0,
          parallel::job_peers_of_server(job, kWorkers), nullptr,
          [&o](std::vector<optim::ParamGroup> g) {
            return parallel::make_engine_optimizer(o, std::move(g));
          },
          so);
      const parallel::ParameterServerReport report = server.serve();
      EXPECT_EQ(report.steps, 3);
      return;
    }
    parallel::EngineSpec spec;
    spec.model = source;
    spec.mesh = parallel::data_parallel_mesh(worker_group);
    spec.device = device;
    spec.options = o;
    parallel::ParamServerSpec ps;
    ps.links = parallel::job_peers_of_worker(job, kWorkers, 1);
    ps.servers = 1;
    spec.param_server = ps;
    auto engine = parallel::make_engine(std::move(spec));
    test::Trained& t = out[static_cast<size_t>(r)];
    t.losses = test::zero_steps(*engine, device, r, 0, 3);
    for (const auto& [name, p] : engine->local_parameters()) {
      EXPECT_EQ(p.device(), device) << name;
      t.params.push_back(p.to(Device::cpu()).to_vector());
    }
  });
  return out;
}

TEST_F(ParamServerOnDevice, TheWorkersTrainWithTheCpusBits) {
  const std::vector<test::Trained> cpu = run_job(Device::cpu());
  kernels_.calls.clear();
  const std::vector<test::Trained> dev = run_job(kDev);
  for (size_t r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(dev[r].losses, cpu[r].losses) << "worker " << r;
    EXPECT_EQ(dev[r].params, cpu[r].params) << "worker " << r;
  }
  // Sync without backup workers: both workers hold the servers' parameters.
  EXPECT_EQ(dev[0].params, dev[1].params);
  EXPECT_GT(kernels_.calls["gpt_embedding_backward"], 0) << "the workers ran on the device";
}

}  // namespace
}  // namespace meshtrain
