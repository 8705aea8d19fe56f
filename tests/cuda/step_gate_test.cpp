// A step whose update is decided on the device (optim/step_gate.h): the rule against the host's,
// and the engine on the fake device (device memory is host memory, the kernels are the CPU's)
// against the CPU run, bit for bit, with clipping, f16 overflows and skipped steps, reading from
// the device once a step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/step_gate.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/cpu/step_gate.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/fake_device.h"
#include "tests/cuda/step_gate_expect.h"
#include "tests/cuda/tiny_gpt.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);
constexpr double kInf = std::numeric_limits<double>::infinity();

// The engine's host rule (parallel/engine.cpp, grad_norm.cpp): the mean loss, the norm of the
// split and whole sums added apart, the skip decision and clip_coefficient.
cpu::StepGate host_rule(const std::vector<float>& losses, const std::vector<double>& pre,
                        const std::vector<double>& sums, size_t n_split, double max_norm) {
  cpu::StepGate g;
  for (const float l : losses) g.loss += l / static_cast<float>(losses.size());
  bool overflow = false;
  for (const double s : pre) overflow = overflow || !std::isfinite(s);
  double split = 0.0, whole = 0.0;
  for (size_t i = 0; i < sums.size(); ++i) (i < n_split ? split : whole) += sums[i];
  g.norm = std::sqrt(split + whole);
  g.overflow = overflow;
  g.skip = !std::isfinite(g.loss) || overflow || !std::isfinite(g.norm);
  g.coef = max_norm > 0 ? optim::clip_coefficient(g.norm, max_norm) : 1.0f;
  return g;
}

TEST(StepGateRule, IsTheEnginesHostRule) {
  const std::vector<double> sums = {0.3, 1e-9, 2.5, 7.0, 0.125};
  struct Case {
    std::vector<float> losses;
    std::vector<double> pre, sums;
    size_t split;
    double max_norm;
  };
  const float nan = std::nanf("");
  const std::vector<Case> cases = {
      {{2.5f}, {}, sums, 0, 0.0},                     // no clipping
      {{2.5f, 2.25f, 3.0f}, {}, sums, 2, 1.0},        // clipped, split sums apart
      {{2.5f}, {}, sums, 5, 100.0},                   // under the limit: 1
      {{nan}, {}, sums, 0, 1.0},                      // a NaN loss skips
      {{2.5f}, {1.0, kInf, 2.0}, sums, 0, 1.0},       // an overflow before unscaling skips
      {{2.5f}, {1.0, 2.0}, {1.0, kInf}, 1, 1.0},      // a non-finite norm skips, coef 1
      {{1.0f, 2.0f}, {1.0}, {}, 0, 1.0},              // no gradients at all
      {{0.1f, 0.7f, 0.3f, 0.9f}, {}, sums, 3, 2e-3},  // a mean that rounds
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(c);
    const Case& k = cases[c];
    cpu::StepGate got;
    cpu::step_gate(&got, k.losses.data(), static_cast<int64_t>(k.losses.size()), k.pre.data(),
                   static_cast<int64_t>(k.pre.size()), k.sums.data(), static_cast<int64_t>(k.split),
                   static_cast<int64_t>(k.sums.size()), k.max_norm, optim::kClipEpsilon);
    test::expect_same_gate(got, host_rule(k.losses, k.pre, k.sums, k.split, k.max_norm));
  }
  cpu::StepGate clipped;
  const float losses[] = {1.0f};
  cpu::step_gate(&clipped, losses, 1, nullptr, 0, sums.data(), 0, 5, 1.0, optim::kClipEpsilon);
  EXPECT_LT(clipped.coef, 1.0f) << "the cases above clip";
}

TEST(StepGateRule, RefusesABadLimit) {
  optim::DeviceSquares none;
  // The limit is checked before anything is queued, as clip_coefficient checks it.
  EXPECT_THROW(optim::check_max_norm(std::nan("")), ValueError);
  EXPECT_THROW(optim::check_max_norm(kInf), ValueError);
  EXPECT_THROW(optim::gate_step(Tensor::zeros({1}), none, none, kInf), ValueError);
}

class StepGate : public test::FakeDeviceTest {};

struct GateRun {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<bool> skipped;
  std::vector<float> scales;
  std::vector<std::vector<float>> params;
  nlohmann::json optimizer;
};

struct GateSetup {
  DType precision = DType::f32;
  bool f16_overflows = false;  // a scale that overflows f16 for the first steps
  int micro_batches = 1;
  double grad_clip = 0.05;  // small enough to clip
  bool layer_norms = false;
};

std::unique_ptr<parallel::TrainEngine> engine_on(Device device, const GateSetup& s) {
  parallel::EngineOptions o;
  o.adamw.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.precision = s.precision;
  if (s.f16_overflows) {
    optim::LossScalerOptions ls;
    ls.init_scale = std::ldexp(1.0, 40);
    ls.backoff_factor = std::ldexp(1.0, -16);
    o.loss_scaler = ls;
  }
  parallel::EngineSpec spec;
  spec.model = std::make_shared<models::GptSource>(test::tiny_gpt_config());
  spec.mesh = parallel::data_parallel_mesh(nullptr);
  spec.device = device;
  spec.options = o;
  return parallel::make_engine(std::move(spec));
}

parallel::StepOutcome step(parallel::TrainEngine& engine, Device device, const GateSetup& s,
                           int k) {
  std::vector<parallel::Batch> batches;
  Generator gen(300 + static_cast<uint64_t>(k));
  for (int i = 0; i < s.micro_batches; ++i) {
    auto [x, y] = test::random_tokens(gen, 2, device);
    batches.push_back({x, y});
  }
  parallel::StepOptions so;
  so.step = k;
  so.lr = 3e-3f;
  so.grad_clip = s.grad_clip;
  so.layer_norms = s.layer_norms;
  return engine.train_step(batches, so);
}

GateRun train(Device device, const GateSetup& s, int steps) {
  auto engine = engine_on(device, s);
  GateRun r;
  for (int k = 1; k <= steps; ++k) {
    const parallel::StepOutcome out = step(*engine, device, s, k);
    r.losses.push_back(out.loss);
    r.norms.push_back(out.grad_norm);
    r.skipped.push_back(out.skipped);
    r.scales.push_back(out.loss_scale);
  }
  for (const auto& [name, p] : engine->gather_parameters())
    r.params.push_back(p.to(Device::cpu()).to_vector());
  ckpt::RankShards shards;
  r.optimizer = engine->checkpoint_state(shards, 0);
  return r;
}

// NaN norms (skipped steps) compare by their bits.
std::vector<uint64_t> bits(const std::vector<double>& v) {
  std::vector<uint64_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(double));
  return out;
}

void expect_cpu_bits(const GateSetup& s, int steps, test::FakeDeviceKernels& kernels) {
  const GateRun cpu = train(Device::cpu(), s, steps);
  kernels.calls.clear();
  const GateRun dev = train(kDev, s, steps);
  EXPECT_EQ(kernels.calls["step_gate"], steps) << "every step was decided on the device";
  EXPECT_EQ(kernels.calls["sum_squares_each"], 0) << "no norm was read on the host";
  EXPECT_EQ(dev.losses, cpu.losses);
  EXPECT_EQ(bits(dev.norms), bits(cpu.norms));
  EXPECT_EQ(dev.skipped, cpu.skipped);
  EXPECT_EQ(dev.scales, cpu.scales);
  EXPECT_EQ(dev.params, cpu.params);
  EXPECT_EQ(dev.optimizer, cpu.optimizer) << "the step counts of skipped steps were taken back";
}

TEST_F(StepGate, ClippedStepsAreTheCpuRunsBits) {
  for (const int micro_batches : {1, 3}) {
    SCOPED_TRACE(micro_batches);
    GateSetup s;
    s.micro_batches = micro_batches;
    const GateRun cpu = train(Device::cpu(), s, 1);
    ASSERT_GT(cpu.norms[0], s.grad_clip) << "the test clips";
    expect_cpu_bits(s, 4, kernels_);
  }
}

// f16 with a scale that overflows: the first steps are skipped on the device as on the host, the
// scale backs off alike, and the optimizer's counts skip them too.
TEST_F(StepGate, SkippedF16StepsAreTheCpuRunsBits) {
  GateSetup s;
  s.precision = DType::f16;
  s.f16_overflows = true;
  const GateRun cpu = train(Device::cpu(), s, 4);
  ASSERT_TRUE(cpu.skipped[0]) << "the test overflows";
  ASSERT_FALSE(cpu.skipped.back()) << "and recovers";
  expect_cpu_bits(s, 4, kernels_);
  EXPECT_EQ(kernels_.calls["adamw_step_many"], 4)
      << "the skipped steps' updates were queued and left undone by the gate";
}

// The host reads one thing from the device a step, whatever its micro-batches or its scaler:
// the gate's record, after the update is queued.
TEST_F(StepGate, AStepReadsFromTheDeviceOnce) {
  for (const bool f16 : {false, true}) {
    SCOPED_TRACE(f16);
    GateSetup s;
    if (f16) {
      s.precision = DType::f16;
      s.f16_overflows = true;
    }
    auto engine = engine_on(kDev, s);
    for (int k = 1; k <= 3; ++k) {
      s.micro_batches = k;
      const int before = alloc_.downloads;
      step(*engine, kDev, s, k);
      EXPECT_EQ(alloc_.downloads - before, 1) << "step " << k;
    }
  }
}

// What the host must know before the update keeps the decision there: per-layer norms here.
TEST_F(StepGate, TheHostDecidesWhereItMustKnowFirst) {
  GateSetup s;
  s.layer_norms = true;
  auto engine = engine_on(kDev, s);
  const parallel::StepOutcome out = step(*engine, kDev, s, 1);
  EXPECT_FALSE(out.layer_grad_norms.empty());
  EXPECT_EQ(kernels_.calls["step_gate"], 0);
  // The norm's sums come back to the host (a wait on a GPU; the fake device's memory is the
  // host's, so it copies nothing).
  EXPECT_GT(kernels_.calls["sum_squares_each"], 0);
}

}  // namespace
}  // namespace meshtrain
