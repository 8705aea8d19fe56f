#include "meshtrain/nn/batch_norm.h"

#include "meshtrain/autograd/vision.h"

namespace meshtrain::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, BatchNormOptions options)
    : options_(options), channels_(channels) {
  MT_CHECK(channels >= 1, "BatchNorm2d: channels ", channels, " must be positive");
  MT_CHECK(options.eps > 0.0 && options.momentum >= 0.0 && options.momentum <= 1.0,
           "BatchNorm2d: eps ", options.eps, " must be positive and momentum ", options.momentum,
           " in [0, 1]");
  if (options.affine) {
    weight_ = register_parameter("weight", Tensor::ones({channels}), ParamInit::ones());
    bias_ = register_parameter("bias", Tensor::zeros({channels}), ParamInit::zeros());
  }
  running_mean_ = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var_ = register_buffer("running_var", Tensor::ones({channels}));
  num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::i64));
}

void BatchNorm2d::set_sync(std::shared_ptr<BatchNormSync> sync, std::string layer_name) {
  sync_ = std::move(sync);
  layer_name_ = std::move(layer_name);
}

int64_t BatchNorm2d::num_batches_tracked() const {
  return num_batches_tracked_.data<int64_t>()[0];
}

Tensor BatchNorm2d::forward(const Tensor& x) const {
  MT_CHECK(x.dim() == 4, "BatchNorm2d: input must be [N, C, H, W], got ", shape_str(x.shape()));
  MT_CHECK(x.size(1) == channels_, "BatchNorm2d: input ", shape_str(x.shape()), " has ", x.size(1),
           " channels, the layer ", channels_);
  autograd::BatchNormReduce reduce;
  if (is_training() && sync_ != nullptr) {
    reduce.statistics = [sync = sync_, name = layer_name_](std::vector<double>& sums,
                                                           int64_t& count) {
      sync->reduce_statistics(name, sums, count);
    };
    reduce.gradients = [sync = sync_, name = layer_name_](std::vector<double>& sums) {
      sync->reduce_gradients(name, sums);
    };
  }
  Tensor out = autograd::batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(),
                                    options_.momentum, options_.eps, reduce);
  // Counted after the forward succeeded, as PyTorch counts batches that updated the statistics.
  if (is_training()) num_batches_tracked_.data<int64_t>()[0] += 1;
  return out;
}

}  // namespace meshtrain::nn
