#include "meshtrain/nn/resnet.h"

#include <cmath>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/nn/conv_bn_relu.h"
#include "meshtrain/nn/top1.h"
#include "meshtrain/util/error.h"

namespace meshtrain::nn {

namespace {

// A named group of modules ("layer1" holding blocks "0", "1", ...; "downsample" holding "0" and
// "1"), so that names follow torchvision's nn.Sequential.
class Container : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                             Generator& gen) {
  Conv2dOptions o;
  o.stride = stride;
  o.padding = kernel / 2;
  o.bias = false;  // a batch norm follows every convolution
  return std::make_shared<Conv2d>(in, out, kernel, o, gen);
}

}  // namespace

ResNetConfig ResNetConfig::small(int64_t classes) {
  ResNetConfig c;
  c.num_classes = classes;
  return c;
}

ResNetConfig ResNetConfig::resnet18(int64_t classes) {
  ResNetConfig c;
  c.blocks = {2, 2, 2, 2};
  c.width = 64;
  c.in_channels = 3;
  c.num_classes = classes;
  c.imagenet_stem = true;
  return c;
}

ResNetConfig ResNetConfig::resnet50(int64_t classes) {
  ResNetConfig c = resnet18(classes);
  c.block = Block::bottleneck;
  c.blocks = {3, 4, 6, 3};
  return c;
}

ResNetConfig resnet_config(const std::string& name, int64_t in_channels, int64_t classes) {
  ResNetConfig c;
  if (name == "small") {
    c = ResNetConfig::small(classes);
  } else if (name == "tiny") {
    // For tests and smoke runs: one block per stage, width 4.
    c = ResNetConfig::small(classes);
    c.blocks = {1, 1, 1};
    c.width = 4;
  } else if (name == "resnet18") {
    c = ResNetConfig::resnet18(classes);
  } else if (name == "resnet50") {
    c = ResNetConfig::resnet50(classes);
  } else {
    MT_THROW(ValueError, "no ResNet named \"", name,
             "\"; choose small, tiny, resnet18 or resnet50");
  }
  c.in_channels = in_channels;
  return c;
}

ResidualBlock::ResidualBlock(ResNetConfig::Block kind, int64_t in, int64_t inner, int64_t stride,
                             Generator& gen) {
  const bool bottleneck = kind == ResNetConfig::Block::bottleneck;
  out_ = bottleneck ? inner * 4 : inner;
  auto add_conv = [&](int64_t a, int64_t b, int64_t kernel, int64_t s) {
    const std::string n = std::to_string(convs_.size() + 1);
    convs_.push_back(register_module("conv" + n, conv(a, b, kernel, s, gen)));
    norms_.push_back(register_module("bn" + n, std::make_shared<BatchNorm2d>(b)));
  };
  if (bottleneck) {
    add_conv(in, inner, 1, 1);
    add_conv(inner, inner, 3, stride);
    add_conv(inner, out_, 1, 1);
  } else {
    add_conv(in, inner, 3, stride);
    add_conv(inner, inner, 3, 1);
  }
  if (stride != 1 || in != out_) {
    auto down = std::make_shared<Container>();
    down_conv_ = down->add("0", conv(in, out_, 1, stride, gen));
    down_norm_ = down->add("1", std::make_shared<BatchNorm2d>(out_));
    downsample_ = register_module("downsample", std::shared_ptr<Module>(down));
  }
}

Tensor ResidualBlock::forward(const Tensor& x) const {
  Tensor h = x;
  // Each conv-BN(-ReLU) runs as one fused convolution in evaluation without gradients.
  for (size_t i = 0; i < convs_.size(); ++i)
    h = conv_bn_relu(*convs_[i], *norms_[i], h, i + 1 < convs_.size());
  const Tensor shortcut = downsample_ ? conv_bn_relu(*down_conv_, *down_norm_, x, false) : x;
  return autograd::relu(autograd::add(h, shortcut));
}

std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> ResidualBlock::batch_norms()
    const {
  std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> out;
  for (size_t i = 0; i < norms_.size(); ++i)
    out.emplace_back("bn" + std::to_string(i + 1), norms_[i]);
  if (down_norm_) out.emplace_back("downsample.1", down_norm_);
  return out;
}

ResNet::ResNet(const ResNetConfig& config) : config_(config) {
  MT_CHECK(!config.blocks.empty() && config.width > 0 && config.in_channels > 0 &&
               config.num_classes > 1,
           "a ResNet needs at least one stage, a positive width and input channels, and two "
           "classes");
  Generator gen(config.seed);
  const int64_t stem = config.width;
  conv1_ = register_module("conv1", conv(config.in_channels, stem, config.imagenet_stem ? 7 : 3,
                                         config.imagenet_stem ? 2 : 1, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(stem));
  norms_.emplace_back("bn1", bn1_);
  int64_t channels = stem;
  for (size_t s = 0; s < config.blocks.size(); ++s) {
    MT_CHECK(config.blocks[s] > 0, "ResNet stage ", s + 1, " needs at least one block");
    auto stage = std::make_shared<Container>();
    const std::string stage_name = "layer" + std::to_string(s + 1);
    const int64_t inner = config.width << s;
    std::vector<std::shared_ptr<ResidualBlock>> blocks;
    for (int64_t b = 0; b < config.blocks[s]; ++b) {
      const int64_t stride = s > 0 && b == 0 ? 2 : 1;
      auto block = stage->add(std::to_string(b), std::make_shared<ResidualBlock>(
                                                     config.block, channels, inner, stride, gen));
      for (const auto& [name, bn] : block->batch_norms())
        norms_.emplace_back(stage_name + "." + std::to_string(b) + "." + name, bn);
      channels = block->out_channels();
      blocks.push_back(std::move(block));
    }
    register_module(stage_name, std::shared_ptr<Module>(stage));
    stages_.push_back(std::move(blocks));
  }
  fc_ = register_module("fc",
                        std::make_shared<Linear>(channels, config.num_classes, true, gen,
                                                 1.0 / std::sqrt(static_cast<double>(channels))));
}

Tensor ResNet::forward(const Tensor& x) const {
  MT_CHECK(x.dim() == 4 && x.size(1) == config_.in_channels, "ResNet: expected images [N, ",
           config_.in_channels, ", H, W], got ", shape_str(x.shape()));
  Tensor h = conv_bn_relu(*conv1_, *bn1_, x, true);
  if (config_.imagenet_stem) h = autograd::max_pool2d(h, 3, 2, 1);
  for (const auto& stage : stages_)
    for (const auto& block : stage) h = block->forward(h);
  return fc_->forward(autograd::global_avg_pool(h));
}

Tensor ResNet::loss(const Tensor& x, const Tensor& labels) const {
  return autograd::cross_entropy(forward(x), labels, -1, config_.label_smoothing);
}

std::vector<int32_t> ResNet::predict(const Tensor& x) const {
  autograd::NoGradGuard no_grad;
  return top1(forward(x));
}

std::vector<std::pair<std::string, std::shared_ptr<BatchNorm2d>>> ResNet::batch_norms() const {
  return norms_;
}

}  // namespace meshtrain::nn
