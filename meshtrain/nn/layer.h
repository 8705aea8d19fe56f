// A module with one input and one output. The GPT's blocks are written against it so that the
// same attention and MLP run on plain linears or on tensor-parallel column/row halves, whichever
// the layer factory (gpt_layers.h) made.
#pragma once

#include "meshtrain/nn/module.h"

namespace meshtrain::nn {

class Layer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  // Whether forward also takes its input in autocast's half type, because its first op is a
  // product that would round it anyway: a producer may then hand over its output rounded, in 2
  // bytes an element, instead of an f32 one to be rounded in another pass.
  virtual bool takes_half_input() const { return false; }
};

}  // namespace meshtrain::nn
