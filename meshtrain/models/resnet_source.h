// The ResNet (nn/resnet.h) as a model the engine trains: images [N, C, H, W] (f32) and labels [N]
// (i32) per micro-batch. Data parallelism and ZeRO-1/2/3 apply (ZeRO-3 gathers it as one unit);
// a pipeline or tensor-parallel split of it is not available yet (the plan check refuses them).
// With sync_batch_norm its BatchNorm2d layers normalise over every data-parallel replica's batch
// (parallel/sync_batch_norm.h) once the engine gives it the replicas' group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/nn/top1.h"
#include "meshtrain/parallel/model_source.h"

namespace meshtrain::models {

class ResNetModel : public parallel::TrainModel {
 public:
  ResNetModel(std::shared_ptr<nn::ResNet> net, bool sync_batch_norm)
      : net_(std::move(net)), sync_batch_norm_(sync_batch_norm) {}
  nn::Module& module() override { return *net_; }
  const nn::Module& module() const override { return *net_; }
  Tensor loss(const parallel::Batch& b, uint64_t /*dropout_seed*/) const override {
    return net_->loss(b.inputs, b.targets);
  }
  Tensor evaluate(const parallel::Batch& b, int64_t& correct) const override {
    const Tensor logits = net_->forward(b.inputs);
    correct = nn::count_top1(logits, b.targets);
    return autograd::cross_entropy(logits, b.targets, -1);
  }
  void set_replicas(const comm::ProcessGroupPtr& replicas) override;
  nn::ResNet& net() { return *net_; }

 private:
  std::shared_ptr<nn::ResNet> net_;
  bool sync_batch_norm_;
};

// The whole network as one layer: what a pipeline would cut is not defined yet.
class ResNetStack : public ModelStack {
 public:
  explicit ResNetStack(int64_t params) : layers_{{"resnet", params, 0}} {}
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  std::unique_ptr<StageModule> build(size_t begin, size_t end) const override;

 private:
  std::vector<LayerSpec> layers_;
};

class ResNetSource : public parallel::ModelSource {
 public:
  ResNetSource(nn::ResNetConfig config, bool sync_batch_norm);

  std::shared_ptr<parallel::TrainModel> build(const parallel::tp::TpContext& tp) const override;
  const ModelStack& stack() const override { return stack_; }
  std::unique_ptr<StageModule> build_stage(size_t begin, size_t end,
                                           const parallel::tp::TpContext& tp) const override;
  std::vector<nn::ParamInfo> param_infos() const override { return infos_; }
  size_t layer_of(const std::string& /*name*/) const override { return 0; }
  int64_t num_parameters() const override { return params_; }

 private:
  nn::ResNetConfig config_;
  bool sync_batch_norm_;
  std::vector<nn::ParamInfo> infos_;
  int64_t params_ = 0;
  ResNetStack stack_;
};

}  // namespace meshtrain::models
