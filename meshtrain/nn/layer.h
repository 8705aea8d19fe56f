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
  // Whether forward_as can also give its output in autocast's half type (its last op is a product
  // that rounds once on the way out), for a consumer that reads its input rounded anyway.
  virtual bool gives_half_output() const { return false; }
  // forward with the output in out_type: f32, or autocast's type where gives_half_output().
  virtual Tensor forward_as(const Tensor& x, DType out_type) const;
  // residual + forward(x), f32: a layer whose output joins a residual stream. A plain linear makes
  // the sum where its product is written (autograd::linear_residual); others add.
  virtual Tensor forward_residual(const Tensor& residual, const Tensor& x) const;
};

}  // namespace meshtrain::nn
