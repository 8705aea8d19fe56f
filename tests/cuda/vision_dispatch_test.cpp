// The vision layers on a device, through the fake device of fake_device.h (host memory, the CPU
// kernels behind the device kernel table): convolution, batch norm (training with running
// statistics, and evaluation), ReLU and every pooling must take the device path and give the
// CPU's bits, forward and backward, and a small ResNet trained on the device must give the CPU's
// losses and running statistics bit for bit. The CUDA kernels themselves (cuDNN's convolutions,
// meshtrain/cuda/kernels/vision.cu) are held to the CPU in vision_cuda_test.cpp, on a GPU.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "fake_device.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/tensor/random.h"
#include "tiny_resnet_training.h"

namespace meshtrain {
namespace {

const Device kDev = Device::cuda(0);

class VisionDispatch : public test::FakeDeviceTest {};

struct LayerRun {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
  std::vector<float> running_mean, running_var;
};

// conv (stride 2, padding 1, bias) -> batch norm (training, running statistics) -> relu ->
// max pool 3/2/1 -> avg pool 2/1 -> global average pool -> linear -> cross-entropy, on `device`.
LayerRun layers(Device device, bool training) {
  Generator gen(11);
  Tensor x = randn({3, 2, 9, 9}, gen), w = randn({4, 2, 3, 3}, gen), b = randn({4}, gen);
  Tensor gamma = randn({4}, gen), beta = randn({4}, gen), fc = randn({5, 4}, gen);
  Tensor rm = randn({4}, gen), rv = ops::affine(randn({4}, gen), 0.1f, 1.0f);
  std::vector<Tensor*> params{&x, &w, &b, &gamma, &beta, &fc};
  for (Tensor* t : params) *t = t->to(device).set_requires_grad(true);
  rm = rm.to(device);
  rv = rv.to(device);
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{1, 4, 0}, {3}).to(device);

  Tensor h = autograd::conv2d(x, w, b, {.stride = 2, .padding = 1});
  h = autograd::batch_norm(h, gamma, beta, rm, rv, training, 0.1, 1e-5);
  h = autograd::relu(h);
  h = autograd::max_pool2d(h, 3, 2, 1);
  h = autograd::avg_pool2d(h, 2, 1, 0);
  h = autograd::global_avg_pool(h);
  Tensor loss = autograd::cross_entropy(autograd::linear(h, fc, Tensor()), labels);
  EXPECT_EQ(loss.device(), device);
  autograd::backward(loss);
  LayerRun r;
  r.loss = loss.item();
  const char* names[] = {"x", "w", "b", "gamma", "beta", "fc"};
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i]->grad().device(), device) << names[i];
    r.grads[names[i]] = params[i]->grad().to_vector();
  }
  r.running_mean = rm.to_vector();
  r.running_var = rv.to_vector();
  return r;
}

TEST_F(VisionDispatch, EveryVisionLayerRunsOnTheDeviceWithTheCpuBits) {
  for (const bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "evaluation");
    kernels_.calls.clear();
    const LayerRun cpu = layers(Device::cpu(), training);
    EXPECT_TRUE(kernels_.calls.empty()) << "the CPU path never touches the device table";
    const LayerRun dev = layers(kDev, training);
    EXPECT_EQ(dev.loss, cpu.loss);
    for (const auto& [name, g] : cpu.grads) EXPECT_EQ(dev.grads.at(name), g) << name;
    EXPECT_EQ(dev.running_mean, cpu.running_mean);
    EXPECT_EQ(dev.running_var, cpu.running_var);
    std::vector<std::string> ops = {"conv2d_forward",
                                    "conv2d_backward_data",
                                    "conv2d_backward_weights",
                                    "batch_norm_apply",
                                    "batch_norm_backward_reduce",
                                    "batch_norm_backward_apply",
                                    "relu_forward",
                                    "relu_backward",
                                    "max_pool2d_forward",
                                    "max_pool2d_backward",
                                    "avg_pool2d_forward",
                                    "avg_pool2d_backward",
                                    "global_avg_pool_forward",
                                    "global_avg_pool_backward"};
    if (training) ops.push_back("batch_norm_statistics");
    for (const std::string& op : ops) EXPECT_GT(kernels_.calls[op], 0) << op;
    EXPECT_EQ(kernels_.calls.count("batch_norm_statistics") > 0, training)
        << "evaluation normalises with the running statistics";
  }
}

TEST_F(VisionDispatch, InferenceConvolutionRunsOnTheDeviceUnfused) {
  Generator gen(3);
  Tensor x = randn({2, 3, 6, 6}, gen), w = randn({5, 3, 3, 3}, gen), b = randn({5}, gen);
  const Tensor cpu = autograd::conv2d_inference(x, w, b, {.padding = 1}, /*relu=*/true);
  const Tensor dev =
      autograd::conv2d_inference(x.to(kDev), w.to(kDev), b.to(kDev), {.padding = 1}, true);
  EXPECT_EQ(dev.device(), kDev);
  // The CPU fuses the ReLU into oneDNN's convolution (a post-op); the device runs the
  // convolution and then the ReLU: equal up to the convolution's round-off.
  const std::vector<float> a = cpu.to_vector(), d = dev.to_vector();
  ASSERT_EQ(a.size(), d.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(d[i], a[i], 1e-5f) << i;
  EXPECT_EQ(kernels_.calls["conv2d_forward"], 1);
  EXPECT_EQ(kernels_.calls["relu_forward"], 1);
}

TEST_F(VisionDispatch, AResNetTrainsOnTheDeviceWithTheCpuBits) {
  const std::vector<float> cpu = test::train_tiny_resnet(Device::cpu(), {});
  const std::vector<float> dev = test::train_tiny_resnet(kDev, {});
  EXPECT_EQ(dev, cpu);
  const test::TinyResNetRun sgd{.sgd = true};
  EXPECT_EQ(test::train_tiny_resnet(kDev, sgd), test::train_tiny_resnet(Device::cpu(), sgd));
  EXPECT_GT(kernels_.calls["sgd_step"], 0);
  // Label smoothing runs on the device with the CPU's bits, and changes the run.
  const test::TinyResNetRun smoothed{.sgd = true, .label_smoothing = 0.1f};
  const std::vector<float> smoothed_cpu = test::train_tiny_resnet(Device::cpu(), smoothed);
  EXPECT_EQ(test::train_tiny_resnet(kDev, smoothed), smoothed_cpu);
  EXPECT_NE(smoothed_cpu, test::train_tiny_resnet(Device::cpu(), sgd));
  for (const char* op : {"conv2d_forward", "conv2d_backward_data", "conv2d_backward_weights",
                         "batch_norm_statistics", "batch_norm_backward_apply", "relu_backward",
                         "global_avg_pool_backward", "adamw_step_many"})
    EXPECT_GT(kernels_.calls[op], 0) << op << " never ran on the device";
}

}  // namespace
}  // namespace meshtrain
