// nn.BatchNorm2d: per-channel normalisation of NCHW tensors with batch statistics in training and
// running statistics in evaluation (Module::train / eval). Parameters weight and bias, buffers
// running_mean, running_var and num_batches_tracked carry PyTorch's names, so a state dict loads
// into torchvision's models as it is. In training, a BatchNormSync (set_sync) makes the statistics
// those of every rank's batch together.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/nn/batch_norm_sync.h"
#include "meshtrain/nn/layer.h"

namespace meshtrain::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch
  bool affine = true;     // learnable weight (1 at start) and bias (0)
};

class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(int64_t channels, BatchNormOptions options = {});
  Tensor forward(const Tensor& x) const override;

  // Training-mode statistics and gradient sums go through `sync` under `layer_name` (the layer's
  // global name, so that every rank's layers pair up); nullptr returns to this rank's batch alone.
  void set_sync(std::shared_ptr<BatchNormSync> sync, std::string layer_name);

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  int64_t num_batches_tracked() const;
  const BatchNormOptions& options() const { return options_; }

 private:
  BatchNormOptions options_;
  int64_t channels_;
  Tensor weight_;
  Tensor bias_;
  Tensor running_mean_;
  Tensor running_var_;
  Tensor num_batches_tracked_;  // i64 scalar, as PyTorch stores it
  std::shared_ptr<BatchNormSync> sync_;
  std::string layer_name_;
};

}  // namespace meshtrain::nn
