// The per-node launcher agent behind `meshrun`. One agent runs on each node; node 0's agent hosts
// the rendezvous TcpStore. The agents meet in the store, agree on the job's layout (node order
// by node rank), then each starts its workers with the torchrun environment contract, forwards
// their output line by line, and supervises them: the first worker to fail stops every other
// worker (SIGTERM, then SIGKILL after the grace period) on every node, and its status becomes
// the launcher's. SIGINT/SIGTERM sent to the agent are forwarded the same way. A worker that
// hangs is not watched here: every collective has a deadline (dist.timeout_s), so its peers fail
// and that failure stops and restarts the group like any other.
//
// run() is an explicit sequence -- set up the store, then for each attempt: rendezvous, start,
// monitor -- with the restart policy between attempts. With --nnodes MIN:MAX the rendezvous is
// elastic (elastic_rendezvous.h): each attempt is a round whose members may differ from the
// last one's, and a node waiting to join makes the members stop (their workers checkpoint on
// SIGTERM) and meet again in a round that admits it. Workers that stop to leave a straggling
// node out (regroup_exit_status.h) make the members meet again without it, and its agent leave.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/comm/tcp_store_server.h"
#include "meshtrain/runtime/elastic_rendezvous.h"
#include "meshtrain/runtime/signal_wake.h"

namespace meshtrain::runtime {

class WorkerOutput;

struct LauncherConfig {
  int nproc_per_node = 1;
  // With min_nodes == 0, exactly `nnodes` nodes (--nnodes N, node ranks 0..N-1). With
  // min_nodes > 0 (--nnodes MIN:MAX), between min_nodes and nnodes (= MAX) nodes, each round
  // taking the nodes present; node_rank is then only a unique id ordering the nodes (the node
  // with id 0 hosts the store).
  int nnodes = 1;
  int min_nodes = 0;
  int node_rank = 0;
  // Elastic only: how long a round stays open for more nodes once min_nodes have joined.
  std::chrono::milliseconds rdzv_last_call{std::chrono::seconds(3)};
  // "host:port" of node 0's store; empty for a single node (an ephemeral local port).
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  // "tcp": node 0's agent hosts a TcpStore at rdzv_endpoint. "etcd": rdzv_endpoint lists etcd
  // members (HOST:PORT[,HOST:PORT...]); no agent hosts the store, so any node may be lost, and
  // rdzv_id must name this run (etcd keeps its keys after the job).
  std::string rdzv_backend = "tcp";
  // Token source; empty: MESHTRAIN_TOKEN / MESHTRAIN_TOKEN_FILE, else a generated one (single
  // node only: several nodes must share a token).
  std::string token_file;
  std::chrono::milliseconds grace_period{std::chrono::seconds(10)};
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(300)};
  // tcp store: a request the store answers at once (a heartbeat, a failure report) or a
  // reconnect that takes longer than this means the store is lost (a cut link is silent). A
  // node whose workers ended and whose store is lost exits within about two of these plus the
  // grace period.
  std::chrono::milliseconds store_timeout{std::chrono::seconds(10)};
  // Attempts after the first: a failed worker stops every worker, rendezvous runs again and the
  // workers restart with TORCHELASTIC_RESTART_COUNT incremented (they resume from their latest
  // checkpoint). A signal to the launcher itself is never retried.
  int max_restarts = 0;
  // Local worker i runs on the i-th equal share of the cores (core_binding.h): of
  // bind_core_list when given ("0-3,8"), else of every core this agent may use.
  bool bind_cores = false;
  std::string bind_core_list;
  std::vector<std::string> command;  // program and arguments
};

// How one attempt ended.
struct AttemptOutcome {
  int exit_code = 0;
  bool success() const { return exit_code == 0; }
  std::string summary;       // the line printed for a failure
  bool interrupted = false;  // the launcher was signalled: stop, do not restart
  // Elastic: the workers were stopped for a new round (a node is waiting to join), not failed.
  bool membership_change = false;
  // Elastic: the workers stopped so that the job goes on without this node, named a straggler
  // (regroup_exit_status.h): the node leaves the job.
  bool left_out = false;
  bool caused_here = false;  // this node reported the job's failure first
  // A worker here exited with kBadInputExitStatus: a configuration or input error, which a
  // restart would meet again.
  bool bad_input = false;
};

// meshtrain's exit status for bad input (a configuration key, a data file, a checkpoint): not a
// fault, so the launcher does not restart it.
inline constexpr int kBadInputExitStatus = 2;

class LauncherAgent {
 public:
  explicit LauncherAgent(LauncherConfig config);
  ~LauncherAgent();
  LauncherAgent(const LauncherAgent&) = delete;
  LauncherAgent& operator=(const LauncherAgent&) = delete;

  // Runs the job to completion and returns the exit status for the launcher process.
  int run();

 private:
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool running = false;
    int status = 0;       // waitpid status once exited
    int replacement = 0;  // processes of this rank replaced alone in this attempt
  };
  struct Layout {
    int group_rank = 0;
    int rank_base = 0;
    int world_size = 0;
    std::string master_addr;
    uint16_t master_port = 0;
  };

  void setup_store();
  int run_elastic();
  // Starts the workers of one attempt, supervises them and stops them; signals are blocked
  // meanwhile.
  AttemptOutcome run_attempt(const Layout& layout, int attempt);
  Layout rendezvous(int attempt);
  void start_workers(const Layout& layout, int attempt);
  // Starts `w`'s process (again, for a replacement) with the attempt's layout.
  void spawn(Worker& w);
  // Starts another process for each `failed` worker while the others go on, if every one of them
  // died by a signal and said it can be replaced alone (in the workers' store prefix), and
  // --max-restarts allows.
  void replace_failed_alone(const std::function<bool(const Worker&)>& failed);
  // Supervises one attempt's workers until they are all done or one of the checks below ends
  // the attempt: a loop over small checks, each returning the outcome when it ends the attempt.
  AttemptOutcome monitor(int attempt);
  struct Watch;  // what the checks share (launcher_agent.cpp)
  // A local worker failed (or the workers were stopped for a new round).
  std::optional<AttemptOutcome> check_local_workers(Watch& w);
  // Every kPeerCheckInterval on a multi-node job: the heartbeat, another node's failure, a node
  // waiting to join.
  std::optional<AttemptOutcome> check_other_nodes(Watch& w);
  // Waits one poll interval for a supervised signal; a termination signal stops the job.
  std::optional<AttemptOutcome> check_signals(Watch& w);
  // Every local worker exited 0, or stopped for the job to meet again without a straggler.
  AttemptOutcome finish_attempt(Watch& w);
  // Elastic: `w` exited with a regroup_exit_status.h status.
  bool regrouping(const Worker& w) const;
  // The store host, its own workers done: waits until every other member's workers are done,
  // one of them failed, or every member still missing has gone silent (no heartbeat).
  AttemptOutcome wait_for_members(comm::Store& s);
  void signal_workers(int sig);
  // SIGTERM (or `sig`) to every running worker, SIGKILL to those left after the grace period.
  // A termination signal taken meanwhile cuts the grace period short and is kept in
  // signalled_.
  void stop_workers(int sig);
  void stop_workers(int sig, std::chrono::steady_clock::time_point deadline);
  // The launcher was signalled: the workers get `sig` at once, the other nodes are told (within
  // the grace period, whatever the store does), then stop_workers finishes.
  AttemptOutcome stop_for_signal(int sig, comm::Store& s);
  // "the rendezvous store at HOST:PORT"
  std::string store_name() const;
  bool reap(bool block);
  size_t running_count() const;
  std::shared_ptr<comm::Store> attempt_store(int attempt);
  // Set when a node's launcher is signalled: the job is being stopped, not restarted.
  std::string stop_key() const;
  // What stop_key() says, or "" when it is not set.
  std::string stop_reason();
  static std::string bad_input_line();

  LauncherConfig config_;
  comm::AuthToken token_;
  std::string store_host_;
  uint16_t store_port_ = 0;
  std::unique_ptr<comm::TcpStoreServer> server_;
  // Cuts store requests short on a signal, or when a stop's grace period ends (tcp store).
  std::unique_ptr<SignalWake> wake_;
  int signalled_ = 0;  // a termination signal taken while stopping workers
  std::shared_ptr<comm::Store> store_;
  std::vector<Worker> workers_;
  Layout layout_;  // the attempt's
  int attempt_ = 0;
  int replacements_ = 0;  // workers replaced alone, over the whole run
  std::unique_ptr<WorkerOutput> output_;
  // The ids of the current attempt's nodes: 0..nnodes-1, or an elastic round's members.
  std::vector<int64_t> member_ids_;
  std::unique_ptr<ElasticRendezvous> elastic_;
  std::optional<ElasticRound> round_;
  std::vector<std::vector<int>> core_shares_;  // per local rank; empty: no binding
};

// "exited with status 1", "was killed by signal 9 (SIGKILL)"
std::string describe_wait_status(int status);
// The launcher's exit code for a worker's wait status: its exit code, or 128 + the signal.
int exit_code_for(int status);

}  // namespace meshtrain::runtime
