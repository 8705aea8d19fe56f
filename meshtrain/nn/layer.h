// A module with one input and one output. The GPT's blocks are written against it so that the
// same attention and MLP run on plain linears or on tensor-parallel column/row halves, whichever
// the layer factory (gpt_layers.h) made.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Layer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
};

}  // namespace meshtrain::nn
