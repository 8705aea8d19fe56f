// A tiny GPT trained with ZeRO through the engine (parallel::make_engine) or its parts, on the CPU
// or a device, for the device tests: on the fake device against the CPU's bits, on a GPU against
// the CPU within rounding. Each rank trains on batches of its own.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/zero/zero_shards.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/tiny_gpt.h"
#include "tests/support/engines.h"

namespace meshtrain::test {

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // every parameter after the last step, whole
};

// An engine with ZeRO `stage` over `group` (the data-parallel ranks, a host group);
// `device_group`: the group device memory goes through (null on the CPU). `gc`: the model.
inline std::unique_ptr<parallel::TrainEngine> zero_engine(
    Device device, int stage, const comm::ProcessGroupPtr& group,
    comm::ProcessGroupPtr device_group, const nn::GPTConfig& gc = tiny_gpt_config()) {
  parallel::EngineOptions o;
  o.zero_stage = stage;
  o.adamw.lr = 3e-3f;
  o.weight_decay = 0.1f;
  o.reducer.first_bucket_bytes = 4 << 10;
  o.reducer.bucket_bytes = 16 << 10;
  parallel::EngineSpec spec;
  spec.model = std::make_shared<models::GptSource>(gc);
  spec.mesh = parallel::data_parallel_mesh(group);
  spec.device = device;
  spec.grad_group = std::move(device_group);
  spec.options = o;
  auto engine = parallel::make_engine(std::move(spec));
  EXPECT_EQ(engine->fsdp() != nullptr, stage == 3);
  return engine;
}

// Steps [from, to) of rank `rank`: its batch of step s is the same in every run.
inline std::vector<float> zero_steps(parallel::TrainEngine& engine, Device device, int rank,
                                     int from, int to) {
  std::vector<float> losses;
  for (int step = from; step < to; ++step) {
    Generator gen(1000 + static_cast<uint64_t>(step) * 7 + static_cast<uint64_t>(rank));
    auto [x, y] = random_tokens(gen, 2, device);
    parallel::StepOptions so;
    so.step = step + 1;
    so.lr = 3e-3f;
    so.grad_clip = 1.0;
    const parallel::StepOutcome r = engine.train_step({{x, y}}, so);
    EXPECT_FALSE(r.skipped) << "step " << step + 1;
    losses.push_back(r.loss);
  }
  return losses;
}

// Every parameter, whole (collective: ZeRO-3 gathers its shards).
inline std::vector<std::vector<float>> whole_parameters(parallel::TrainEngine& engine) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : engine.gather_parameters())
    out.push_back(p.to(Device::cpu()).to_vector());
  return out;
}

// Four steps through the engine.
inline Trained train_zero(Device device, int stage, const comm::ProcessGroupPtr& group,
                          comm::ProcessGroupPtr device_group,
                          const nn::GPTConfig& gc = tiny_gpt_config()) {
  auto engine = zero_engine(device, stage, group, std::move(device_group), gc);
  Trained out;
  out.losses = zero_steps(*engine, device, group->rank(), 0, 4);
  out.params = whole_parameters(*engine);
  return out;
}

// ZeRO-1/2 through its parts (Reducer, ZeroShards) rather than the engine, which makes no ZeRO
// of a one-rank group: what a single device can run. 4 steps as rank `group.rank()`, AdamW on
// this rank's segments, the parameters gathered after every step.
inline Trained train_zero_parts(Device device, int stage, const comm::ProcessGroupPtr& group) {
  const nn::GPTConfig gc = tiny_gpt_config();
  nn::GPT model(gc);
  model.to(device);
  auto params = model.named_parameters();
  parallel::ReducerOptions ro;
  ro.first_bucket_bytes = 4 << 10;
  ro.bucket_bytes = 16 << 10;
  parallel::Reducer reducer(params, group,
                            parallel::ZeroShards::reducer_options(ro, stage, group->size()));
  optim::AdamWOptions ao;
  ao.lr = 3e-3f;
  ao.weight_decay = 0.1f;
  parallel::ZeroShards zero(
      params, reducer, group, stage,
      [&ao](std::vector<optim::ParamGroup> g) {
        return std::make_unique<optim::AdamW>(std::move(g), ao);
      },
      ao.weight_decay);
  Generator gen(11 + static_cast<uint64_t>(group->rank()));
  Trained out;
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = random_tokens(gen, 2, device);
    for (auto& [name, p] : params)
      if (p.grad().defined()) p.grad().zero_();
    reducer.prepare_for_backward();
    Tensor loss = model.loss(x, y);
    autograd::backward(loss);
    reducer.finalize_backward();
    for (const auto& seg : zero.optimizer().segments()) {
      EXPECT_EQ(seg.value.device(), device);
      EXPECT_EQ(seg.grad.device(), device);
    }
    zero.optimizer().step();
    zero.after_update();
    out.losses.push_back(loss.item());
  }
  for (const auto& [name, p] : params) {
    EXPECT_EQ(p.device(), device) << name;
    out.params.push_back(p.to(Device::cpu()).to_vector());
  }
  return out;
}

}  // namespace meshtrain::test
