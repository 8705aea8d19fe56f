// The MLP classifier (nn::MLPClassifier) as a model the engine trains: a second model family
// beside GPT, on the same seams. Its ModelStack has one layer per Linear (the GELU after it
// belongs to it), so a pipeline cuts it anywhere; a micro-batch is features [N, F] (f32) and
// labels [N] (i32). Every build makes the whole classifier from its seed and keeps the layers it
// needs, so a stage holds exactly the whole model's values under the whole model's names.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/mlp_classifier.h"
#include "meshtrain/nn/top1.h"
#include "meshtrain/parallel/model_source.h"

namespace meshtrain::models {

class MlpModel : public parallel::TrainModel {
 public:
  explicit MlpModel(std::shared_ptr<nn::MLPClassifier> mlp) : mlp_(std::move(mlp)) {}
  nn::Module& module() override { return *mlp_; }
  const nn::Module& module() const override { return *mlp_; }
  Tensor loss(const parallel::Batch& b, uint64_t /*dropout_seed*/) const override {
    return mlp_->loss(b.inputs, b.targets);
  }
  Tensor evaluate(const parallel::Batch& b, int64_t& correct) const override {
    const Tensor logits = mlp_->forward(b.inputs);
    correct = nn::count_top1(logits, b.targets);
    return autograd::cross_entropy(logits, b.targets, -1);
  }
  nn::MLPClassifier& mlp() { return *mlp_; }

 private:
  std::shared_ptr<nn::MLPClassifier> mlp_;
};

class MlpStack : public ModelStack {
 public:
  // sizes = {inputs, hidden..., classes}, as nn::MLPClassifier's.
  MlpStack(std::vector<int64_t> sizes, uint64_t seed);
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  std::unique_ptr<StageModule> build(size_t begin, size_t end) const override;

 private:
  std::vector<int64_t> sizes_;
  uint64_t seed_;
  std::vector<LayerSpec> layers_;
};

class MlpSource : public parallel::ModelSource {
 public:
  MlpSource(std::vector<int64_t> sizes, uint64_t seed);

  // The classifier is not split over tensor-parallel ranks: tp must be 1.
  std::shared_ptr<parallel::TrainModel> build(const parallel::tp::TpContext& tp) const override;
  const ModelStack& stack() const override { return stack_; }
  std::unique_ptr<StageModule> build_stage(size_t begin, size_t end,
                                           const parallel::tp::TpContext& tp) const override;
  std::vector<nn::ParamInfo> param_infos() const override;
  size_t layer_of(const std::string& name) const override;
  int64_t num_parameters() const override;

 private:
  std::vector<int64_t> sizes_;
  uint64_t seed_;
  MlpStack stack_;
};

}  // namespace meshtrain::models
