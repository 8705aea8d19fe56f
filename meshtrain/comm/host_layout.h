// Which ranks share a host. The "auto" backend chooses shm, tcp or hier from it and the hier
// backend builds its per-host and cross-host sub-groups from it. Every rank publishes its host id
// in the store and reads everyone else's, so every rank derives the same layout without a vote.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

struct HostLayout {
  std::vector<std::string> host_of;     // per rank
  std::vector<std::vector<int>> hosts;  // ranks of each host in rank order; hosts by lowest rank
  std::vector<int> host_index;          // per rank
  std::vector<int> local_rank;          // per rank: its position within its host

  int num_hosts() const { return static_cast<int>(hosts.size()); }
  // Hosts that hold more than one rank.
  int multi_rank_hosts() const;
  // True when every host holds the same number of ranks.
  bool uniform() const;
};

// This rank's host id: opts.host_id, else MESHTRAIN_HOST_ID, else the host name.
std::string local_host_id(const ProcessGroupOptions& opts);

// Publishes `mine` under <key_prefix><rank> and reads every rank's id (blocking on the store's
// timeout). Ids longer than 255 bytes are refused.
HostLayout exchange_host_layout(Store& store, const std::string& key_prefix, int rank, int size,
                                const std::string& mine);

// The layout from known ids (no store), for tests and for exchange_host_layout.
HostLayout make_host_layout(std::vector<std::string> host_of);

}  // namespace meshtrain::comm
