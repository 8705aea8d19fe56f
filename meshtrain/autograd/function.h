// User-defined differentiable functions: subclass Function, write forward (run without
// recording) and backward, and call Function::apply. Tensor-parallel identity/all-reduce pairs,
// pipeline send/recv and activation checkpointing are built this way.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

class Function {
 public:
  virtual ~Function() = default;
  // Runs with gradient recording off. Keep what backward needs in members.
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  // One gradient per forward output in; one per forward input out (undefined = no gradient).
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;
  virtual std::string name() const { return "Function"; }

  // Runs forward and, when an input requires grad, links the outputs into the graph.
  static std::vector<Tensor> apply(std::shared_ptr<Function> fn, const std::vector<Tensor>& inputs);
};

}  // namespace meshtrain::autograd
