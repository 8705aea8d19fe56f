// Gossip averaging as the engine's ParamSync: after each replica's own update, its parameters
// are averaged with its neighbours' in the gossip graph (gossip_graph.h), point to point over the
// data-parallel group, with no server and no all-reduce. All parameters travel as one flat f32
// buffer, one message to each peer; every send and receive of the round is posted before any is
// waited for, so neighbours that send to each other cannot wait on each other.
//
// The replicas differ between steps by design (they only draw together), so there are no
// identical replicas to compare; evaluation and checkpoints take the first replica's values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/comm_buffer.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/gossip/gossip_graph.h"
#include "meshtrain/parallel/parts/param_sync.h"

namespace meshtrain::parallel {

class GossipAverage final : public ParamSync {
 public:
  // `params`: this replica's parameters (f32, on the CPU or a device: a device's go through host
  // memory, averaged with the CPU's arithmetic); `replicas`: the data-parallel group (host).
  GossipAverage(const nn::NamedTensors& params, comm::ProcessGroupPtr replicas, GossipGraph graph);

  // One gossip round (collective over the neighbours of this round).
  void after_update() override;
  bool replicas_equal() const override { return false; }
  std::string describe() const override;
  size_t exchange_bytes() const override;
  // Rounds done so far (the exponential graph's peer depends on it).
  int64_t rounds() const { return round_; }

 private:
  std::vector<Tensor> params_;  // each storage once (a tied parameter is one tensor)
  comm::ProcessGroupPtr group_;
  GossipGraph graph_;
  int64_t round_ = 0;
  size_t numel_ = 0;
  // This replica's parameters, flat, and one flat buffer per peer received from: communication
  // buffers, counted in the memory at rest as such.
  std::unique_ptr<comm::CommBuffer> mine_;
  std::vector<std::unique_ptr<comm::CommBuffer>> theirs_;
};

}  // namespace meshtrain::parallel
