// PsLinks: the channels a parameter-server job's workers and servers talk on. In sync mode every
// channel is the job's own group (the workers meet at every step anyway). In async and ssp mode
// each (worker, server) pair has a two-rank group of its own (shm on one host, tcp across hosts),
// made through the job's store: a worker that dies breaks only its own channels, and the process
// that replaces it makes new ones, named by a generation the store counts per worker, while the
// other workers go on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/store.h"

namespace meshtrain::parallel {

// One end of a channel: the group and the other side's rank in it.
struct PsPeer {
  comm::ProcessGroupPtr group;
  int rank = 0;
};

struct PsLinkOptions {
  std::shared_ptr<comm::Store> store;
  // The job's backend: "tcp" keeps every link on tcp, anything else lets each pair choose
  // (shm on one host, tcp across hosts).
  std::string backend;
  // Timeout, token, addresses and the host's ranks and cores, as the job's group has them.
  comm::ProcessGroupOptions group;
};

// The job's group as every channel: a worker's peers are the servers, a server's the workers.
// The job's ranks are its `workers` first, then its `servers`.
std::vector<PsPeer> job_peers_of_worker(const comm::ProcessGroupPtr& job, int workers, int servers);
std::vector<PsPeer> job_peers_of_server(const comm::ProcessGroupPtr& job, int workers);

// Worker `worker`'s links to every server, of the given generation (0 at the job's start). The
// workers make theirs in server order and the servers in worker order, so no two wait on each
// other.
std::vector<PsPeer> make_worker_links(const PsLinkOptions& options, int servers, int worker,
                                      int64_t generation);
// Server `server`'s links to every worker, of generation 0.
std::vector<PsPeer> make_server_links(const PsLinkOptions& options, int workers, int server);
// The link of `server` to the process that replaced `worker`, of `generation` (waits for it up to
// the group's timeout).
PsPeer make_server_link(const PsLinkOptions& options, int worker, int server, int64_t generation);
// A replacement's generation for `worker`: one more than the last (the store counts them).
int64_t next_link_generation(comm::Store& store, int worker);

}  // namespace meshtrain::parallel
