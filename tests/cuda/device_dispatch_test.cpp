// The dispatch of ops, autograd, modules, optimizers and the reducer to a device, exercised on
// every machine through the fake device of fake_device.h (host memory, CPU kernels behind the
// device kernel table): a GPT trained on the fake device must give the CPU's losses bit for bit,
// every op it uses must go through the table, and what has no device version must say so by name.
// What the fake cannot show (the CUDA kernels themselves, streams, NCCL) is in ops_test.cpp and
// train_cuda_test.cpp, which need a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fake_device.h"
#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/linear_cross_entropy.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/device_support.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/runtime/train_device.h"
#include "meshtrain/runtime/trainer.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/util/error.h"
#include "tests/cuda/fake_nccl_group.h"
#include "tests/cuda/tiny_gpt.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);

class DeviceDispatch : public test::FakeDeviceTest {};

// Runs `f` and returns the message of the meshtrain::Error it must throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

Tensor host(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n});
}

TEST_F(DeviceDispatch, ElementwiseOpsRunOnTheDeviceAndMatchTheCpu) {
  Tensor a = host({1.5f, -2.0f, 3.25f, 0.5f}), b = host({0.25f, 4.0f, -1.0f, 2.0f});
  Tensor da = a.to(kDev), db = b.to(kDev);
  Tensor sum = ops::add(da, db), prod = ops::mul(da, db), diff = ops::sub(da, db);
  EXPECT_EQ(sum.device(), kDev);
  EXPECT_EQ(sum.to_vector(), ops::add(a, b).to_vector());
  EXPECT_EQ(prod.to_vector(), ops::mul(a, b).to_vector());
  EXPECT_EQ(diff.to_vector(), ops::sub(a, b).to_vector());
  EXPECT_EQ(ops::affine(da, 3.0f, 0.0f).to_vector(), ops::affine(a, 3.0f, 0.0f).to_vector());
  ops::axpy_(da, 0.5f, db);
  ops::axpy_(a, 0.5f, b);
  EXPECT_EQ(da.to_vector(), a.to_vector());
  ops::scale_(da, -2.0f);
  ops::scale_(a, -2.0f);
  EXPECT_EQ(da.to_vector(), a.to_vector());
  EXPECT_EQ(ops::sum_squares(da), ops::sum_squares(a));
  EXPECT_EQ(kernels_.calls["add"], 2);  // add, and sub's second half
  EXPECT_EQ(kernels_.calls["mul"], 1);
  EXPECT_EQ(kernels_.calls["axpy"], 1);
  EXPECT_EQ(kernels_.calls["sum_squares"], 1);
  EXPECT_TRUE(ops::equal(da, a.to(kDev)));
}

// The global gradient norm asks the device once for all parameters (one wait, not one per
// parameter) and gives the CPU's bits; CPU tensors in the same list are summed on the host.
TEST_F(DeviceDispatch, GradientNormWaitsOnceForAllParameters) {
  optim::NamedParams cpu_params, dev_params;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> g(static_cast<size_t>(1000 * i + 3));
    for (size_t k = 0; k < g.size(); ++k)
      g[k] = 0.001f * static_cast<float>((k * 37 + i) % 101) - 0.05f;
    Tensor pc = host(std::vector<float>(g.size(), 1.0f));
    pc.set_grad(host(g));
    Tensor pd = pc.to(kDev);
    pd.set_grad(host(g).to(kDev));
    cpu_params.emplace_back("p" + std::to_string(i), pc);
    dev_params.emplace_back("p" + std::to_string(i), pd);
  }
  kernels_.calls.clear();
  EXPECT_EQ(optim::grad_norm_squared(dev_params), optim::grad_norm_squared(cpu_params));
  EXPECT_EQ(kernels_.calls["sum_squares_each"], 1);
  EXPECT_EQ(kernels_.calls["sum_squares"], 0);

  const std::vector<Tensor> mixed = {dev_params[0].second.grad(), cpu_params[1].second.grad(),
                                     dev_params[2].second.grad()};
  const std::vector<double> each = ops::sum_squares_each(mixed);
  ASSERT_EQ(each.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(each[i], ops::sum_squares(mixed[i].to(Device::cpu())));
  EXPECT_EQ(kernels_.calls["sum_squares_each"], 2);
}

// A row added over the leading dimensions (a bias, a position table; either operand first) and a
// dimension's sum (their gradients, through autograd) are the CPU's bits on the device.
TEST_F(DeviceDispatch, AddingARowAndSummingADimensionGiveTheCpusBits) {
  Generator gen(71);
  const Tensor a = randn({3, 4, 5}, gen), row = randn({4, 5}, gen), bias = randn({1, 5}, gen);
  const Tensor da = a.to(kDev), drow = row.to(kDev), dbias = bias.to(kDev);
  EXPECT_EQ(ops::add(da, drow).to(Device::cpu()).to_vector(), ops::add(a, row).to_vector());
  EXPECT_EQ(ops::add(dbias, da).to(Device::cpu()).to_vector(), ops::add(bias, a).to_vector());
  // A row of higher rank than the other operand: the sum takes its leading ones.
  const Tensor wide = ops::add(drow, Tensor::ones({1, 1, 4, 5}, DType::f32, kDev));
  EXPECT_EQ(wide.shape(), (Shape{1, 1, 4, 5}));
  EXPECT_EQ(kernels_.calls["add_rows"], 3);
  for (int64_t dim = 0; dim < 3; ++dim)
    for (const bool keep : {false, true}) {
      const Tensor got = ops::sum(da, dim, keep);
      EXPECT_EQ(got.device(), kDev);
      EXPECT_EQ(got.shape(), ops::sum(a, dim, keep).shape());
      EXPECT_EQ(got.to(Device::cpu()).to_vector(), ops::sum(a, dim, keep).to_vector());
    }
  // Through autograd: the row's gradient is the incoming gradient summed over the batch.
  const auto grads = [](Device d, const Tensor& x0, const Tensor& r0, const Tensor& g0) {
    // Fresh leaves each call (to() of a tensor already there is the tensor itself).
    Tensor x = x0.to(d).clone(), r = r0.to(d).clone();
    x.set_requires_grad(true);
    r.set_requires_grad(true);
    autograd::backward(autograd::add(x, r), g0.to(d).clone());
    return std::vector<std::vector<float>>{x.grad().to(Device::cpu()).to_vector(),
                                           r.grad().to(Device::cpu()).to_vector()};
  };
  const Tensor g = randn({3, 4, 5}, gen);
  EXPECT_EQ(grads(kDev, a, row, g), grads(Device::cpu(), a, row, g));
  EXPECT_EQ(grads(kDev, a, bias, g), grads(Device::cpu(), a, bias, g));
}

TEST_F(DeviceDispatch, WhatHasNoDeviceVersionSaysWhichOpAndWhere) {
  Tensor d = Tensor::ones({2, 3}, DType::f32, kDev);
  Tensor c = Tensor::ones({2, 3});
  auto names = [](const std::string& msg, const std::string& op) {
    return msg.find(op) != std::string::npos && msg.find("cuda:0") != std::string::npos;
  };
  EXPECT_PRED2(names, error_of([&] { (void)ops::permute(d, {1, 0}); }), "permute");
  EXPECT_PRED2(names, error_of([&] { (void)ops::div(d, d); }), "div");
  EXPECT_PRED2(names, error_of([&] { (void)ops::max(d, 0); }), "max");
  EXPECT_PRED2(names, error_of([&] { (void)ops::affine(d, 1.0f, 1.0f); }), "affine");
  EXPECT_PRED2(names, error_of([&] { (void)ops::unary(ops::UnaryOp::exp, d); }), "unary");
  EXPECT_PRED2(names, error_of([&] { (void)autograd::softmax(d); }), "softmax");
  EXPECT_PRED2(names, error_of([&] { (void)ops::add(d, c); }), "binary op");
  EXPECT_PRED2(names, error_of([&] { (void)ops::mul(d, Tensor::ones({3}, DType::f32, kDev)); }),
               "equal shapes");
  EXPECT_PRED2(names, error_of([&] {
                 (void)ops::add(d, Tensor::ones({2, 1}, DType::f32, kDev));
               }),
               "equal shapes");

  // Operands of a layer on two devices: the error names the layer and both devices.
  Tensor w = Tensor::ones({4, 3}, DType::f32, kDev);
  const std::string mixed = error_of([&] { (void)autograd::linear(c, w, Tensor()); });
  EXPECT_NE(mixed.find("linear"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("cpu"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("cuda:0"), std::string::npos) << mixed;
}

// Dropout on the device draws the CPU's mask (one hash of the element's index, shared by both
// kernels), forward and backward, at any offset; doing nothing needs no kernel.
TEST_F(DeviceDispatch, DropoutDropsWhatTheCpuDrops) {
  Generator gen(11);
  Tensor x = Tensor::empty({5, 37});
  normal_(x, gen);
  Tensor g = Tensor::empty({5, 37});
  normal_(g, gen);
  g.data<float>()[3] = -0.0f;  // a -0 gradient kept stays -0 on both
  for (const uint64_t offset : {uint64_t{0}, uint64_t{1} << 40}) {
    SCOPED_TRACE(offset);
    Tensor xc = x.detach(), xd = x.to(kDev);
    xc.set_requires_grad(true);
    xd.set_requires_grad(true);
    Tensor yc = autograd::dropout(xc, 0.3f, 99, offset, true);
    Tensor yd = autograd::dropout(xd, 0.3f, 99, offset, true);
    ASSERT_EQ(yd.device(), kDev);
    EXPECT_TRUE(ops::equal(yd.to(Device::cpu()), yc));
    autograd::backward(yc, g);
    autograd::backward(yd, g.to(kDev));
    ASSERT_EQ(xd.grad().device(), kDev);
    EXPECT_TRUE(ops::equal(xd.grad().to(Device::cpu()), xc.grad()));
    EXPECT_EQ(std::signbit(xc.grad().data<float>()[3]), cpu::dropout_keep(99, offset + 3, 0.3f));
  }
  EXPECT_EQ(kernels_.calls["dropout"], 4);
  Tensor d = x.to(kDev);
  EXPECT_TRUE(autograd::dropout(d, 0.0f, 1, 0, true).is_same(d));
  EXPECT_TRUE(autograd::dropout(d, 0.5f, 1, 0, false).is_same(d));
  EXPECT_EQ(kernels_.calls["dropout"], 4);
}

TEST_F(DeviceDispatch, MatmulAndItsGradientsRunOnTheDevice) {
  Generator gen(3);
  Tensor a = Tensor::empty({2, 3, 5}), b = Tensor::empty({2, 5, 4}), w = Tensor::empty({4, 5});
  normal_(a, gen, 0.0, 1.0);
  normal_(b, gen, 0.0, 1.0);
  normal_(w, gen, 0.0, 1.0);
  // Batched, batched with a transposed right operand, and a shared right operand.
  auto run = [](Tensor x, Tensor y, Tensor z) {
    x.set_requires_grad(true);
    y.set_requires_grad(true);
    z.set_requires_grad(true);
    Tensor p = autograd::matmul(x, y);
    Tensor q = autograd::matmul(x, z, false, true);
    Tensor r = autograd::add(autograd::reshape(p, {-1}), autograd::reshape(q, {-1}));
    autograd::backward(r, Tensor::ones(r.shape(), DType::f32, r.device()));
    return std::vector<Tensor>{r, x.grad(), y.grad(), z.grad()};
  };
  const auto want = run(a.clone(), b.clone(), w.clone());
  const auto got = run(a.to(kDev), b.to(kDev), w.to(kDev));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].device(), kDev) << i;
    EXPECT_TRUE(ops::allclose(got[i], want[i], 1e-6, 1e-6)) << i;
  }
  EXPECT_GE(kernels_.calls["matmul"], 6) << "two forward and four backward products";
}

TEST_F(DeviceDispatch, ModuleToMovesParametersInPlace) {
  nn::GPTConfig gc;
  gc.n_layer = 1;
  gc.n_embd = 16;
  gc.n_head = 2;
  gc.block_size = 8;
  gc.vocab_size = 11;
  nn::GPT model(gc);
  const auto before = model.named_parameters();
  std::vector<std::vector<float>> values;
  for (const auto& [name, p] : before) values.push_back(p.to_vector());
  Tensor first = before.front().second;
  first.set_grad(Tensor::ones(first.shape()));
  model.to(kDev);
  EXPECT_EQ(model.device(), kDev);
  const auto after = model.named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].second.is_same(before[i].second)) << after[i].first;
    EXPECT_EQ(after[i].second.device(), kDev) << after[i].first;
    EXPECT_TRUE(after[i].second.requires_grad()) << after[i].first;
    EXPECT_EQ(after[i].second.to_vector(), values[i]) << after[i].first;
  }
  EXPECT_EQ(first.device(), kDev) << "handles taken before the move follow it";
  EXPECT_EQ(first.grad().device(), kDev);
  model.to(Device::cpu());
  EXPECT_TRUE(model.device().is_cpu());
  EXPECT_EQ(before.front().second.to_vector(), values.front());
}

// Trains the same tiny GPT on the CPU and on the fake device; returns the losses.
// Under autocast when `precision` is bf16 or f16; n_head 1 gives heads of 32, which flash
// attention takes.
std::vector<float> train_tiny(Device device, int steps, std::map<std::string, int>* calls,
                              const test::FakeDeviceKernels* kernels, DType precision = DType::f32,
                              int64_t n_head = 4, float dropout = 0.0f,
                              const std::function<void(nn::GPTConfig&)>& shape = {}) {
  nn::GPTConfig gc;
  gc.dropout = dropout;
  gc.n_layer = 2;
  gc.n_embd = 32;
  gc.n_head = n_head;
  gc.block_size = 16;
  gc.vocab_size = 37;
  if (shape) shape(gc);
  nn::GPT model(gc);
  model.to(device);
  optim::AdamWOptions ao;
  ao.lr = 3e-3f;
  ao.weight_decay = 0.1f;
  auto params = model.named_parameters();
  optim::AdamW opt(optim::decay_groups(params, ao.weight_decay), ao);
  Generator gen(7);
  const int64_t B = 3, T = 16;
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> x, y;
    for (int64_t i = 0; i < B * T; ++i) {
      x.push_back(static_cast<int32_t>(gen.below(37)));
      y.push_back(static_cast<int32_t>(gen.below(37)));
    }
    y[5] = -1;  // one ignored target
    Tensor idx = Tensor::from_vector(x, {B, T}).to(device);
    Tensor tgt = Tensor::from_vector(y, {B, T}).to(device);
    opt.zero_grad();
    Tensor loss;
    {
      autograd::AutocastGuard autocast(precision);
      loss = model.loss(idx, tgt, 1000 + static_cast<uint64_t>(s));
      EXPECT_EQ(loss.device(), device);
      autograd::backward(loss, Tensor::scalar(0.5f));
    }
    for (const auto& [name, p] : params) EXPECT_EQ(p.grad().device(), device) << name;
    optim::clip_grad_norm(params, 0.05);
    opt.step();
    // Mixture-of-experts blocks move their balancing biases by the step's expert loads, as the
    // engine does after each step.
    if (const auto& moe = model.moe_context()) moe->adapt(moe->take_counters());
    losses.push_back(loss.item());
  }
  if (calls != nullptr && kernels != nullptr) *calls = kernels->calls;
  return losses;
}

TEST_F(DeviceDispatch, GptTrainsOnTheDeviceWithTheCpuBits) {
  const std::vector<float> cpu = train_tiny(Device::cpu(), 4, nullptr, nullptr);
  EXPECT_TRUE(kernels_.calls.empty()) << "the CPU path never touches the device table";
  std::map<std::string, int> calls;
  const std::vector<float> dev = train_tiny(kDev, 4, &calls, &kernels_);
  EXPECT_EQ(dev, cpu);
  for (const char* op :
       {"gpt_embedding_forward", "gpt_embedding_backward", "layer_norm_forward",
        "layer_norm_backward", "linear_forward", "linear_backward", "attention_forward",
        "attention_backward", "gelu_forward", "gelu_backward", "cross_entropy_forward",
        "cross_entropy_backward", "sum_squares_each", "scale_many", "adamw_step_many"})
    EXPECT_GT(calls[op], 0) << op << " never ran on the device";
  // The residual additions happen in the output projections' products, the tied token table's
  // in the embedding's backward.
  EXPECT_EQ(calls["add"], 0);
  EXPECT_EQ(calls["axpy"], 0);
  // Clipping scales every gradient in one call a step, not one a parameter.
  EXPECT_EQ(calls["scale"], 0);
  EXPECT_EQ(calls["scale_many"], 4);
}

// With dropout the blocks add their branches after masking them (no product adds the residual
// where it writes), and the masks are the CPU's: the same losses bit for bit, in f32 and bf16.
TEST_F(DeviceDispatch, GptWithDropoutTrainsOnTheDeviceWithTheCpuBits) {
  for (const DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    const std::vector<float> cpu =
        train_tiny(Device::cpu(), 3, nullptr, nullptr, precision, 1, 0.2f);
    const std::vector<float> plain = train_tiny(Device::cpu(), 3, nullptr, nullptr, precision, 1);
    EXPECT_NE(cpu, plain) << "dropout changed nothing";
    std::map<std::string, int> calls;
    kernels_.calls.clear();
    const std::vector<float> dev = train_tiny(kDev, 3, &calls, &kernels_, precision, 1, 0.2f);
    EXPECT_EQ(dev, cpu);
    // The embedding's and each block's two branches, forward and backward, three steps.
    EXPECT_EQ(calls["dropout"], 3 * 2 * (1 + 2 * 2));
  }
}

// Mixture-of-experts blocks on the device: the router's product, the dispatch of token rows, the
// experts and the gated combine run there; the [tokens, experts] router decides on the host. Top-2
// with jitter noise, capacity drops and balancing biases (a device buffer moved by the host
// after each step): the CPU's losses bit for bit, in f32 and bf16. The device runs each expert's
// MLP on its own; so does the CPU here (its grouped experts take other product kernels).
TEST_F(DeviceDispatch, GptWithMixtureOfExpertsTrainsOnTheDeviceWithTheCpuBits) {
  const auto moe = [](nn::GPTConfig& gc) {
    gc.moe.grouped_experts = false;
    gc.moe.every = 2;
    gc.moe.num_experts = 4;
    gc.moe.top_k = 2;
    gc.moe.router_noise = nn::RouterNoise::jitter;
    gc.moe.bias_update_rate = 0.01;
  };
  for (const DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    const std::vector<float> cpu =
        train_tiny(Device::cpu(), 4, nullptr, nullptr, precision, 1, 0.0f, moe);
    std::map<std::string, int> calls;
    kernels_.calls.clear();
    const std::vector<float> dev = train_tiny(kDev, 4, &calls, &kernels_, precision, 1, 0.0f, moe);
    EXPECT_EQ(dev, cpu);
    for (const char* op : {"gather_rows", "scatter_add_rows", "weighted_rows_backward"})
      EXPECT_EQ(calls[op] > 0, true) << op << " never ran on the device";
  }
}

TEST_F(DeviceDispatch, HalfAutocastRunsHalfGemmsAndFlashAttentionWithTheCpuBits) {
  for (const DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    const std::vector<float> cpu = train_tiny(Device::cpu(), 4, nullptr, nullptr, half, 1);
    std::map<std::string, int> calls;
    kernels_.calls.clear();
    const std::vector<float> dev = train_tiny(kDev, 4, &calls, &kernels_, half, 1);
    // The same roundings and the same products as the CPU's emulation of autocast.
    EXPECT_EQ(dev, cpu);
    for (const char* op :
         {"matmul_half", "weight_grad_half", "cast", "flash_attention_forward",
          "flash_attention_backward", "linear_gelu_half", "linear_input_grad_dgelu_half"})
      EXPECT_GT(calls[op], 0) << op << " never ran on the device";
    // GELU and its gradient are made where the MLP's products write.
    EXPECT_EQ(calls["gelu_forward"] + calls["gelu_backward"], 0);
    // Each bias gradient comes with its weight's, from the same reads of the gradient.
    EXPECT_EQ(calls["bias_grad"], 0);
    EXPECT_EQ(calls["linear_backward"], 0) << "bias gradients from the half gradient";
    EXPECT_EQ(calls["linear_forward"], 0) << "under autocast every linear is a half GEMM";
    EXPECT_EQ(calls["attention_forward"], 0) << "heads of 32 take flash attention";
    EXPECT_EQ(calls["gelu_forward_half"], 0);
  }
}

// Under bf16 autocast every activation between two products that round it anyway is handed over
// in bf16 by its producer (the layer norms, q, k, v, GELU's input and output, the attention's
// output, the final norm's output for the LM head), and so is its gradient; the residual
// stream's f32 gradient comes to each output projection with its bf16 copy: the forward casts
// only the weights, the backward nothing.
TEST_F(DeviceDispatch, Bf16CastsOnlyTheWeights) {
  nn::GPTConfig gc = test::tiny_gpt_config(3);
  gc.n_head = 1;  // heads of 32: flash attention
  nn::GPT model(gc);
  model.to(kDev);
  Generator gen(4);
  const auto [x, y] = test::random_tokens(gen, 2, kDev);
  kernels_.calls.clear();
  autograd::AutocastGuard autocast(DType::bf16);
  const Tensor loss = model.loss(x, y);
  EXPECT_EQ(kernels_.calls["flash_attention_forward"], gc.n_layer);
  EXPECT_EQ(kernels_.calls["cast"], 4 * gc.n_layer + 1);
  kernels_.calls.clear();
  const int zeros = alloc_.zeros;
  autograd::backward(loss);
  EXPECT_EQ(kernels_.calls["flash_attention_backward"], gc.n_layer);
  // The residual stream's gradient reaches each output projection rounded already by the layer
  // norm that summed into it last (offer_half_gradient).
  EXPECT_EQ(kernels_.calls["cast"], 0);
  // The only zero-fill is the position table's gradient: the layer norms write their parameters'
  // gradients, and the embedding adds the token table's into the LM head's (the tied table).
  EXPECT_EQ(alloc_.zeros - zeros, 1);
}

// A layer norm's half copy of the gradient it summed into goes to the product that receives the
// sum, unless another gradient is added to it first: then the product casts the new sum. Either
// way the CPU's bits (a stale copy would not be).
TEST_F(DeviceDispatch, AHalfGradientCopyIsDroppedWhenTheSumChanges) {
  Generator gen(12);
  const Tensor x = randn({6, 8}, gen), w = randn({8, 8}, gen), b = randn({8}, gen),
               lw = randn({8}, gen), lb = randn({8}, gen), r = randn({6, 8}, gen);
  for (const bool late_summand : {false, true}) {
    SCOPED_TRACE(late_summand ? "a summand after the norm's" : "the norm's sum last");
    auto run = [&](Device dev) {
      Tensor xd = x.clone().to(dev), wd = w.clone().to(dev);
      wd.set_requires_grad(true);
      autograd::AutocastGuard autocast(DType::bf16);
      // Created in this order, run backward in the reverse: d's gradient first, then the norm
      // adds its own into the same sum, then (late_summand) c's.
      const Tensor h = autograd::linear(xd, wd, b.to(dev));
      const Tensor c = autograd::affine(h, 0.5f, 0.0f);
      const Tensor n = autograd::layer_norm(h, lw.to(dev), lb.to(dev));
      const Tensor d = autograd::affine(h, 0.25f, 0.0f);
      std::vector<Tensor> roots{n, d}, grads{r.to(dev), r.to(dev)};
      if (late_summand) {
        roots.push_back(c);
        grads.push_back(r.to(dev));
      }
      kernels_.calls.clear();
      autograd::backward(roots, grads);
      return wd.grad().to_vector();
    };
    const auto cpu = run(Device::cpu());
    EXPECT_EQ(run(kDev), cpu);
    EXPECT_EQ(kernels_.calls["layer_norm_backward"], 1);
    EXPECT_EQ(kernels_.calls["cast"], late_summand ? 1 : 0);
  }
}

// Each block's two output projections add their product to the residual stream where they write
// it (the product's C on a GPU): no addition of its own, in f32 and under autocast; the gradient
// of the stream passes through, and the layer norms add theirs to it.
TEST_F(DeviceDispatch, OutputProjectionsAddTheResidualStreamWhereTheyWrite) {
  for (const DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    nn::GPTConfig gc = test::tiny_gpt_config(3);
    gc.n_head = 1;
    nn::GPT model(gc);
    model.to(kDev);
    Generator gen(4);
    const auto [x, y] = test::random_tokens(gen, 2, kDev);
    std::optional<autograd::AutocastGuard> autocast;
    if (precision != DType::f32) autocast.emplace(precision);
    kernels_.calls.clear();
    const Tensor loss = model.loss(x, y);
    EXPECT_EQ(kernels_.calls["add"], 0);
    // Four products a block and the LM head's (under autocast the MLP's first with GELU).
    EXPECT_EQ(precision == DType::f32
                  ? kernels_.calls["linear_forward"]
                  : kernels_.calls["matmul_half"] + kernels_.calls["linear_gelu_half"],
              4 * gc.n_layer + 1);
    kernels_.calls.clear();
    autograd::backward(loss);
    // The layer norms add their input's gradient to the residual stream's where they write it,
    // and the embedding the tied token table's to the LM head's: no sum of the engine's left.
    EXPECT_EQ(kernels_.calls["layer_norm_backward"], 2 * gc.n_layer + 1);
    EXPECT_EQ(kernels_.calls["add"], 0);
    EXPECT_EQ(kernels_.calls["axpy"], 0);
  }
}

TEST_F(DeviceDispatch, Bf16AutocastKeepsTheF32AttentionForOtherHeadSizes) {
  const std::vector<float> cpu = train_tiny(Device::cpu(), 3, nullptr, nullptr, DType::bf16, 4);
  std::map<std::string, int> calls;
  const std::vector<float> dev = train_tiny(kDev, 3, &calls, &kernels_, DType::bf16, 4);
  EXPECT_EQ(dev, cpu);
  EXPECT_GT(calls["matmul_half"], 0);
  EXPECT_GT(calls["attention_forward"], 0) << "heads of 8 have no flash kernel";
  EXPECT_EQ(calls["flash_attention_forward"], 0);
}

// f16 autocast with dynamic loss scaling on the device: the scaler's overflow check and division
// run there (one wait for every gradient), and every step (the skipped overflows, the backoffs,
// the applied updates) is the CPU run's, bit for bit.
TEST_F(DeviceDispatch, F16LossScalingRunsOnTheDeviceWithTheCpuBits) {
  struct Step {
    float loss;
    bool overflow;
    double scale;
    bool operator==(const Step&) const = default;
  };
  auto run = [](Device device) {
    nn::GPT model(test::tiny_gpt_config(1));
    model.to(device);
    auto params = model.named_parameters();
    optim::AdamW opt(optim::decay_groups(params, 0.1f), optim::AdamWOptions{});
    optim::LossScalerOptions so;
    so.init_scale = 16777216.0;  // 2^24: the first backward passes overflow f16
    so.growth_interval = 3;
    optim::LossScaler scaler(so);
    Generator gen(3);
    std::vector<Step> steps;
    for (int s = 0; s < 10; ++s) {
      auto [x, y] = test::random_tokens(gen, 2, device);
      opt.zero_grad();
      Tensor loss;
      {
        autograd::AutocastGuard autocast(DType::f16);
        loss = model.loss(x, y);
        autograd::backward(loss, Tensor::scalar(static_cast<float>(scaler.scale())));
      }
      const bool overflow = scaler.unscale(params);
      if (!overflow) opt.step();
      scaler.update(overflow);
      steps.push_back({loss.item(), overflow, scaler.scale()});
    }
    return steps;
  };
  const std::vector<Step> cpu = run(Device::cpu());
  const int before = kernels_.calls["sum_squares_each"];
  const std::vector<Step> dev = run(kDev);
  EXPECT_TRUE(dev == cpu);
  int overflows = 0;
  for (const Step& s : dev) overflows += s.overflow ? 1 : 0;
  EXPECT_GT(overflows, 0) << "no step overflowed: the check was not exercised";
  EXPECT_LT(overflows, 10) << "no update was applied";
  EXPECT_GE(kernels_.calls["sum_squares_each"] - before, 10) << "the check ran on the device";
}

TEST_F(DeviceDispatch, MatmulUnderAutocastRoundsOnTheDevice) {
  Generator gen(4);
  Tensor a = Tensor::empty({6, 5}), b = Tensor::empty({5, 4});
  normal_(a, gen, 0.0, 1.0);
  normal_(b, gen, 0.0, 1.0);
  auto run = [](Tensor x, Tensor y) {
    x.set_requires_grad(true);
    y.set_requires_grad(true);
    autograd::AutocastGuard autocast(DType::bf16);
    Tensor p = autograd::matmul(x, y);
    autograd::backward(p, Tensor::ones(p.shape(), DType::f32, p.device()));
    return std::vector<std::vector<float>>{p.to_vector(), x.grad().to_vector(),
                                           y.grad().to_vector()};
  };
  const auto want = run(a.clone(), b.clone());
  EXPECT_EQ(run(a.to(kDev), b.to(kDev)), want);
  EXPECT_GT(kernels_.calls["cast"], 0) << "the operands were rounded on the device";
}

// An LM head's input h[N, C], table w[V, C] and targets (every `skip`-th ignored), on the host.
struct HeadInputs {
  Tensor h, w, targets;
};
HeadInputs head_inputs(int64_t N, int64_t C, int64_t V, uint64_t seed, double w_std, size_t skip,
                       size_t stride) {
  Generator gen(seed);
  HeadInputs in{Tensor::empty({N, C}), Tensor::empty({V, C}), Tensor()};
  normal_(in.h, gen, 0.0, 1.0);
  normal_(in.w, gen, 0.0, w_std);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = i % skip == 0 ? -1 : static_cast<int32_t>(i * stride % static_cast<size_t>(V));
  in.targets = Tensor::from_vector(t, {N});
  return in;
}

// A GPT's LM head under bf16 holds the step's largest buffers: the logits and their gradient.
// The cross-entropy writes the gradient over the logits, which nothing else holds once the loss
// is computed, and the head's backward takes a bf16 copy of it: backward adds half the logits'
// bytes at most, where it added one and a half (a second f32 buffer beside the logits, then the
// copy) before. The gradients keep the CPU's bits.
TEST_F(DeviceDispatch, TheLmHeadBackwardAllocatesNoSecondLogitsBuffer) {
  const int64_t N = 256, C = 16, V = 4096;
  const size_t logits_bytes = static_cast<size_t>(N * V) * sizeof(float);
  const auto [h, w, targets] = head_inputs(N, C, V, 5, 0.5, 17, 37);
  auto run = [&](Tensor x, Tensor y, const Tensor& tg, size_t* added) {
    x.set_requires_grad(true);
    y.set_requires_grad(true);
    autograd::AutocastGuard autocast(DType::bf16);
    Tensor loss = autograd::cross_entropy(autograd::linear(x, y, Tensor()), tg, -1);
    alloc_.reset_peak();
    const size_t before = alloc_.live_bytes();
    autograd::backward(loss);
    if (added != nullptr) *added = alloc_.peak_bytes() - before;
    return std::vector<std::vector<float>>{loss.to_vector(), x.grad().to_vector(),
                                           y.grad().to_vector()};
  };
  const auto want = run(h.clone(), w.clone(), targets, nullptr);
  size_t added = 0;
  EXPECT_EQ(run(h.to(kDev), w.to(kDev), targets.to(kDev), &added), want);
  EXPECT_LT(added, logits_bytes * 3 / 4)
      << "backward added " << added << " bytes to logits of " << logits_bytes;
  EXPECT_GT(added, logits_bytes / 4) << "the bf16 copy of the logits' gradient is counted";
}

// The fused head (autograd/linear_cross_entropy.h), which GPT's loss uses: under autocast the
// device keeps the logits in the half type from forward to backward, the cross-entropy writes
// their gradient over them (bf16: in the forward; f16: in the backward, scaled first), and
// backward adds nothing of their size and reads nothing back from the device. The CPU's bits
// throughout.
TEST_F(DeviceDispatch, TheFusedLmHeadKeepsHalfLogitsWithTheCpuBits) {
  const int64_t N = 256, C = 16, V = 4096;
  const size_t half_logits = static_cast<size_t>(N * V) * 2;
  const auto [h, w, targets] = head_inputs(N, C, V, 6, 1.5, 19, 41);
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    size_t kept = 0, added = 0;
    auto run = [&](Tensor x, Tensor y, const Tensor& tg, bool count) {
      x.set_requires_grad(true);
      y.set_requires_grad(true);
      autograd::AutocastGuard autocast(half);
      const size_t start = alloc_.live_bytes();
      Tensor loss = autograd::linear_cross_entropy(x, y, tg, -1);
      if (count) kept = alloc_.live_bytes() - start;
      alloc_.reset_peak();
      const size_t before = alloc_.live_bytes();
      const int downloads = alloc_.downloads;
      autograd::backward(loss);
      if (count) added = alloc_.peak_bytes() - before;
      EXPECT_EQ(alloc_.downloads, downloads) << "the default seed 1 is known on the host";
      return std::vector<std::vector<float>>{loss.to_vector(), x.grad().to_vector(),
                                             y.grad().to_vector()};
    };
    const auto want = run(h.clone(), w.clone(), targets, false);
    kernels_.calls.clear();
    EXPECT_EQ(run(h.to(kDev), w.to(kDev), targets.to(kDev), true), want);
    EXPECT_GE(kept, half_logits);
    EXPECT_LT(kept, half_logits + half_logits / 8) << "the graph keeps " << kept << " bytes";
    EXPECT_LT(added, half_logits / 4) << "backward added " << added << " bytes";
    EXPECT_EQ(kernels_.calls["matmul_half"], 3);
    EXPECT_EQ(kernels_.calls["cross_entropy_forward"], 1);
    EXPECT_EQ(kernels_.calls["cross_entropy_backward"], half == DType::f16 ? 1 : 0)
        << "under bf16 the forward wrote the gradient";
  }
}

// The head's incoming gradient (a trainer's loss scale over its micro-batches) is the alpha of
// the backward's two products: a power of two scales every gradient bit exactly, any other value
// is still the CPU's bits on the device; a seed given on the host is never read back from the
// device, one given on the device is read once. Without a gradient wanted the forward writes
// none.
TEST_F(DeviceDispatch, TheLmHeadScalesItsProductsByTheIncomingGradient) {
  const int64_t N = 64, C = 16, V = 512;
  const auto [h, w, targets] = head_inputs(N, C, V, 7, 1.5, 23, 43);
  std::optional<autograd::AutocastGuard> autocast(std::in_place, DType::bf16);
  // {loss, dh, dw} with the seed given on the host, or on the device where `seed_on_device`.
  auto run = [&](Device dev, float seed, bool seed_on_device, int* downloads) {
    // Fresh leaves each run (to() the CPU is the tensor itself).
    Tensor x = h.clone().to(dev), y = w.clone().to(dev);
    x.set_requires_grad(true);
    y.set_requires_grad(true);
    const Tensor loss = autograd::linear_cross_entropy(x, y, targets.to(dev), -1);
    const Tensor g = seed_on_device ? Tensor::scalar(seed).to(dev) : Tensor::scalar(seed);
    const int before = alloc_.downloads;
    autograd::backward(loss, g);
    if (downloads != nullptr) *downloads = alloc_.downloads - before;
    return std::vector<std::vector<float>>{loss.to_vector(), x.grad().to_vector(),
                                           y.grad().to_vector()};
  };
  // The device's results against the CPU's for one seed given on the host (never read back) and
  // on the device (read back `device_reads` times); returns the CPU's.
  auto expect_cpu_bits = [&](float seed, int device_reads) {
    const auto cpu = run(Device::cpu(), seed, false, nullptr);
    int downloads = -1;
    EXPECT_EQ(run(kDev, seed, false, &downloads), cpu);
    EXPECT_EQ(downloads, 0);
    EXPECT_EQ(run(kDev, seed, true, &downloads), cpu);
    EXPECT_EQ(downloads, device_reads);
    return cpu;
  };
  const auto one = run(Device::cpu(), 1.0f, false, nullptr);
  for (const float seed : {0.25f, 0.3f, 8.0f}) {
    SCOPED_TRACE(seed);
    const auto cpu = expect_cpu_bits(seed, 1);
    const bool power_of_two = seed != 0.3f;
    for (size_t t = 1; t < 3; ++t)
      for (size_t i = 0; i < cpu[t].size(); ++i) {
        const float scaled = seed * one[t][i];
        if (power_of_two)
          ASSERT_EQ(cpu[t][i], scaled) << t << " " << i;
        else
          ASSERT_NEAR(cpu[t][i], scaled, 1e-6f * std::abs(scaled) + 1e-12f) << t << " " << i;
      }
  }
  // Under no_grad there is no gradient to write.
  kernels_.calls.clear();
  {
    autograd::NoGradGuard no_grad;
    Tensor x = h.to(kDev), y = w.to(kDev);
    x.set_requires_grad(true);
    const Tensor loss = autograd::linear_cross_entropy(x, y, targets.to(kDev), -1);
    EXPECT_EQ(loss.to_vector(), one[0]);
  }
  EXPECT_EQ(kernels_.calls["cross_entropy_forward"], 1);
  // Under f16 the seed scales the gradient before it is rounded, in the backward's kernel, which
  // reads it where it lies: the CPU's bits, and nothing read back from the device.
  autocast.reset();
  autograd::AutocastGuard f16(DType::f16);
  for (const float seed : {0.3f, 1024.0f}) {
    SCOPED_TRACE(seed);
    expect_cpu_bits(seed, 0);
  }
}

// Under autocast a bias whose weight is frozen still gets its gradient, the CPU's bits, from the
// weight-gradient entry with no weight gradient to write.
TEST_F(DeviceDispatch, Bf16BiasGradientOfAFrozenWeight) {
  Generator gen(9);
  const Tensor x = randn({6, 8}, gen), w = randn({5, 8}, gen), b = randn({5}, gen),
               d = randn({6, 5}, gen);
  auto grads = [&](Device dev, bool weight_wants) {
    Tensor xd = x.to(dev), wd = w.to(dev), bd = b.to(dev);
    wd.set_requires_grad(weight_wants);
    bd.set_requires_grad(true);
    autograd::AutocastGuard autocast(DType::bf16);
    const Tensor y = autograd::linear(xd, wd, bd);
    std::vector<Tensor> wanted{bd};
    if (weight_wants) wanted.push_back(wd);
    std::vector<std::vector<float>> out;
    for (const Tensor& g : autograd::grad({y}, {d.to(dev)}, wanted)) out.push_back(g.to_vector());
    return out;
  };
  for (const bool weight_wants : {false, true}) {
    kernels_.calls.clear();
    EXPECT_EQ(grads(kDev, weight_wants), grads(Device::cpu(), weight_wants)) << weight_wants;
    EXPECT_EQ(kernels_.calls["weight_grad_half"], 1) << weight_wants;
    EXPECT_EQ(kernels_.calls["bias_grad"], 0) << weight_wants;
  }
}

TEST_F(DeviceDispatch, OptimizerStateLivesWithTheParameters) {
  Tensor p = host({1.0f, 2.0f}).to(kDev);
  p.set_requires_grad(true);
  p.set_grad(host({0.5f, -0.5f}).to(kDev));
  optim::AdamW opt(optim::NamedParams{{"p", p}}, optim::AdamWOptions{});
  opt.step();
  EXPECT_EQ(opt.state_tensor("exp_avg", "p").device(), kDev);
  // A clipped step reads the factor with each gradient on the device too: the CPU's bits, and
  // the gradient left as it was.
  {
    Tensor h = p.to(Device::cpu());
    h.set_requires_grad(true);
    h.set_grad(host({0.5f, -0.5f}));
    optim::AdamW on_host(optim::NamedParams{{"p", h}}, optim::AdamWOptions{});
    on_host.load_state_dict(opt.state_dict());
    opt.step(0.25f);
    on_host.step(0.25f);
    EXPECT_EQ(p.to_vector(), h.to_vector());
    EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{0.5f, -0.5f}));
  }
  const optim::OptimizerState st = opt.state_dict();
  optim::AdamW fresh(optim::NamedParams{{"p", p}}, optim::AdamWOptions{});
  fresh.load_state_dict(st);
  EXPECT_EQ(fresh.state_tensor("exp_avg_sq", "p").device(), kDev);
  EXPECT_TRUE(
      ops::equal(fresh.state_tensor("exp_avg_sq", "p"), opt.state_tensor("exp_avg_sq", "p")));
  // SGD's momentum buffer too; its step runs on the device with the CPU's bits.
  optim::SgdOptions so;
  so.lr = 0.1f;
  so.momentum = 0.9f;
  so.nesterov = true;
  Tensor q = host({1.0f, 2.0f}), pd = q.to(kDev);
  for (Tensor* t : {&q, &pd}) {
    t->set_requires_grad(true);
    t->set_grad(host({0.5f, -0.5f}).to(t->device()));
  }
  optim::Sgd on_device(optim::NamedParams{{"p", pd}}, so);
  optim::Sgd on_host(optim::NamedParams{{"p", q}}, so);
  for (int step = 0; step < 2; ++step) {
    on_device.step();
    on_host.step();
  }
  EXPECT_EQ(on_device.state_tensor("momentum_buffer", "p").device(), kDev);
  EXPECT_EQ(pd.to_vector(), q.to_vector());
  EXPECT_EQ(kernels_.calls["sgd_step"], 2);
}

TEST_F(DeviceDispatch, ReducerKeepsDeviceBucketsAndMatchesPlainTraining) {
  const nn::GPTConfig gc = test::tiny_gpt_config();
  comm::ProcessGroupOptions po;
  po.name = "fake-nccl";
  auto group = std::make_shared<test::FakeNcclGroup>(
      comm::make_process_group("shm", std::make_shared<comm::HashStore>(), 0, 1, po));
  auto run = [&](bool ddp, const std::string& hook) {
    nn::GPT model(gc);
    model.to(kDev);
    auto params = model.named_parameters();
    std::unique_ptr<parallel::Reducer> reducer;
    if (ddp) {
      parallel::ReducerOptions ro;
      ro.first_bucket_bytes = 4 << 10;
      ro.bucket_bytes = 16 << 10;
      ro.comm_hook = parallel::parse_comm_hook_spec(hook);
      reducer = std::make_unique<parallel::Reducer>(params, group, ro);
    }
    optim::AdamW opt(optim::decay_groups(params, 0.1f), optim::AdamWOptions{});
    Generator gen(5);
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = test::random_tokens(gen, 2, kDev);
      opt.zero_grad();
      if (reducer) reducer->prepare_for_backward();
      Tensor loss = model.loss(x, y);
      autograd::backward(loss);
      if (reducer) {
        reducer->finalize_backward();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_EQ(params[i].second.grad().device(), kDev);
          EXPECT_EQ(params[i].second.grad().data_ptr(), reducer->bucket_view(i).data_ptr())
              << params[i].first << ": the gradient is a view into its bucket";
        }
      }
      opt.step();
      losses.push_back(loss.item());
    }
    if (reducer) {
      EXPECT_TRUE(reducer->rebuilt());
    }
    return losses;
  };
  const std::vector<float> plain = run(false, "");
  const std::vector<float> ddp = run(true, "allreduce");
  EXPECT_EQ(ddp, plain) << "one rank: the averaged gradient is the gradient";
  EXPECT_GE(group->all_reduces, 3 * 2) << "several buckets per step";
  EXPECT_EQ(group->broadcasts, 1) << "the rebuilt bucket order, through device memory";
  // bf16 compression: the buckets are cast on the device, there and back.
  EXPECT_EQ(kernels_.calls["cast"], 0);
  const std::vector<float> bf16 = run(true, "bf16");
  EXPECT_GE(kernels_.calls["cast"], 2 * 3 * 2);
  ASSERT_EQ(bf16.size(), plain.size());
  EXPECT_EQ(bf16[0], plain[0]) << "the first loss comes before any update";
  for (size_t i = 1; i < plain.size(); ++i) EXPECT_NEAR(bf16[i], plain[i], 1e-2 * plain[i]);
}

TEST_F(DeviceDispatch, ReducerNeedsAGroupThatReadsDeviceMemory) {
  auto store = std::make_shared<comm::HashStore>();
  comm::ProcessGroupOptions po;
  po.name = "fake-device-ddp";
  auto pg = comm::make_process_group("shm", store, 0, 1, po);
  Tensor p = Tensor::ones({4}, DType::f32, kDev);
  p.set_requires_grad(true);
  const std::string msg = error_of([&] {
    parallel::Reducer r(nn::NamedTensors{{"p", p}}, pg, {});
  });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nccl"), std::string::npos) << msg;
}

// A device the build has no code for, or one without what the precision needs: one line that
// names the device, what is wrong and the fix.
TEST(TrainDevice, NamesAnArchitectureTheBuildLacksAndBf16BeforeAmpere) {
  EXPECT_EQ(cuda::architectures_named("900"), "sm_90");
  EXPECT_EQ(cuda::architectures_named("800,900,1000"), "sm_80, sm_90, sm_100");
  if (cuda::built_with_cuda()) {
    EXPECT_NE(cuda::compiled_architectures().find("sm_"), std::string::npos)
        << cuda::compiled_architectures();
  }
  const std::string a100 = "cuda:0 NVIDIA A100-SXM4-80GB (sm_80, 108 SMs, 79.2 GiB)";
  EXPECT_EQ(cuda::support_problem(a100, 8, 0, DType::bf16, "sm_80, sm_90", ""), "");
  const std::string image =
      cuda::support_problem(a100, 8, 0, DType::f32, "sm_90", "cudaErrorNoKernelImageForDevice");
  EXPECT_EQ(image,
            a100 +
                " has no code in this build (cudaErrorNoKernelImageForDevice): its kernels are "
                "for sm_90; rebuild with -DCMAKE_CUDA_ARCHITECTURES=80 (or "
                "scripts/gpu-bundle.sh --arch 80)");
  const std::string t4 = "cuda:0 Tesla T4 (sm_75, 40 SMs, 14.6 GiB)";
  EXPECT_EQ(cuda::support_problem(t4, 7, 5, DType::f16, "sm_75", ""), "");
  EXPECT_EQ(cuda::support_problem(t4, 7, 5, DType::bf16, "sm_75", ""),
            t4 + " has no bf16 tensor cores (compute capability 7.5; bf16 needs 8.0 or newer): use "
                 "train.precision = \"f16\" (with loss scaling) or \"f32\"");
}

// train.device on a machine without a usable GPU: one line naming the key and the reason.
TEST(TrainDevice, ExplainsWhyCudaCannotBeUsed) {
  const auto on = [](const char* setting) {
    runtime::TrainConfig c;
    c.train.device = setting;
    return runtime::resolve_config(c);
  };
  EXPECT_TRUE(runtime::resolve_train_device(on("cpu"), 3).is_cpu());
  const std::string bad = error_of([&] { (void)runtime::resolve_train_device(on("gpu"), 0); });
  EXPECT_NE(bad.find("train.device"), std::string::npos) << bad;
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  for (const char* setting : {"cuda", "cuda:1"}) {
    const std::string msg = error_of([&] { (void)runtime::resolve_train_device(on(setting), 0); });
    EXPECT_NE(msg.find("train.device"), std::string::npos) << msg;
    EXPECT_NE(msg.find(cuda::unavailable_reason()), std::string::npos) << msg;
  }
  // The trainer asks before it reads any data.
  runtime::TrainConfig c;
  c.train.device = "cuda";
  c.data.dir = "/nonexistent";
  c.train.threads = 1;
  const std::string msg = error_of([&] { runtime::Trainer t(c, {}); });
  EXPECT_NE(msg.find("train.device"), std::string::npos) << msg;
}

}  // namespace
}  // namespace meshtrain
