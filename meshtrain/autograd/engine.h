// The backward engine: walks the graph from the roots in reverse creation order, summing the
// gradients that reach each node before running it, so that every node (and every leaf's
// gradient-ready hook) runs exactly once, as soon as all its inputs are final. A gradient has
// its tensor's type: an op that returns another is converted (autocast's half activations get
// half gradients, summed in f32 where several meet, as under PyTorch's autocast).
#pragma once

#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

struct BackwardOptions {
  bool retain_graph = false;
};

// Computes gradients of `root` (a scalar unless `grad` is given) into the .grad of every leaf
// that requires grad, accumulating with what is already there.
void backward(const Tensor& root, const Tensor& grad = Tensor(), BackwardOptions options = {});
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              BackwardOptions options = {});

// Gradients of `roots` (weighted by `grads`, as in backward) with respect to `inputs`, returned
// one per input (undefined where no gradient reaches it) instead of accumulated: the inputs'
// .grad stays as it is, their gradient-ready hooks do not fire, and nothing that produced an
// input is visited. Activation checkpointing differentiates its recomputed segment this way and
// hands the parameters' gradients to the enclosing backward pass, whose accumulators and hooks
// then run once, with the final gradient.
std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs, BackwardOptions options = {});

// Whether `saved`, a tensor a node saved for its backward, may be overwritten by that backward
// while it runs: the pass frees each node's saved tensors after running it (no retain_graph),
// and nothing else refers to the memory (no other tensor or view, not borrowed). `saved` must
// be the node's own handle (a detach() it made): copies of one handle share a single count, so
// this cannot see them (why a gradient, which an addition hands to two nodes, is never asked). A
// backward that needs a buffer of the saved tensor's size can then write into it instead of
// allocating one more (the cross-entropy's gradient in its logits: at a GPT vocabulary the largest
// buffer of a step). False outside a backward pass.
bool may_overwrite_saved(const Tensor& saved);

// For the node whose backward is running: the gradient summed so far for its input `input` (the
// pending gradient of that input's edge), where the backward may add its own gradient for it in
// place and then return an undefined gradient for it: an f32 tensor of `shape` on `device` that
// the pass holds alone (a layer norm whose input is also a residual stream's: the stream's
// gradient arrived first, and one pass that writes the sum replaces a write and a separate sum).
// Undefined otherwise, and outside a backward pass.
Tensor pending_input_gradient(size_t input, const Shape& shape, Device device);

// The value of a scalar gradient a backward receives, on the host: without a wait for the device
// where the host knows it (a seed of the running pass given on the host, such as a trainer's loss
// scale, or the default seed 1, moved to the device unchanged; a host tensor), read back from
// the device otherwise. For an op that folds the incoming gradient into a product's alpha.
float scalar_gradient_value(const Tensor& grad);

// For the node whose backward is running: hands the pass `half`, the gradient `grad` of its input
// `input` rounded to a half type, where `grad` is either the pending gradient
// pending_input_gradient returned and this backward has just finished summing into, or the
// gradient it returns for that input: the node that receives the gradient (which rounds it for
// half products anyway) takes the copy instead of a cast of its own, so the gradient is rounded
// where it is written. The copy is dropped if anything adds to the gradient first (a returned
// gradient that is summed with another, or converted, never gets it).
void offer_half_gradient(size_t input, const Tensor& grad, Tensor half);
// For the node whose backward is running: the copy in `dtype` of the gradient of its output
// `slot` that the node which last summed into it offered (offer_half_gradient), the same values
// rounded; undefined where there is none (or outside a backward pass).
Tensor incoming_half_gradient(size_t slot, DType dtype);

// Registers a hook that fires once per backward pass, right after this leaf's gradient is final.
void register_grad_ready_hook(Tensor& leaf, GradReadyHook hook);
void clear_grad_ready_hooks(Tensor& leaf);

}  // namespace meshtrain::autograd
