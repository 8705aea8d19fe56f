// Device memory of a GPT-2 124M training step under bf16 (B = 8, T = 1024: the configuration
// gpu_train_bench compares with PyTorch), counted on the fake device: every byte the step's
// tensors take, allocated and freed in the order the GPU path does, with the kernels left out
// (memory does not depend on the values), so the step takes seconds here. With the kernels
// computing, the count gave 9.09 GiB before the LM head's and the residual adds' savings, where
// the caching allocator reported 9.1 GiB on an H200 for the same step: the count stands for the
// GPU's peak, and memory work can be measured without one. The figures print as one JSON line
// per step.
#include <gtest/gtest.h>

#include <cstdio>

#include "fake_device.h"
#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/plan/memory_model.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/tiny_gpt.h"

namespace meshtrain {
namespace {

class DeviceMemory : public test::FakeDeviceTest {};

double gib(size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}

TEST_F(DeviceMemory, Gpt2StepUnderBf16) {
  kernels_.compute = false;
  alloc_.poison = false;
  const int64_t B = 8, T = 1024, V = 50257;
  nn::GPTConfig gc;
  gc.n_layer = 12;
  gc.n_embd = 768;
  gc.n_head = 12;
  gc.block_size = T;
  gc.vocab_size = V;
  nn::GPT model(gc);
  const Device dev = Device::cuda(0);
  model.to(dev);
  auto params = model.named_parameters();
  optim::AdamWOptions ao;
  optim::AdamW opt(optim::decay_groups(params, 0.1f), ao);
  Generator gen(7);
  size_t steady_peak = 0;
  // The second step is the steady one: the optimizer's state exists from the first.
  for (int step = 0; step < 2; ++step) {
    const auto [idx, tgt] = test::random_tokens(gen, B, dev, T, V);
    opt.zero_grad();
    alloc_.reset_peak();
    size_t after_forward = 0;
    {
      autograd::AutocastGuard autocast(DType::bf16);
      Tensor loss = model.loss(idx, tgt);
      after_forward = alloc_.live_bytes();
      autograd::backward(loss);
    }
    opt.step();
    const size_t peak = alloc_.peak_bytes();
    std::printf(
        "{\"bench\":\"gpt2_device_memory\",\"batch\":%ld,\"seq\":%ld,\"step\":%d,"
        "\"after_forward_gib\":%.3f,\"peak_gib\":%.3f}\n",
        static_cast<long>(B), static_cast<long>(T), step, gib(after_forward), gib(peak));
    // The head keeps bf16 logits and the cross-entropy writes their gradient over them:
    // backward adds the head's weight and input gradients, nothing of the logits' size.
    const size_t half_logits_bytes = static_cast<size_t>(B * T * V) * 2;
    EXPECT_LE(peak - after_forward, half_logits_bytes / 4) << step;
    if (step == 1) steady_peak = peak;
  }
  // 5.12 GiB measured (PyTorch 2.11 at its best: 6.66 GiB on the H200); a change that makes a
  // step keep more fails here before it reaches a GPU.
  EXPECT_LT(gib(steady_peak), 5.2);
  // The planner's model of mixed precision describes this step (it adds up every part, so it
  // may only be above the peak).
  plan::MemoryInput in;
  in.micro_batch = B;
  in.seq_len = T;
  in.precision = plan::Precision::kMixed;
  const double modelled = static_cast<double>(plan::estimate_memory(in).total());
  std::printf("{\"bench\":\"gpt2_device_memory_model\",\"model_gib\":%.3f,\"peak_gib\":%.3f}\n",
              modelled / (1024.0 * 1024.0 * 1024.0), gib(steady_peak));
  EXPECT_GT(modelled, static_cast<double>(steady_peak));
  EXPECT_LT(modelled, 1.12 * static_cast<double>(steady_peak));
}

}  // namespace
}  // namespace meshtrain
