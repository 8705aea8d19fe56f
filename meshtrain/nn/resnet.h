// ResNet (He et al. 2016) over NCHW images, built from basic blocks (two 3x3 convolutions) or
// bottleneck blocks (1x1, 3x3, 1x1; the stride on the 3x3 as in torchvision's v1.5). Module names
// are torchvision's (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, fc), so a state dict loads
// into torchvision.models.resnet18/50 as it is. Two stems: ImageNet's (7x7 stride-2 convolution
// and 3x3 stride-2 max pooling) and one for small images such as Fashion-MNIST's 28x28 (a 3x3
// stride-1 convolution, no pooling), where the ImageNet stem would leave 7x7 maps after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/nn/batch_norm.h"
#include "meshtrain/nn/conv2d.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

struct ResNetConfig {
  enum class Block { basic, bottleneck };
  Block block = Block::basic;
  std::vector<int64_t> blocks{2, 2, 2};  // blocks per stage; each stage after the first halves
                                         // the maps (stride 2) and doubles the width
  int64_t width = 16;                    // the first stage's width (bottleneck: its inner width)
  int64_t in_channels = 1;
  int64_t num_classes = 10;
  bool imagenet_stem = false;
  uint64_t seed = 0;
  float label_smoothing = 0.0f;  // of the training loss (loss()); [0, 1)

  // Expansion of a block's output over its inner width: 1 (basic) or 4 (bottleneck).
  int64_t expansion() const { return block == Block::bottleneck ? 4 : 1; }
  // The ResNet for 28x28 single-channel images: basic blocks {2, 2, 2} at widths 16, 32, 64.
  static ResNetConfig small(int64_t classes = 10);
  // torchvision's resnet18 and resnet50 (3 x 224 x 224 inputs).
  static ResNetConfig resnet18(int64_t classes = 1000);
  static ResNetConfig resnet50(int64_t classes = 1000);
};

// "small", "tiny" (one block per stage, width 4: tests), "resnet18", "resnet50"; ValueError
// naming the choices otherwise.
ResNetConfig resnet_config(const std::string& name, int64_t in_channels, int64_t classes);

// One residual block: out = relu(body(x) + shortcut(x)); the shortcut is the identity or, where
// the shape changes, a 1x1 convolution and batch norm ("downsample").
class ResidualBlock : public Module {
 public:
  ResidualBlock(ResNetConfig::Block kind, int64_t in, int64_t inner, int64_t stride,
                Generator& gen);
  Tensor forward(const Tensor& x) const;
  int64_t out_channels() const { return out_; }
  // Its BatchNorm2d layers under their names inside the block ("bn1", "downsample.1").
  std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> batch_norms() const;

 private:
  int64_t out_ = 0;
  std::vector<std::shared_ptr<Conv2d>> convs_;  // conv1, conv2 (, conv3)
  std::vector<std::shared_ptr<BatchNorm2d>> norms_;
  std::shared_ptr<Module> downsample_;  // children "0" (conv) and "1" (bn); null: identity
  std::shared_ptr<Conv2d> down_conv_;
  std::shared_ptr<BatchNorm2d> down_norm_;
};

// In evaluation without gradients every conv-BN(-ReLU) runs as one fused convolution
// (conv_bn_relu.h); training runs the layers one by one.
class ResNet : public Module {
 public:
  explicit ResNet(const ResNetConfig& config);
  // x[N, C, H, W] -> logits[N, classes].
  Tensor forward(const Tensor& x) const;
  // Mean cross-entropy against i32 labels[N].
  Tensor loss(const Tensor& x, const Tensor& labels) const;
  // The class with the highest logit per image (no graph recorded).
  std::vector<int32_t> predict(const Tensor& x) const;
  const ResNetConfig& config() const { return config_; }
  // Every BatchNorm2d with its module name ("layer1.0.bn1"), in registration order.
  std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> batch_norms() const;

 private:
  ResNetConfig config_;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::vector<std::vector<std::shared_ptr<ResidualBlock>>> stages_;
  std::shared_ptr<Linear> fc_;
  std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> norms_;
};

}  // namespace meshtrain::nn
