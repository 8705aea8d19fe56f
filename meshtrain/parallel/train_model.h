// TrainModel: what the engine trains, whatever the model is. The engine never names a model type:
// it asks this interface for the loss of a micro-batch, the parameters (through the module, with
// their ParamInfo), and the layers ZeRO-3 gathers one at a time. A model split over tensor-
// parallel ranks is still one TrainModel per rank: its parameters are this rank's parts and its
// loss the same value on every rank of the split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/batch.h"

namespace meshtrain::parallel {

// Called around each layer's forward: ZeRO-3 gathers a layer's parameters in `before` and frees
// them in `after`, which may return its input wrapped in an autograd Function whose backward
// gathers them again. Empty functions: nothing is called.
struct LayerHooks {
  std::function<void(size_t)> before;
  std::function<Tensor(size_t, const Tensor&)> after;
};

class TrainModel {
 public:
  virtual ~TrainModel() = default;

  virtual nn::Module& module() = 0;
  virtual const nn::Module& module() const = 0;
  // Mean loss of one micro-batch; `dropout_seed` picks the dropout masks.
  virtual Tensor loss(const Batch& batch, uint64_t dropout_seed) const = 0;
  // Evaluation: the loss of `batch` and, for a classifier, the number of its samples whose
  // highest logit is their label (-1: the model does not classify).
  virtual Tensor evaluate(const Batch& batch, int64_t& correct) const {
    correct = -1;
    return loss(batch, 0);
  }
  // The data-parallel replicas' group (null: one replica), given once before the first step, for
  // a model whose layers exchange values across replicas in forward and backward
  // (SyncBatchNorm). Its collectives then run on that group in the order of the model's layers.
  virtual void set_replicas(const comm::ProcessGroupPtr& /*replicas*/) {}
  // After backward and the data-parallel reduction: completes gradients the model leaves in parts
  // over a group of its own (sequence parallelism's replicated parameters). Collective there.
  virtual void complete_gradients() const {}
  // The gradient the backward starts this micro-batch's loss from (the loss scale over the
  // micro-batches), set before its forward: losses a model adds inside its layers (the experts'
  // auxiliary losses) join the objective at that scale.
  virtual void set_loss_grad(float /*grad*/) {}
  // Additive counters of the training forwards since the last call (the same number of them on
  // every replica), then zeroed; empty when the model keeps none.
  virtual std::vector<float> take_step_counters() { return {}; }
  // The step's metrics from take_step_counters() summed over the replicas.
  virtual nlohmann::json step_metrics(const std::vector<float>& /*summed*/) const { return {}; }
  // After the step's metrics, with the same sums (equal on every replica): a model that steers
  // itself by them (the experts' balancing biases) updates here.
  virtual void adapt_to_step(const std::vector<float>& /*summed*/) {}

  // The layers ZeRO-3 may gather one at a time (0: the model is one unit), the parameters of
  // each (named as in module().named_parameters()), and the hooks to call around their forward.
  virtual size_t num_layers() const { return 0; }
  virtual nn::NamedTensors layer_parameters(size_t /*layer*/) const { return {}; }
  virtual void set_layer_hooks(LayerHooks /*hooks*/) {}

  // Every parameter's whole value in tensors of their own (parts gathered over the model's own
  // groups: collective there), in the whole model's names.
  virtual nn::NamedTensors whole_parameters() const;
  // The model's own split for the start-up line ("tensor parallelism over 2 ranks"); empty when
  // it is not split.
  virtual std::string describe() const { return ""; }
};

}  // namespace meshtrain::parallel
