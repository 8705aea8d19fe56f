#include "meshtrain/parallel/param_server/ps_links.h"

#include "meshtrain/parallel/param_server/ps_messages.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

comm::ProcessGroupPtr make_link(const PsLinkOptions& o, int worker, int server, int64_t generation,
                                bool server_side) {
  MT_CHECK(o.store != nullptr, "a parameter-server link needs the job's store");
  comm::ProcessGroupOptions po = o.group;
  po.name = detail::str_cat("ps/w", worker, "/s", server, "/", generation);
  // A push chunk at most per staging buffer: the segment of a pair stays small however many
  // pairs a host has.
  po.shm_chunk_bytes = static_cast<size_t>(kPsChunkElements) * 4;
  // A link only carries pushes and replies, and breaks whenever a worker dies: its last few
  // messages say enough when it does.
  po.flight_recorder_size = 4;
  po.shm_budget.planned_groups.clear();
  po.shm_budget.job_bytes = 0;
  return comm::make_process_group(o.backend == "tcp" ? "tcp" : "auto", o.store, server_side ? 1 : 0,
                                  2, po);
}

}  // namespace

std::vector<PsPeer> job_peers_of_worker(const comm::ProcessGroupPtr& job, int workers,
                                        int servers) {
  std::vector<PsPeer> out;
  for (int s = 0; s < servers; ++s) out.push_back({job, workers + s});
  return out;
}

std::vector<PsPeer> job_peers_of_server(const comm::ProcessGroupPtr& job, int workers) {
  std::vector<PsPeer> out;
  for (int w = 0; w < workers; ++w) out.push_back({job, w});
  return out;
}

std::vector<PsPeer> make_worker_links(const PsLinkOptions& options, int servers, int worker,
                                      int64_t generation) {
  std::vector<PsPeer> out;
  for (int s = 0; s < servers; ++s)
    out.push_back({make_link(options, worker, s, generation, false), 1});
  return out;
}

std::vector<PsPeer> make_server_links(const PsLinkOptions& options, int workers, int server) {
  std::vector<PsPeer> out;
  for (int w = 0; w < workers; ++w) out.push_back({make_link(options, w, server, 0, true), 0});
  return out;
}

PsPeer make_server_link(const PsLinkOptions& options, int worker, int server, int64_t generation) {
  return {make_link(options, worker, server, generation, true), 0};
}

int64_t next_link_generation(comm::Store& store, int worker) {
  return store.add(detail::str_cat("ps/w", worker, "/generation"), 1);
}

}  // namespace meshtrain::parallel
