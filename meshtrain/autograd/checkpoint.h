// Activation checkpointing: a segment of the model (a transformer block) runs its forward
// without recording a graph, so none of its intermediate activations stay alive; only its
// inputs are kept. When backward reaches the segment it runs the forward again, this time
// recording, differentiates the recomputed graph and passes the gradients on. Memory for
// activations drops from every intermediate of every segment to the segment inputs plus one
// segment's intermediates at a time, for one extra forward of each segment.
//
// The recomputation must compute exactly what the first forward did:
// - random numbers: the states of the generators named in the options are saved before the
//   forward and restored for the recomputation (and put back afterwards, so the stream goes on
//   as if the segment had drawn once). Dropout in nn/ takes counter-based (seed, offset) pairs
//   instead of a generator, which a segment's function captures, so its masks repeat by
//   construction;
// - autocast: the type in force during the forward is put back for the recomputation.
//
// Parameters are inputs of the checkpoint node. Their gradients leave the recomputed graph
// through it (autograd::grad captures them) and reach their accumulators in the enclosing
// backward pass like any other gradient, so a parameter's gradient-ready hook fires once, when
// its gradient is final, also for a parameter used both inside and outside the segment. A
// segment that reads a parameter it was not given would accumulate that gradient during the
// recomputation instead, and fire its hooks early: give it every parameter it reads.
#pragma once

#include <functional>
#include <vector>

#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

struct CheckpointOptions {
  // Generators `fn` draws from; they must outlive the backward pass.
  std::vector<Generator*> generators;
};

// Returns fn(inputs), with a graph that recomputes fn during backward. `params` are the tensors
// requiring grad that fn reads besides `inputs` (a module's parameters).
std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, CheckpointOptions options = {});

}  // namespace meshtrain::autograd
