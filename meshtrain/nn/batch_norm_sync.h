// The seam between a BatchNorm2d layer and synchronised batch normalisation: the layer computes
// per-channel sums, an implementation of this interface (SyncBatchNorm in parallel/) combines them
// over the data-parallel group, so that nn/ needs no communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::nn {

// How a BatchNorm2d layer in training mode combines its statistics with other ranks'. Without one,
// a layer normalises over its own batch; SyncBatchNorm (parallel/) sums them over the
// data-parallel group. Evaluation never calls it.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // Forward: sums = [sum of x per channel (C values), sum of x^2 per channel (C values)] and
  // count = the elements per channel (N*H*W) of this rank; replaced in place by the totals.
  virtual void reduce_statistics(const std::string& layer, std::vector<double>& sums,
                                 int64_t& count) = 0;
  // Backward: sums = [sum of dy per channel, sum of dy*xhat per channel] of this rank; replaced
  // in place by the totals.
  virtual void reduce_gradients(const std::string& layer, std::vector<double>& sums) = 0;
};

}  // namespace meshtrain::nn
