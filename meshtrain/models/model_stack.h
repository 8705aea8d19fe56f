// ModelStack: a model as an ordered list of named layers with a cost, from which any contiguous
// range can be built alone. It is what lets pipeline parallelism cut a model into stages (and
// interleaved chunks) without the model knowing about pipelines: partition() balances a cost
// over the pieces (by default the compute a stage waits on: forward and backward FLOPs per token;
// or parameter counts), build() makes one piece whose parameters are exactly the same-named
// parameters of the whole model (their initial values are keyed by name, nn/param_info.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/nn/module.h"

namespace meshtrain::models {

struct LayerSpec {
  std::string name;    // "embedding", "h.3", "head"
  int64_t params = 0;  // parameters it holds
  int64_t flops = 0;   // forward plus backward floating-point operations per token
};

// What partition() balances over the stages (parallel.partition).
enum class PartitionCost { flops, params };
const char* partition_cost_name(PartitionCost cost);
// "flops" or "params"; ValueError naming parallel.partition otherwise.
PartitionCost parse_partition_cost(const std::string& name);
int64_t layer_cost(const LayerSpec& layer, PartitionCost cost);

// Layers [begin, end) of a stack.
struct LayerRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const LayerRange&) const = default;
};

// One built range of a stack.
class StageModule : public nn::Module {
 public:
  // The first stage reads the micro-batch's inputs, the others the previous stage's output. The
  // last stage returns the mean loss against `targets`; the others return the activation the next
  // stage reads, and ignore `targets`.
  virtual Tensor forward(const Tensor& input, const Tensor& targets,
                         uint64_t dropout_seed) const = 0;
  virtual bool is_first() const = 0;
  virtual bool is_last() const = 0;
  // What this stage reads and what it sends on for a micro-batch of B sequences of T tokens (the
  // last stage's output is the scalar loss): fixed at set-up, so a pipeline allocates its
  // receive buffers without a shape exchange every step.
  virtual Shape input_shape(int64_t B, int64_t T) const = 0;
  virtual Shape output_shape(int64_t B, int64_t T) const = 0;
};

class ModelStack {
 public:
  virtual ~ModelStack() = default;
  virtual const std::vector<LayerSpec>& layers() const = 0;
  // Cuts the layers into stages x chunks contiguous non-empty ranges, range k for virtual stage k
  // (chunk c of stage p is range c * stages + p), minimising the largest range's cost. The first
  // range starts with the first layer and the last ends with the last, whatever the costs.
  // ValueError naming parallel.pp and parallel.virtual_stages when there are more ranges than
  // layers.
  std::vector<LayerRange> partition(int stages, int chunks = 1,
                                    PartitionCost cost = PartitionCost::flops) const;
  // Builds layers [begin, end) alone.
  virtual std::unique_ptr<StageModule> build(size_t begin, size_t end) const = 0;
};

// The contiguous split of `costs` into `parts` non-empty ranges with the smallest largest sum;
// among equals, the last range starts as early as possible, then the one before it, and so on.
// Requires 1 <= parts <= costs.size().
std::vector<LayerRange> balanced_ranges(const std::vector<int64_t>& costs, int parts);

}  // namespace meshtrain::models
