// ModelSource: how the engine builds the model it trains, for any layout. A model registers one
// source (models/); the engine builds from it the whole model for one rank (its tensor-parallel
// parts when tp > 1, the plain model when tp = 1) or, for a pipeline, the layers [begin, end) of
// its ModelStack that a stage holds. Every build draws the same keyed initial values
// (nn/param_info.h), so a stage, a tp part and the whole model agree without a broadcast.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/models/model_stack.h"
#include "meshtrain/nn/param_info.h"
#include "meshtrain/parallel/tensor_parallel/tp_context.h"
#include "meshtrain/parallel/train_model.h"

namespace meshtrain::parallel {

class ModelSource {
 public:
  virtual ~ModelSource() = default;

  // The model for one rank: the plain model when tp.size() == 1, this rank's tensor-parallel
  // parts otherwise.
  virtual std::shared_ptr<TrainModel> build(const tp::TpContext& tp) const = 0;
  // The model as a list of layers with costs, which pipelines cut into stages.
  virtual const models::ModelStack& stack() const = 0;
  // Layers [begin, end) of stack(), split over `tp` as build() splits them.
  virtual std::unique_ptr<models::StageModule> build_stage(size_t begin, size_t end,
                                                           const tp::TpContext& tp) const = 0;
  // The whole model's parameters in its own order (names and whole shapes).
  virtual std::vector<nn::ParamInfo> param_infos() const = 0;
  // The layer of stack() whose stage owns parameter `name` (a tied copy's owner is the first).
  virtual size_t layer_of(const std::string& name) const = 0;
  // The whole model's parameter count (a tied parameter once).
  virtual int64_t num_parameters() const = 0;
};

}  // namespace meshtrain::parallel
