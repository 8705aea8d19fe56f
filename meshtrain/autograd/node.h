// A node of the reverse-mode graph. Each differentiable op that produced a tensor requiring
// grad records one Node holding what its backward needs; edges point to the nodes that produced
// its inputs (or to the gradient accumulator of a leaf parameter).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which of fn's outputs the gradient flows into
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads[i] is the gradient of the i-th forward output (zeros where none arrived). Returns one
  // gradient per next edge; an undefined tensor means "no gradient for that input".
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors once backward is done with the node (unless the graph is retained).
  virtual void release() {}

  std::vector<Edge>& next_edges() { return next_edges_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  uint32_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(uint32_t n) { num_outputs_ = n; }
  // Shapes of the forward outputs, to materialise zero gradients for outputs that got none.
  std::vector<Shape>& output_shapes() { return output_shapes_; }
  std::vector<Device>& output_devices() { return output_devices_; }
  // Types of the forward outputs: a gradient has its tensor's type (autocast's half activations
  // get half gradients, as under PyTorch's). Empty where unknown (no conversion then).
  std::vector<DType>& output_dtypes() { return output_dtypes_; }

 private:
  std::vector<Edge> next_edges_;
  uint64_t sequence_nr_;
  uint32_t num_outputs_ = 1;
  std::vector<Shape> output_shapes_;
  std::vector<Device> output_devices_;
  std::vector<DType> output_dtypes_;
};

// Accumulates the incoming gradient into a leaf tensor's .grad and then fires the leaf's
// gradient-ready hooks: the engine runs it only after every contribution of this backward pass
// has arrived, so the hooks see the final gradient.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;
};

// A node whose backward is a closure; the closure owns the saved tensors.
class LambdaNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(std::vector<Tensor>&&)>;
  LambdaNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return name_; }
  void release() override { backward_ = nullptr; }

 private:
  std::string name_;
  Backward backward_;
};

// The edge through which a gradient for `t` flows: its grad_fn, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);

// True when any input requires grad and grad mode is on.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Connects `outputs` to a new node whose next edges are the gradient edges of `inputs`.
// Returns the node (already configured). Call only when any_requires_grad(inputs).
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs);

// Builds a LambdaNode for a single-output op when any input requires grad (no-op otherwise).
void record(const std::string& name, const std::vector<Tensor>& inputs, Tensor& output,
            LambdaNode::Backward backward);

}  // namespace meshtrain::autograd
