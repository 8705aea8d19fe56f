// Pipeline parallelism with the stages on a device: each stage's chunks live in device memory,
// the activations and gradients between stages (and the tied embedding's contributions) cross
// through host copies over the host pp group, the stages' replicas reduce their gradients
// through the device group's dp groups, and a stage split by tensor parallelism moves its
// activations through the device group's tp groups. On the fake device (device memory is host
// memory, the kernels are the CPU's) with host groups that call themselves nccl and check that
// every buffer they are handed is device memory, every loss, norm, validation loss and parameter
// must be the CPU pipeline's bits.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/parallel/pipeline/schedule.h"
#include "meshtrain/parallel/pipeline/stage_runner.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/parallel/pipeline_test_inputs.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

using parallel::pipeline::ScheduleKind;

const Device kDev = Device::cuda(0);
constexpr int64_t kB = 2, kT = 8, kVocab = 37;
constexpr int kSteps = 6;

class PipelineOnDevice : public test::FakeDeviceTest {};

struct Layout {
  ScheduleKind kind = ScheduleKind::gpipe;
  int P = 2, V = 1, dp = 1;
  int micro_batches = 0;  // 0: one per batch
  int zero_stage = 0;
  DType precision = DType::f32;
  bool tied = true;
  int tp = 1;
  bool sequence_parallel = false;
};

std::string describe(const Layout& l) {
  return std::string(parallel::pipeline::schedule_kind_name(l.kind)) + " P" + std::to_string(l.P) +
         " V" + std::to_string(l.V) + " dp" + std::to_string(l.dp) + " M" +
         std::to_string(l.micro_batches) + " zero" + std::to_string(l.zero_stage) + " " +
         std::string(dtype_name(l.precision)) + (l.tied ? " tied" : "") + " tp" +
         std::to_string(l.tp) + (l.sequence_parallel ? " sp" : "");
}

struct Record {
  std::vector<float> losses;
  std::vector<double> norms;
  int overflows = 0;
  float val0 = 0, val_end = 0;
  std::vector<std::vector<float>> params;
};

std::vector<uint64_t> bits(const std::vector<double>& v) {
  std::vector<uint64_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(double));
  return out;
}

std::vector<parallel::Batch> batches(int step, int first, int n, Device device) {
  std::vector<parallel::Batch> out;
  for (int k = first; k < first + n; ++k) {
    parallel::Batch b = testing::step_batch(step, k, kB, kT, kVocab);
    out.push_back({b.inputs.to(device), b.targets.to(device)});
  }
  return out;
}

std::vector<Record> train(Device device, const Layout& l,
                          const std::shared_ptr<test::FakeNcclGroup::Shared>& shared) {
  const int world = l.P * l.dp * l.tp;
  std::vector<Record> records(static_cast<size_t>(world));
  testing::run_shm_ranks(world, [&](int rank, const comm::ProcessGroupPtr& group) {
    parallel::EngineOptions o;
    o.adamw.lr = 3e-3f;
    o.weight_decay = 0.1f;
    o.seed = 5;
    o.zero_stage = l.zero_stage;
    o.precision = l.precision;
    if (l.precision == DType::f16) {
      // From 2^24, so that the first steps overflow and are skipped while the scale backs off.
      o.loss_scaler = optim::LossScalerOptions{};
      o.loss_scaler->init_scale = 16777216.0;
    }
    o.pipeline.stages = l.P;
    o.pipeline.kind = l.kind;
    o.pipeline.virtual_stages = l.V;
    o.pipeline.micro_batches = l.micro_batches;
    o.sequence_parallel = l.sequence_parallel;
    parallel::EngineSpec spec;
    spec.model =
        std::make_shared<models::GptSource>(testing::tiny_pipeline_gpt(kVocab, kT, l.tied));
    spec.mesh = parallel::DeviceMesh(group, {{"pp", l.P}, {"dp", l.dp}, {"tp", l.tp}});
    const int d = spec.mesh.coord("dp");
    spec.device = device;
    if (!device.is_cpu()) spec.grad_group = std::make_shared<test::FakeNcclGroup>(group, shared);
    spec.options = o;
    auto engine = parallel::make_engine(std::move(spec));
    Record& r = records[static_cast<size_t>(rank)];
    const std::vector<parallel::Batch> val = batches(99, 0, 2, device);
    r.val0 = engine->evaluate(val);
    for (int step = 1; step <= kSteps; ++step) {
      parallel::StepOptions so;
      so.step = step;
      so.lr = 3e-3f;
      so.grad_clip = 0.5;
      const parallel::StepOutcome out = engine->train_step(batches(step, d * 4, 4, device), so);
      r.losses.push_back(out.loss);
      r.norms.push_back(out.grad_norm);
      r.overflows += out.overflow ? 1 : 0;
      engine->check_in_sync(step);
    }
    r.val_end = engine->evaluate(val);
    for (const auto& [name, t] : engine->gather_parameters())
      r.params.push_back(t.to(Device::cpu()).to_vector());
  });
  return records;
}

TEST_F(PipelineOnDevice, TheStagesGiveTheCpusBits) {
  for (const Layout& l : {
           Layout{ScheduleKind::gpipe, 2, 1, 1, 0, 0, DType::f32, true},
           Layout{ScheduleKind::one_f_one_b, 2, 1, 2, 2, 0, DType::f32, true},
           Layout{ScheduleKind::interleaved, 2, 2, 1, 4, 0, DType::f32, false},
           Layout{ScheduleKind::one_f_one_b, 2, 1, 2, 0, 1, DType::f32, true},
           Layout{ScheduleKind::one_f_one_b, 2, 1, 2, 0, 2, DType::bf16, true},
           Layout{ScheduleKind::gpipe, 2, 1, 1, 0, 0, DType::f16, true},
           Layout{ScheduleKind::one_f_one_b, 2, 1, 1, 0, 0, DType::f32, true, 2, true},
           Layout{ScheduleKind::interleaved, 2, 2, 2, 4, 1, DType::f32, false, 2, false},
       }) {
    SCOPED_TRACE(describe(l));
    const std::vector<Record> cpu = train(Device::cpu(), l, nullptr);
    const auto shared = test::FakeNcclGroup::checking(alloc_);
    kernels_.calls.clear();
    const std::vector<Record> dev = train(kDev, l, shared);
    EXPECT_GT(kernels_.calls["gpt_embedding_forward"] + kernels_.calls["vocab_lookup_forward"], 0)
        << "the stages ran on the device";
    for (size_t r = 0; r < cpu.size(); ++r) {
      EXPECT_EQ(dev[r].losses, cpu[r].losses) << "rank " << r;
      EXPECT_EQ(bits(dev[r].norms), bits(cpu[r].norms)) << "rank " << r;  // NaN where overflowed
      EXPECT_EQ(dev[r].overflows, cpu[r].overflows) << "rank " << r;
      EXPECT_EQ(dev[r].val0, cpu[r].val0) << "rank " << r;
      EXPECT_EQ(dev[r].val_end, cpu[r].val_end) << "rank " << r;
      EXPECT_EQ(dev[r].params, cpu[r].params) << "rank " << r;
    }
    if (l.precision == DType::f16) {
      EXPECT_GT(dev[0].overflows, 0) << "the scale backed off";
      EXPECT_LT(dev[0].overflows, kSteps) << "and a step was taken";
    }
    // The replicas' gradients and the tp parts' activations went through the device groups.
    if (l.dp > 1 || l.tp > 1) {
      EXPECT_GT(shared->collectives.load(), 0);
    }
  }
}

// The stage runner alone (StageRunner::run, whose step result sums the stages' squares itself):
// with the stages on the device its loss and norm are the CPU's bits, tensor-parallel stages'
// shard sums going through the device's tp group.
TEST_F(PipelineOnDevice, TheStageRunnersResultIsTheCpusBits) {
  for (const int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    const auto run = [&](Device device) {
      std::vector<parallel::pipeline::PipelineStepResult> out(static_cast<size_t>(2 * tp));
      const auto shared = test::FakeNcclGroup::checking(alloc_);
      testing::run_shm_ranks(2 * tp, [&](int rank, const comm::ProcessGroupPtr& group) {
        const parallel::DeviceMesh mesh(group, {{"pp", 2}, {"dp", 1}, {"tp", tp}});
        std::optional<parallel::DeviceMesh> on_device;
        if (!device.is_cpu())
          on_device.emplace(std::make_shared<test::FakeNcclGroup>(group, shared), mesh.dims());
        parallel::tp::TpContext ctx;
        if (tp > 1) ctx.group = on_device ? on_device->group("tp") : mesh.group("tp");
        const models::GptSource source(testing::tiny_pipeline_gpt(kVocab, kT, true));
        const parallel::pipeline::PipelineShape shape{2, 4, 1, ScheduleKind::one_f_one_b};
        const std::vector<models::LayerRange> ranges = source.stack().partition(2, 1);
        const models::LayerRange& r = ranges[static_cast<size_t>(mesh.coord("pp"))];
        std::shared_ptr<models::StageModule> chunk = source.build_stage(r.begin, r.end, ctx);
        chunk->to(device);
        parallel::pipeline::StageRunner runner(shape, mesh.coord("pp"), {chunk}, mesh.group("pp"),
                                               kB, kT);
        if (tp > 1) runner.set_tp_group(ctx.group);
        runner.set_device(device);
        std::vector<parallel::Batch> mbs = batches(1, 0, 4, device);
        out[static_cast<size_t>(rank)] = runner.run(mbs, {});
      });
      return out;
    };
    const auto cpu = run(Device::cpu());
    const auto dev = run(kDev);
    for (size_t k = 0; k < cpu.size(); ++k) {
      EXPECT_EQ(dev[k].loss, cpu[k].loss) << "rank " << k;
      EXPECT_EQ(dev[k].grad_norm, cpu[k].grad_norm) << "rank " << k;
    }
  }
}

}  // namespace
}  // namespace meshtrain
