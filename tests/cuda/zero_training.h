// A tiny GPT trained with ZeRO-1/2 through the engine's parts (Reducer, ZeroShards), on the CPU
// or a device, for the device tests: on the fake device against the CPU's bits, on a GPU against
// the CPU within rounding.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/parallel/zero/zero_shards.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::test {

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

// A tiny GPT trained for 4 steps with ZeRO `stage` as rank `group.rank()`: each rank its own
// batches, AdamW on this rank's segments, the parameters gathered after every step.
inline Trained train_zero(Device device, int stage, const comm::ProcessGroupPtr& group) {
  nn::GPTConfig gc;
  gc.n_layer = 2;
  gc.n_embd = 32;
  gc.n_head = 4;
  gc.block_size = 16;
  gc.vocab_size = 37;
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
    std::vector<int32_t> x, y;
    for (int i = 0; i < 2 * 16; ++i) {
      x.push_back(static_cast<int32_t>(gen.below(37)));
      y.push_back(static_cast<int32_t>(gen.below(37)));
    }
    for (auto& [name, p] : params)
      if (p.grad().defined()) p.grad().zero_();
    reducer.prepare_for_backward();
    Tensor loss = model.loss(Tensor::from_vector(x, {2, 16}).to(device),
                             Tensor::from_vector(y, {2, 16}).to(device));
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
