// GPT as the engine sees it: a ModelSource that builds the whole GPT (nn::GPT, or this rank's
// tensor-parallel parts, tp::TpGPT) or a range of its ModelStack layers (models::GPTStage, or
// tp::TpGPTStage), and the TrainModel adapters the engine trains through.
#pragma once

#include <memory>
#include <mutex>

#include "meshtrain/models/gpt_stack.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/model_source.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"

namespace meshtrain::models {

// The whole GPT on one rank.
class GptModel : public parallel::TrainModel {
 public:
  explicit GptModel(std::shared_ptr<nn::GPT> gpt) : gpt_(std::move(gpt)) {}
  nn::Module& module() override { return *gpt_; }
  const nn::Module& module() const override { return *gpt_; }
  Tensor loss(const parallel::Batch& b, uint64_t dropout_seed) const override {
    return gpt_->loss(b.inputs, b.targets, dropout_seed);
  }
  size_t num_layers() const override { return gpt_->num_blocks(); }
  nn::NamedTensors layer_parameters(size_t layer) const override {
    return gpt_->block_parameters(layer);
  }
  void set_layer_hooks(parallel::LayerHooks hooks) override;
  void set_replicas(const comm::ProcessGroupPtr& replicas) override {
    if (gpt_->moe_context()) gpt_->moe_context()->set_replicas(replicas ? replicas->size() : 1);
  }
  void set_loss_grad(float grad) override {
    if (gpt_->moe_context()) gpt_->moe_context()->set_loss_grad(grad);
  }
  std::vector<float> take_step_counters() override {
    return gpt_->moe_context() ? gpt_->moe_context()->take_counters() : std::vector<float>{};
  }
  void adapt_to_step(const std::vector<float>& summed) override {
    if (gpt_->moe_context()) gpt_->moe_context()->adapt(summed);
  }
  nlohmann::json step_metrics(const std::vector<float>& summed) const override {
    return gpt_->moe_context() ? nlohmann::json{{"moe", gpt_->moe_context()->summarize(summed)}}
                               : nlohmann::json();
  }
  nn::GPT& gpt() { return *gpt_; }

 private:
  std::shared_ptr<nn::GPT> gpt_;
};

// This rank's tensor-parallel parts of GPT.
class TpGptModel : public parallel::TrainModel {
 public:
  explicit TpGptModel(std::shared_ptr<parallel::tp::TpGPT> gpt) : gpt_(std::move(gpt)) {}
  nn::Module& module() override { return *gpt_; }
  const nn::Module& module() const override { return *gpt_; }
  Tensor loss(const parallel::Batch& b, uint64_t dropout_seed) const override {
    return gpt_->loss(b.inputs, b.targets, dropout_seed);
  }
  // Sequence parallelism left each replicated parameter's gradient in parts over tp.
  void complete_gradients() const override { gpt_->reduce_sequence_parallel_grads(); }
  nn::NamedTensors whole_parameters() const override;
  std::string describe() const override;

 private:
  std::shared_ptr<parallel::tp::TpGPT> gpt_;
};

class GptSource : public parallel::ModelSource {
 public:
  explicit GptSource(const nn::GPTConfig& config);

  std::shared_ptr<parallel::TrainModel> build(const parallel::tp::TpContext& tp) const override;
  const ModelStack& stack() const override { return stack_; }
  std::unique_ptr<StageModule> build_stage(size_t begin, size_t end,
                                           const parallel::tp::TpContext& tp) const override;
  std::vector<nn::ParamInfo> param_infos() const override;
  size_t layer_of(const std::string& name) const override;
  int64_t num_parameters() const override;
  const nn::GPTConfig& config() const { return config_; }

 private:
  nn::GPTConfig config_;
  GPTStack stack_;
  mutable std::once_flag infos_once_;
  mutable std::vector<nn::ParamInfo> infos_;
};

}  // namespace meshtrain::models
