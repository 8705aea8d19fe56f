// The keys a meshrun job's agents keep in the rendezvous store, named in one place. At the
// store's root, under rdzv/<rdzv_id>/: `stopped` (why the job was stopped, by signal) and one
// prefix per attempt (elastic: per round), under which:
//   node/<K>     node K joined (its local worker count)   layout  the job's layout, by node 0
//   failed       the first failure, any node              rescale a node waits to join (elastic)
//   alive/<K>    node K's heartbeat counter                done/<K> node K's workers all ended
// The elastic rounds' own keys are elastic_rendezvous.h's.
#pragma once

#include <string>
#include <string_view>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime::job_keys {

inline std::string stopped(std::string_view rdzv_id) {
  return detail::str_cat("rdzv/", rdzv_id, "/stopped");
}
inline std::string attempt_prefix(std::string_view rdzv_id, int attempt) {
  return detail::str_cat("rdzv/", rdzv_id, "/", attempt);
}

// Under an attempt's prefix.
inline std::string node(int node_rank) {
  return detail::str_cat("node/", node_rank);
}
inline std::string alive(int node_rank) {
  return detail::str_cat("alive/", node_rank);
}
inline std::string done(int node_rank) {
  return detail::str_cat("done/", node_rank);
}
inline const std::string kLayout = "layout";

// Under a run's prefix (run/<restart_count>, the workers' own): set by a worker that can be
// replaced alone (an asynchronous parameter-server worker), read by its agent when it fails.
inline std::string run_prefix(int restart_count) {
  return detail::str_cat("run/", restart_count);
}
inline std::string replaceable(int rank) {
  return detail::str_cat("ps/replaceable/", rank);
}
inline const std::string kFailed = "failed";
inline const std::string kRescale = "rescale";

}  // namespace meshtrain::runtime::job_keys
