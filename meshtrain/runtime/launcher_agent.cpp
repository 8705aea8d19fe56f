// See launcher_agent.h. Signals: the agent blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD before it
// starts workers and takes them synchronously with sigtimedwait() in its monitor loop, so no
// handler runs at an awkward moment and every background thread leaves them alone. Workers get
// the original mask back before exec, their own process group (so that a worker's children are
// stopped with it) and PR_SET_PDEATHSIG (so that they die if the agent is killed outright): see
// worker_spawn.h; their environment is worker_environment.h's, the store keys job_store_keys.h's.
#include "meshtrain/runtime/launcher_agent.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "meshtrain/comm/etcd_store.h"
#include "meshtrain/comm/prefix_store.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/runtime/core_binding.h"
#include "meshtrain/runtime/job_store_keys.h"
#include "meshtrain/runtime/regroup_exit_status.h"
#include "meshtrain/runtime/worker_environment.h"
#include "meshtrain/runtime/worker_output.h"
#include "meshtrain/runtime/worker_spawn.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

extern char** environ;

namespace meshtrain::runtime {
namespace {

using namespace std::chrono_literals;

constexpr auto kPollInterval = 100ms;
constexpr auto kPeerCheckInterval = 500ms;
constexpr auto kOutputDrain = 2000ms;
// An agent that has not bumped its heartbeat for this long is gone (killed, its host lost or
// frozen): it beats every kPeerCheckInterval while it supervises workers.
constexpr auto kAgentSilenceLimit = 10s;
// How long after its grace period a living member of a failed elastic round may take to say so.
constexpr auto kSurvivorReportSlack = 5s;

sigset_t supervised_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? detail::str_cat("SIG", abbrev) : detail::str_cat("signal ", sig);
}

std::string plural_workers(size_t n) {
  return detail::str_cat(n, n == 1 ? " worker" : " workers");
}

std::string local_hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string strip_prefix(const std::string& summary) {
  return summary.substr(summary.starts_with("meshrun: ") ? 9 : 0);
}

}  // namespace

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return detail::str_cat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return detail::str_cat("was killed by signal ", sig, " (", signal_name(sig), ")");
  }
  return "stopped";
}

int exit_code_for(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

LauncherAgent::LauncherAgent(LauncherConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  if (c.nproc_per_node < 1) MT_THROW(ValueError, "--nproc-per-node must be at least 1");
  if (c.nnodes < 1) MT_THROW(ValueError, "--nnodes must be at least 1");
  if (c.min_nodes > c.nnodes || c.min_nodes < 0)
    MT_THROW(ValueError, "--nnodes MIN:MAX needs 1 <= MIN <= MAX, got ", c.min_nodes, ":",
             c.nnodes);
  if (c.node_rank < 0 || (c.min_nodes == 0 && c.node_rank >= c.nnodes)) {
    MT_THROW(ValueError, "--node-rank ", c.node_rank, " is not in [0, ", c.nnodes, ")");
  }
  if (c.command.empty()) MT_THROW(ValueError, "no program to run (give it after --)");
  if (c.nnodes > 1 && c.rdzv_endpoint.empty()) {
    MT_THROW(ValueError, "--rdzv-endpoint HOST:PORT is required with --nnodes > 1");
  }
  if (c.max_restarts < 0) MT_THROW(ValueError, "--max-restarts must not be negative");
  if (!c.bind_core_list.empty() && !c.bind_cores)
    MT_THROW(ValueError, "--bind-core-list needs --bind-cores-to-rank");
  if (c.bind_cores) {
    const std::vector<int> allowed = allowed_cpus();
    std::vector<int> pool = allowed;
    if (!c.bind_core_list.empty()) {
      pool = parse_cpu_list(c.bind_core_list);
      for (int cpu : pool) {
        if (!std::binary_search(allowed.begin(), allowed.end(), cpu))
          MT_THROW(ValueError, "--bind-core-list: core ", cpu,
                   " is not usable here (usable: ", format_cpu_list(allowed), ")");
      }
    }
    core_shares_ = split_cpus(pool, c.nproc_per_node);
    std::string line = "meshrun: cores per local rank:";
    for (size_t i = 0; i < core_shares_.size(); ++i)
      line += detail::str_cat(i ? "," : "", " ", i, ": ", format_cpu_list(core_shares_[i]));
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

LauncherAgent::~LauncherAgent() = default;

void LauncherAgent::setup_store() {
  if (!config_.token_file.empty()) {
    token_ = comm::AuthToken::from_file(config_.token_file);
  } else {
    token_ = comm::AuthToken::from_env();
  }
  if (token_.empty()) {
    if (config_.nnodes > 1) {
      MT_THROW(ValueError,
               "a job on several nodes needs a shared token: give --token-file or set "
               "MESHTRAIN_TOKEN / MESHTRAIN_TOKEN_FILE on every node");
    }
    token_ = comm::AuthToken(comm::generate_token());
  }
  if (config_.rdzv_backend == "etcd") {
    // Every agent and worker talks to the etcd members directly; nobody hosts the store.
    if (config_.rdzv_endpoint.empty()) {
      MT_THROW(ValueError, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...]");
    }
    if (config_.rdzv_id.empty() || config_.rdzv_id == "none") {
      MT_THROW(ValueError,
               "--rdzv-backend etcd needs --rdzv-id naming this run (etcd keeps a job's keys "
               "after it ends, so two runs must not share an id)");
    }
    comm::EtcdStoreOptions eo = comm::EtcdStoreOptions::from_env();
    eo.endpoints = comm::parse_etcd_endpoints(config_.rdzv_endpoint);
    eo.prefix = comm::etcd_job_prefix(config_.rdzv_id);
    eo.timeout = config_.rdzv_timeout;
    // MASTER_ADDR/MASTER_PORT name the first member, for workers that only read those.
    std::string first = eo.endpoints.front();
    if (auto scheme = first.find("://"); scheme != std::string::npos) first.erase(0, scheme + 3);
    comm::HostPort hp = comm::HostPort::parse(first);
    store_host_ = hp.host;
    store_port_ = hp.port;
    store_ = std::make_shared<comm::EtcdStore>(std::move(eo));
    return;
  }
  if (config_.rdzv_backend != "tcp") {
    MT_THROW(ValueError, "--rdzv-backend must be 'tcp' or 'etcd', got '", config_.rdzv_backend,
             "'");
  }
  std::string listen_host;
  uint16_t listen_port = 0;
  if (config_.rdzv_endpoint.empty()) {
    store_host_ = "127.0.0.1";
    listen_host = "127.0.0.1";
  } else {
    comm::HostPort hp = comm::HostPort::parse(config_.rdzv_endpoint);
    store_host_ = hp.host;
    store_port_ = hp.port;
    listen_port = hp.port;
    if (config_.nnodes > 1 && hp.port == 0) {
      MT_THROW(ValueError, "--rdzv-endpoint needs a port other than 0 with --nnodes > 1");
    }
  }
  if (config_.node_rank == 0) {
    comm::TcpStoreServerOptions so;
    so.host = listen_host;
    so.port = listen_port;
    so.token = token_;
    server_ = std::make_unique<comm::TcpStoreServer>(so);
    store_port_ = server_->port();
  }
  comm::TcpStoreOptions co;
  co.timeout = config_.rdzv_timeout;
  co.request_timeout = std::min(config_.store_timeout, config_.rdzv_timeout);
  co.token = token_;
  auto store = std::make_shared<comm::TcpStore>(store_host_, store_port_, co);
  wake_ = std::make_unique<SignalWake>();
  store->set_wake_fd(wake_->fd());
  store_ = std::move(store);
}

std::string LauncherAgent::store_name() const {
  if (config_.rdzv_backend == "etcd")
    return detail::str_cat("the etcd rendezvous store at ", config_.rdzv_endpoint);
  return detail::str_cat("the rendezvous store at ",
                         comm::HostPort{store_host_, store_port_}.str());
}

std::string LauncherAgent::stop_key() const {
  return job_keys::stopped(config_.rdzv_id);
}

std::shared_ptr<comm::Store> LauncherAgent::attempt_store(int attempt) {
  return std::make_shared<comm::PrefixStore>(job_keys::attempt_prefix(config_.rdzv_id, attempt),
                                             store_);
}

LauncherAgent::Layout LauncherAgent::rendezvous(int attempt) {
  auto s = attempt_store(attempt);
  s->set_timeout(config_.rdzv_timeout);
  const std::string me =
      detail::str_cat(config_.nproc_per_node, " ", local_hostname(), " ", ::getpid());
  const std::string my_key = job_keys::node(config_.node_rank);
  comm::Bytes mine(me.begin(), me.end());
  comm::Bytes got = s->compare_set(my_key, {}, mine);
  if (got != mine) {
    MT_THROW(ValueError, "node rank ", config_.node_rank, " is already taken by '",
             std::string(got.begin(), got.end()), "'");
  }
  if (config_.node_rank == 0) {
    std::vector<std::string> keys;
    for (int k = 0; k < config_.nnodes; ++k) keys.push_back(job_keys::node(k));
    if (config_.nnodes > 1) {
      MT_LOG_INFO("meshrun", "waiting for ", config_.nnodes, " nodes at ", store_host_, ":",
                  store_port_);
    }
    try {
      s->wait(keys, config_.rdzv_timeout);
    } catch (const TimeoutError&) {
      std::string missing;
      for (int k = 0; k < config_.nnodes; ++k) {
        if (!s->check({keys[k]})) missing += detail::str_cat(missing.empty() ? "" : ", ", k);
      }
      MT_THROW(TimeoutError, "rendezvous: node ranks [", missing, "] of ", config_.nnodes,
               " did not join within ",
               std::chrono::duration_cast<std::chrono::seconds>(config_.rdzv_timeout).count(),
               " s (--rdzv-timeout)");
    }
    // Node order is node-rank order; the layout lists each node's worker count.
    std::string layout;
    for (const auto& k : keys) {
      std::istringstream in(s->get_string(k));
      int n = 0;
      in >> n;
      if (!layout.empty()) layout.push_back(',');
      layout.append(std::to_string(n));
    }
    s->set_string(job_keys::kLayout, layout);
  }
  std::string layout;
  try {
    layout = s->get_string(job_keys::kLayout);
  } catch (const TimeoutError&) {
    MT_THROW(TimeoutError, "rendezvous: node 0 did not publish the job's layout within ",
             std::chrono::duration_cast<std::chrono::seconds>(config_.rdzv_timeout).count(),
             " s (--rdzv-timeout); not every node joined");
  }
  Layout out;
  out.group_rank = config_.node_rank;
  out.master_addr = store_host_;
  out.master_port = store_port_;
  std::istringstream in(layout);
  std::string item;
  for (int k = 0; std::getline(in, item, ','); ++k) {
    int n = std::stoi(item);
    if (k < config_.node_rank) out.rank_base += n;
    out.world_size += n;
  }
  return out;
}

void LauncherAgent::start_workers(const Layout& layout, int attempt) {
  output_ = std::make_unique<WorkerOutput>();
  workers_.clear();
  layout_ = layout;
  attempt_ = attempt;
  for (int local = 0; local < config_.nproc_per_node; ++local) {
    Worker w;
    w.local_rank = local;
    w.rank = layout.rank_base + local;
    spawn(w);
    workers_.push_back(w);
  }
  output_->start();
}

void LauncherAgent::spawn(Worker& w) {
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) inherited.emplace_back(*e);
  WorkerSpawn spec;
  spec.argv = config_.command;
  ::sigprocmask(SIG_SETMASK, nullptr, &spec.mask);
  // Workers start with the signals the agent supervises unblocked.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigdelset(&spec.mask, sig);
  WorkerIdentity who;
  who.rank = w.rank;
  who.local_rank = w.local_rank;
  who.world_size = layout_.world_size;
  who.local_world_size = config_.nproc_per_node;
  who.group_rank = layout_.group_rank;
  who.master_addr = layout_.master_addr;
  who.master_port = layout_.master_port;
  who.restart_count = attempt_;
  who.replacement = w.replacement;
  who.min_nodes = elastic_ != nullptr ? config_.min_nodes : 0;
  who.grace_period_ms = config_.grace_period.count();
  who.token = token_.secret();
  who.rdzv_backend = config_.rdzv_backend;
  who.rdzv_endpoint = config_.rdzv_endpoint;
  who.rdzv_id = config_.rdzv_id;
  spec.rank = w.rank;
  spec.env = worker_environment(inherited, who);
  spec.cores =
      core_shares_.empty() ? std::vector<int>{} : core_shares_[static_cast<size_t>(w.local_rank)];
  const SpawnedWorker spawned = spawn_worker(spec);
  std::string prefix = detail::str_cat("[rank ", w.rank, "] ");
  output_->add(spawned.out_fd, STDOUT_FILENO, prefix);
  output_->add(spawned.err_fd, STDERR_FILENO, prefix);
  w.pid = spawned.pid;
  w.running = true;
  w.status = 0;
}

void LauncherAgent::replace_failed_alone(const std::function<bool(const Worker&)>& failed) {
  std::vector<Worker*> down;
  for (Worker& w : workers_)
    if (failed(w)) down.push_back(&w);
  if (down.empty() || signalled_ != 0 ||
      replacements_ + static_cast<int>(down.size()) > config_.max_restarts)
    return;
  // Only workers that said the others do not depend on them (asynchronous parameter-server
  // workers, once their links were made) and that died by a signal (killed, out of memory, a
  // crash). A worker that exits with an error status may have failed because something else did
  // (a server that died fails its workers' links, and they can exit before the server's death
  // is seen here): if any rank that failed is not such a worker, the job stops as a whole, as it
  // would without this.
  comm::PrefixStore run(job_keys::run_prefix(attempt_), store_);
  for (const Worker* w : down) {
    if (!WIFSIGNALED(w->status)) return;
    try {
      if (!run.check({job_keys::replaceable(w->rank)})) return;
    } catch (const Error&) {
      return;
    }
  }
  for (Worker* w : down) {
    ++replacements_;
    MT_LOG_WARN("meshrun", "rank ", w->rank, " (pid ", w->pid, ") ",
                describe_wait_status(w->status),
                "; replacing it alone, the other ranks go on (an asynchronous parameter-server "
                "worker; replacement ",
                replacements_, " of at most ", config_.max_restarts, ", --max-restarts)");
    ++w->replacement;
    spawn(*w);
  }
}

bool LauncherAgent::reap(bool block) {
  bool any = false;
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(w.pid, &status, block ? 0 : WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == w.pid) {
      w.running = false;
      w.status = status;
      any = true;
    }
  }
  return any;
}

size_t LauncherAgent::running_count() const {
  return static_cast<size_t>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

void LauncherAgent::signal_workers(int sig) {
  // The whole process group, so that a worker's own children (a shell's command) stop too.
  for (const auto& w : workers_) {
    if (::kill(-w.pid, sig) < 0 && w.running) ::kill(w.pid, sig);
  }
}

void LauncherAgent::stop_workers(int sig) {
  stop_workers(sig, std::chrono::steady_clock::now() + config_.grace_period);
}

void LauncherAgent::stop_workers(int sig, std::chrono::steady_clock::time_point deadline) {
  signal_workers(sig);
  // A stopped worker (SIGSTOP, a debugger) acts on the signal only once it runs again; without
  // this it would always cost the whole grace period.
  signal_workers(SIGCONT);
  sigset_t set = supervised_signals();
  while (running_count() > 0 && std::chrono::steady_clock::now() < deadline) {
    timespec ts{0, 50 * 1000 * 1000};
    int got = ::sigtimedwait(&set, nullptr, &ts);
    reap(false);
    if (got == SIGINT || got == SIGTERM || got == SIGHUP) {
      signalled_ = got;
      break;  // asked twice: stop now
    }
  }
  if (running_count() > 0) {
    MT_LOG_WARN("meshrun", plural_workers(running_count()),
                " still running after the grace period; sending SIGKILL");
  }
  signal_workers(SIGKILL);
  reap(true);
}

struct LauncherAgent::Watch {
  std::shared_ptr<comm::Store> s;  // the attempt's store
  bool multi_node = false;
  // The store host waits for the other agents at the end (wait_for_members): they tell it they
  // are alive.
  bool heartbeat = false;
  sigset_t signals{};
  std::chrono::steady_clock::time_point next_peer_check;
  AttemptOutcome outcome;
};

AttemptOutcome LauncherAgent::monitor(int attempt) {
  Watch w;
  w.s = attempt_store(attempt);
  w.multi_node = config_.nnodes > 1 || elastic_ != nullptr;
  w.heartbeat = w.multi_node && config_.rdzv_backend == "tcp" && server_ == nullptr;
  w.signals = supervised_signals();
  w.next_peer_check = std::chrono::steady_clock::now() + kPeerCheckInterval;
  while (true) {
    reap(false);
    if (auto done = check_local_workers(w)) return *done;
    if (running_count() == 0) return finish_attempt(w);
    if (auto done = check_other_nodes(w)) return *done;
    if (auto done = check_signals(w)) return *done;
  }
}

std::optional<AttemptOutcome> LauncherAgent::check_local_workers(Watch& watch) {
  comm::Store& s = *watch.s;
  AttemptOutcome& outcome = watch.outcome;
  const auto failed = [this](const Worker& w) {
    return !w.running && !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0) && !regrouping(w);
  };
  replace_failed_alone(failed);
  // The lowest rank among those that failed since the last look is reported.
  for (auto& w : workers_) {
    if (!failed(w)) continue;
    size_t others = running_count();
    // Stopping for a new round can make workers fail (a peer stopped first): not a failure.
    // A store that cannot be asked is no reason to lose the failure's own report.
    bool rescaling = false;
    try {
      rescaling = elastic_ != nullptr && s.check({job_keys::kRescale});
    } catch (const Error&) {
    }
    if (rescaling) {
      stop_workers(SIGTERM);
      outcome.membership_change = true;
      return outcome;
    }
    std::string what =
        detail::str_cat("rank ", w.rank, " (pid ", w.pid, ") ", describe_wait_status(w.status));
    if (watch.multi_node) {
      const std::string report = detail::str_cat(what, " on node ", config_.node_rank);
      try {
        const comm::Bytes mine(report.begin(), report.end());
        outcome.caused_here = s.compare_set(job_keys::kFailed, {}, mine) == mine;
      } catch (const InterruptedError&) {
        throw;  // run_attempt acts on the signal
      } catch (const Error& e) {
        MT_LOG_WARN("meshrun", "lost ", store_name(),
                    " while reporting the failure to the other nodes: ", e.what());
      }
    }
    stop_workers(SIGTERM);
    outcome.exit_code = exit_code_for(w.status);
    outcome.bad_input = WIFEXITED(w.status) && WEXITSTATUS(w.status) == kBadInputExitStatus;
    outcome.summary = detail::str_cat(
        "meshrun: ", what, "; ",
        others == 0 ? std::string("no other workers were running")
                    : detail::str_cat("stopped the other ", plural_workers(others)));
    return outcome;
  }
  return std::nullopt;
}

std::optional<AttemptOutcome> LauncherAgent::check_other_nodes(Watch& watch) {
  if (!watch.multi_node || std::chrono::steady_clock::now() < watch.next_peer_check)
    return std::nullopt;
  watch.next_peer_check = std::chrono::steady_clock::now() + kPeerCheckInterval;
  comm::Store& s = *watch.s;
  AttemptOutcome& outcome = watch.outcome;
  std::string failure;
  bool rescale = false;
  try {
    if (watch.heartbeat) s.add(job_keys::alive(config_.node_rank), 1);
    if (s.check({job_keys::kFailed})) failure = s.get_string(job_keys::kFailed);
    // The first member that sees a waiting node marks the attempt, then every member stops.
    if (failure.empty() && elastic_ != nullptr &&
        (s.check({job_keys::kRescale}) || elastic_->nodes_waiting(*round_))) {
      s.compare_set(job_keys::kRescale, {}, comm::Bytes{'1'});
      rescale = true;
    }
  } catch (const InterruptedError&) {
    // A signal is pending: check_signals takes it.
  } catch (const Error& e) {
    failure =
        detail::str_cat("lost ", store_name(), " while checking on the other nodes: ", e.what());
  }
  if (rescale) {
    size_t n = running_count();
    MT_LOG_INFO("meshrun", "a node is waiting to join; stopping ", plural_workers(n),
                " here (they checkpoint) for a new round");
    stop_workers(SIGTERM);
    outcome.membership_change = true;
    return outcome;
  }
  if (!failure.empty()) {
    size_t n = running_count();
    stop_workers(SIGTERM);
    outcome.exit_code = 1;
    outcome.summary =
        detail::str_cat("meshrun: ", failure, "; stopped ", plural_workers(n), " here");
    return outcome;
  }
  return std::nullopt;
}

std::optional<AttemptOutcome> LauncherAgent::check_signals(Watch& watch) {
  timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kPollInterval).count()};
  siginfo_t info{};
  int sig = ::sigtimedwait(&watch.signals, &info, &ts);
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) return stop_for_signal(sig, *watch.s);
  return std::nullopt;
}

bool LauncherAgent::regrouping(const Worker& w) const {
  if (elastic_ == nullptr || w.running || !WIFEXITED(w.status)) return false;
  const int code = WEXITSTATUS(w.status);
  return code == kRegroupExitStatus || code == kLeftOutExitStatus;
}

AttemptOutcome LauncherAgent::finish_attempt(Watch& watch) {
  comm::Store& s = *watch.s;
  // Every rank of the job checkpointed one step and stopped to leave a straggling node out.
  if (std::any_of(workers_.begin(), workers_.end(),
                  [this](const Worker& w) { return regrouping(w); })) {
    watch.outcome.membership_change = true;
    watch.outcome.left_out = std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) {
      return WIFEXITED(w.status) && WEXITSTATUS(w.status) == kLeftOutExitStatus;
    });
    return watch.outcome;
  }
  // Every local worker exited 0: the job is done -- unless they were stopped for a new round.
  if (elastic_ != nullptr && s.check({job_keys::kRescale})) {
    watch.outcome.membership_change = true;
    return watch.outcome;
  }
  if (elastic_ != nullptr) elastic_->mark_finished();
  // The node hosting the store keeps it up until every node is done, since workers elsewhere
  // may still be using it.
  if (watch.multi_node) {
    s.set_string(job_keys::done(config_.node_rank), "1");
    if (server_ != nullptr) return wait_for_members(s);
  }
  return watch.outcome;
}

AttemptOutcome LauncherAgent::stop_for_signal(int sig, comm::Store& s) {
  const auto deadline = std::chrono::steady_clock::now() + config_.grace_period;
  const size_t n = running_count();
  MT_LOG_INFO("meshrun", "received ", signal_name(sig), "; stopping ", plural_workers(n));
  // The workers first: they start their last checkpoint while the other nodes are told.
  signal_workers(sig);
  signal_workers(SIGCONT);
  if (config_.nnodes > 1 || elastic_ != nullptr) {
    const std::string why =
        detail::str_cat("node ", config_.node_rank, " received ", signal_name(sig));
    // A silent store gets the grace period, not its own timeout.
    if (wake_ != nullptr) wake_->arm(config_.grace_period);
    try {
      // Recorded before the failure, so that no node restarts the job that is being stopped.
      store_->set_string(stop_key(), why);
      s.compare_set(job_keys::kFailed, {}, comm::Bytes(why.begin(), why.end()));
    } catch (const Error& e) {
      MT_LOG_WARN("meshrun", "cannot tell the other nodes to stop: ", store_name(),
                  " did not answer: ", e.what());
    }
    if (wake_ != nullptr) wake_->disarm();
  }
  stop_workers(sig, deadline);
  AttemptOutcome outcome;
  outcome.exit_code = 128 + sig;
  outcome.interrupted = true;
  outcome.summary =
      detail::str_cat("meshrun: received ", signal_name(sig), "; stopped ", plural_workers(n));
  return outcome;
}

AttemptOutcome LauncherAgent::wait_for_members(comm::Store& s) {
  using Clock = std::chrono::steady_clock;
  struct Beat {
    int64_t count = -1;
    Clock::time_point since;
  };
  std::map<int64_t, Beat> beats;
  sigset_t set = supervised_signals();
  AttemptOutcome outcome;
  while (true) {
    // The members not done yet, and those among them whose agent has gone silent.
    std::vector<int64_t> pending, silent;
    bool interrupted = false;
    try {
      if (s.check({job_keys::kFailed})) {
        outcome.exit_code = 1;
        outcome.summary = detail::str_cat("meshrun: ", s.get_string(job_keys::kFailed));
        return outcome;
      }
      const auto now = Clock::now();
      for (int64_t k : member_ids_) {
        if (k == config_.node_rank || s.check({job_keys::done(k)})) continue;
        pending.push_back(k);
        Beat& b = beats[k];
        const int64_t count = s.add(job_keys::alive(k), 0);
        if (count != b.count) {
          b.count = count;
          b.since = now;
        } else if (now - b.since >= kAgentSilenceLimit) {
          silent.push_back(k);
        }
      }
    } catch (const InterruptedError&) {
      interrupted = true;  // a signal is pending: the wait below takes it
    }
    if (!interrupted && pending.empty()) return outcome;
    // The workers here finished, so the job's last step and checkpoint are complete: a member
    // whose agent died since then changes nothing, but must not keep this node waiting forever.
    if (!interrupted && silent.size() == pending.size()) {
      std::string nodes;
      for (int64_t k : silent) nodes += detail::str_cat(nodes.empty() ? "" : ", ", k);
      const std::string line = detail::str_cat(
          "meshrun: the job finished here, but node", silent.size() == 1 ? " " : "s ", nodes,
          " never reported ", silent.size() == 1 ? "its" : "their", " workers done and ",
          silent.size() == 1 ? "its agent has" : "their agents have", " been silent for ",
          std::chrono::duration_cast<std::chrono::seconds>(kAgentSilenceLimit).count(),
          " s (killed, or the host lost); not waiting any longer\n");
      [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
      return outcome;
    }
    timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kPollInterval * 2).count()};
    int sig = ::sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      outcome.exit_code = 128 + sig;
      outcome.interrupted = true;
      outcome.summary = detail::str_cat("meshrun: received ", signal_name(sig),
                                        " while waiting for the other nodes to finish");
      return outcome;
    }
  }
}

AttemptOutcome LauncherAgent::run_attempt(const Layout& layout, int attempt) {
  sigset_t set = supervised_signals();
  sigset_t previous;
  ::sigprocmask(SIG_BLOCK, &set, &previous);
  AttemptOutcome outcome;
  signalled_ = 0;
  try {
    start_workers(layout, attempt);
    try {
      outcome = monitor(attempt);
    } catch (const InterruptedError&) {
      // A store request was cut short by a signal that is still pending: act on it.
      int sig = 0;
      timespec zero{0, 0};
      for (int got; sig == 0 && (got = ::sigtimedwait(&set, nullptr, &zero)) > 0;) {
        if (got != SIGCHLD) sig = got;
      }
      if (sig == 0) throw;
      outcome = stop_for_signal(sig, *attempt_store(attempt));
    }
    if (signalled_ != 0 && !outcome.interrupted) {
      // Signalled while stopping the workers after a failure: stop, do not restart.
      outcome.interrupted = true;
      outcome.exit_code = 128 + signalled_;
      outcome.summary += detail::str_cat("; received ", signal_name(signalled_), " meanwhile");
    }
  } catch (...) {
    if (!workers_.empty()) stop_workers(SIGTERM);
    if (output_) output_->finish(kOutputDrain);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  output_->finish(kOutputDrain);
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (!outcome.success() && !outcome.summary.empty()) {
    std::string line = outcome.summary + "\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  }
  return outcome;
}

int LauncherAgent::run() {
  setup_store();
  if (config_.min_nodes > 0) return run_elastic();
  for (int k = 0; k < config_.nnodes; ++k) member_ids_.push_back(k);
  for (int attempt = 0;; ++attempt) {
    Layout layout = rendezvous(attempt);
    if (config_.node_rank == 0) {
      MT_LOG_INFO("meshrun", "starting ", layout.world_size, " workers on ", config_.nnodes,
                  config_.nnodes == 1 ? " node" : " nodes", " (store ", store_host_, ":",
                  store_port_, ")");
    }
    AttemptOutcome outcome = run_attempt(layout, attempt);
    if (outcome.success()) return 0;
    if (outcome.interrupted) return outcome.exit_code;
    if (outcome.bad_input && config_.max_restarts > attempt) {
      MT_LOG_ERROR("meshrun", bad_input_line());
      return outcome.exit_code;
    }
    if (config_.nnodes > 1 && config_.max_restarts > attempt) {
      std::string stopped = stop_reason();
      if (!stopped.empty()) {
        MT_LOG_ERROR("meshrun", "not restarting: ", stopped);
        return outcome.exit_code;
      }
    }
    if (attempt >= config_.max_restarts) {
      if (config_.max_restarts > 0)
        MT_LOG_ERROR("meshrun", "giving up after ", attempt,
                     attempt == 1 ? " restart" : " restarts");
      return outcome.exit_code;
    }
    // The reason is the failure summary printed above; workers find the attempt number in
    // TORCHELASTIC_RESTART_COUNT and resume from their newest checkpoint.
    MT_LOG_WARN("meshrun", "restart ", attempt + 1, " of ", config_.max_restarts,
                " (reason: ", strip_prefix(outcome.summary), ")");
  }
}

std::string LauncherAgent::bad_input_line() {
  return detail::str_cat("not restarting: a worker exited with status ", kBadInputExitStatus,
                         ", a configuration or input error (its line is above), which a restart "
                         "would meet again; fix it and start the job again");
}

std::string LauncherAgent::stop_reason() {
  try {
    if (store_->check({stop_key()})) return store_->get_string(stop_key());
  } catch (const Error& e) {
    return detail::str_cat("lost ", store_name(),
                           " while asking whether the job was stopped: ", e.what());
  }
  return {};
}

// Rounds instead of attempts. --max-restarts counts only the failures this node's own workers
// caused (they failed first, and no member of the round died with it): a node whose workers
// keep failing leaves the job, and the others go on without it.
int LauncherAgent::run_elastic() {
  ElasticOptions eo;
  eo.rdzv_id = config_.rdzv_id;
  eo.node_id = config_.node_rank;
  eo.nproc = config_.nproc_per_node;
  eo.host = local_hostname();
  eo.min_nodes = config_.min_nodes;
  eo.max_nodes = config_.nnodes;
  eo.last_call = config_.rdzv_last_call;
  eo.join_timeout = config_.rdzv_timeout;
  elastic_ = std::make_unique<ElasticRendezvous>(store_, eo);
  if (server_ != nullptr)
    MT_LOG_INFO("meshrun", "elastic job of ", config_.min_nodes, " to ", config_.nnodes,
                " nodes; store at ", store_host_, ":", store_port_);
  int failures = 0;
  while (true) {
    round_ = elastic_->join();
    if (!round_) {
      MT_LOG_INFO("meshrun", "the job finished before this node was admitted");
      return 0;
    }
    const ElasticRound& r = *round_;
    member_ids_.clear();
    for (const auto& m : r.members) member_ids_.push_back(m.node_id);
    MT_LOG_INFO("meshrun", r.describe(), "; node ", config_.node_rank, " is group ", r.group_rank,
                " with ranks ", r.rank_base, "-", r.rank_base + config_.nproc_per_node - 1);
    Layout layout;
    layout.group_rank = r.group_rank;
    layout.rank_base = r.rank_base;
    layout.world_size = r.world_size;
    layout.master_addr = store_host_;
    layout.master_port = store_port_;
    AttemptOutcome outcome = run_attempt(layout, static_cast<int>(r.round));
    if (outcome.left_out) {
      // Said before the others close the next round, so that they need not wait for it.
      elastic_->leave(r.round);
      MT_LOG_INFO("meshrun", "node ", config_.node_rank,
                  " leaves the job: its workers were named a straggler and the others go on "
                  "without it from their checkpoint (elastic.drop_stragglers)");
      return 0;
    }
    if (outcome.membership_change) {
      elastic_->open_next(r.round);
      continue;
    }
    if (outcome.success()) return 0;
    if (outcome.interrupted) return outcome.exit_code;
    if (outcome.bad_input) {
      MT_LOG_ERROR("meshrun", bad_input_line());
      return outcome.exit_code;
    }
    std::string stopped = stop_reason();
    if (!stopped.empty()) {
      MT_LOG_ERROR("meshrun", "not restarting: ", stopped);
      return outcome.exit_code;
    }
    elastic_->survived(r.round);
    if (outcome.caused_here) ++failures;
    if (failures > config_.max_restarts) {
      // A node that dies with the round makes the workers elsewhere fail too, and one of those
      // nodes reports it first: the failure was the dead node's. The living members say so
      // once their workers are stopped, which takes at most their grace period.
      const std::vector<int64_t> lost =
          elastic_->lost_members(r, config_.grace_period + kSurvivorReportSlack);
      if (!lost.empty()) {
        std::string nodes;
        for (int64_t k : lost) nodes += detail::str_cat(nodes.empty() ? "" : ", ", k);
        MT_LOG_WARN("meshrun", "round ", r.round, " failed while node",
                    lost.size() == 1 ? " " : "s ", nodes,
                    " went missing; not counted as a failure of this node");
        --failures;
      }
    }
    if (failures > config_.max_restarts) {
      MT_LOG_ERROR("meshrun", "this node's workers failed ", failures,
                   failures == 1 ? " time" : " times", " (--max-restarts ", config_.max_restarts,
                   "); node ", config_.node_rank, " leaves the job");
      return outcome.exit_code;
    }
    MT_LOG_WARN("meshrun", "restart after round ", r.round, " (failures caused here: ", failures,
                " of at most ", config_.max_restarts, "; reason: ", strip_prefix(outcome.summary),
                ")");
    elastic_->open_next(r.round);
  }
}

}  // namespace meshtrain::runtime
