// A tiny ResNet ("tiny": one basic block per stage, width 4, 3 classes) trained a few steps on a
// device from fixed weights and random images: what the fake-device tests hold to the CPU's bits
// and the GPU tests to the CPU within a tolerance.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/sgd.h"
#include "meshtrain/tensor/random.h"

namespace meshtrain::test {

struct TinyResNetRun {
  int steps = 3;
  int64_t batch = 4;
  int64_t image = 12;  // side of the square single-channel images
  bool sgd = false;    // the Fashion-MNIST recipe's SGD (Nesterov, weight decay); else AdamW
  float label_smoothing = 0.0f;  // of the training loss
};

// The losses of every step, then every buffer of the model after them (running statistics).
inline std::vector<float> train_tiny_resnet(Device device, const TinyResNetRun& r) {
  nn::ResNetConfig rc = nn::resnet_config("tiny", 1, 3);
  rc.seed = 5;
  rc.label_smoothing = r.label_smoothing;
  nn::ResNet model(rc);
  model.to(device);
  model.train();
  auto params = model.named_parameters();
  std::unique_ptr<optim::Optimizer> opt;
  if (r.sgd) {
    optim::SgdOptions so;
    so.lr = 0.1f;
    so.momentum = 0.9f;
    so.nesterov = true;
    opt = std::make_unique<optim::Sgd>(optim::decay_groups(params, 5e-4f), so);
  } else {
    optim::AdamWOptions ao;
    ao.lr = 1e-2f;
    opt = std::make_unique<optim::AdamW>(optim::decay_groups(params, 0.0f), ao);
  }
  Generator gen(9);
  std::vector<float> out;
  for (int step = 0; step < r.steps; ++step) {
    Tensor images = randn({r.batch, 1, r.image, r.image}, gen).to(device);
    std::vector<int32_t> labels;
    for (int64_t i = 0; i < r.batch; ++i) labels.push_back(static_cast<int32_t>((i + step) % 3));
    opt->zero_grad();
    Tensor loss = model.loss(images, Tensor::from_vector(labels, {r.batch}).to(device));
    autograd::backward(loss);
    opt->step();
    out.push_back(loss.item());
  }
  for (const auto& [name, buffer] : model.named_buffers())
    for (const float v : buffer.to_vector()) out.push_back(v);
  return out;
}

}  // namespace meshtrain::test
