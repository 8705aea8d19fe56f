// SyncBatchNorm: the BatchNorm2d layers of the data-parallel replicas normalise over the union of
// their batches, as one layer would over the global batch. In the forward of each layer the
// replicas exchange their per-channel sums of x and x^2 and their element counts; in its backward
// the per-channel sums of dy and dy * xhat. Each exchange is an all-gather whose pieces are added
// in rank order (in double), so every replica gets the same totals bit for bit.
//
// Every exchange is announced first: the replicas all-gather the layer's name, the pass and a call
// counter, so a replica that skipped a layer or took another branch (a known way to hang
// SyncBatchNorm in other frameworks) is a ValueError naming both ranks and layers on every replica,
// and a replica that stops calling is a CommError naming the layer once dist.timeout_s passes.
// Evaluation does not exchange anything: it uses the running statistics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/batch_norm_sync.h"

namespace meshtrain::parallel {

class SyncBatchNorm : public nn::BatchNormSync {
 public:
  // `replicas`: the ranks whose batches form one batch (the data-parallel group); null or one
  // rank: nothing to exchange.
  explicit SyncBatchNorm(comm::ProcessGroupPtr replicas);

  void reduce_statistics(const std::string& layer, std::vector<double>& sums,
                         int64_t& count) override;
  void reduce_gradients(const std::string& layer, std::vector<double>& sums) override;

  // Exchanges so far (forward and backward), for tests.
  uint64_t exchanges() const { return calls_; }

 private:
  enum class Pass : uint8_t { forward, backward };
  void exchange(const std::string& layer, Pass pass, std::vector<double>& values);
  void announce(const std::string& layer, Pass pass, size_t values);

  comm::ProcessGroupPtr replicas_;
  uint64_t calls_ = 0;
};

}  // namespace meshtrain::parallel
