// One MoE forward's exchange of tokens between the expert-parallel ranks: which rows each rank
// sends to each of another rank's experts, learnt once by a collective count exchange, then used
// to carry the rows to the experts and their outputs back (and, in backward, their gradients
// the other way).
//
// Layouts. "By expert": this rank's kept assignments, one [load(e), C] tensor per expert of the
// whole layer (moe_dispatch's order). "Local": one tensor per expert held here, its rows from
// every rank of the exchange in rank order, each rank's rows in that rank's routing order. On
// the wire a rank's blocks for a peer are that peer's experts in order.
//
// Rows on a device travel through host memory: copied to the host, exchanged over the exchange's
// (host) group, and copied back to `device`.
#pragma once

#include <memory>
#include <vector>

#include "meshtrain/nn/expert_exchange.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

class ExpertRoute {
 public:
  // Collective over the exchange: `loads[e]` rows of C channels go to expert e. The rows, and
  // what the route returns, are on `device`.
  ExpertRoute(std::shared_ptr<ExpertExchange> exchange, const std::vector<int64_t>& loads,
              int64_t channels, Device device = Device::cpu());

  int64_t local_experts() const { return local_; }
  // Rows expert j of this rank receives from rank s.
  int64_t received(int s, int64_t j) const {
    return recv_[static_cast<size_t>(s) * static_cast<size_t>(local_) + static_cast<size_t>(j)];
  }

  // By expert -> local (undefined tensors count as zeros of their shape).
  std::vector<Tensor> to_experts(const std::vector<Tensor>& by_expert) const;
  // Local -> by expert.
  std::vector<Tensor> to_tokens(const std::vector<Tensor>& local) const;

 private:
  std::shared_ptr<ExpertExchange> exchange_;
  int ranks_ = 1;
  int64_t local_ = 0;
  int64_t channels_ = 0;
  Device device_;
  std::vector<int64_t> loads_;  // per expert of the layer, sent from here
  std::vector<int64_t> recv_;   // [source rank][local expert]
};

}  // namespace meshtrain::nn
