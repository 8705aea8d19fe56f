// meshrun: starts a meshtrain job's workers on this node, one launcher agent per node. The
// agents meet at node 0's rendezvous store, then each runs N workers with the torchrun
// environment (RANK, LOCAL_RANK, WORLD_SIZE, ...), prefixes their output with "[rank N] " and
// stops them all as soon as one fails. The logic lives in meshtrain/runtime/launcher_agent.h.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/comm/tls.h"
#include "meshtrain/obs/metrics_aggregator.h"
#include "meshtrain/runtime/launcher_agent.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace {

bool parse_count(const std::string& text, int& out) {
  size_t used = 0;
  try {
    out = std::stoi(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size() && out >= 1;
}

bool parse_nnodes(const std::string& text, meshtrain::runtime::LauncherConfig& config) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return parse_count(text, config.nnodes);
  return parse_count(text.substr(0, colon), config.min_nodes) &&
         parse_count(text.substr(colon + 1), config.nnodes) && config.min_nodes <= config.nnodes;
}

// CLI11's PositiveNumber and NonNegativeNumber print their range up to DBL_MAX, a 300-digit
// number; these say what is wrong in words.
CLI::Validator number_at_least(double min, bool strictly_more = false) {
  std::ostringstream bound;
  bound << min;
  const std::string words = (strictly_more ? "more than " : "at least ") + bound.str();
  return CLI::Validator(
      [min, strictly_more, words](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "expected a number, got '" + text + "'";
        if (strictly_more ? !(v > min) : !(v >= min)) return "must be " + words + ", got " + text;
        return {};
      },
      "NUMBER " + words);
}

}  // namespace

int main(int argc, char** argv) {
  using meshtrain::runtime::LauncherConfig;
  // Everything after the first "--" is the worker's command line, untouched by flag parsing.
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      split = i;
      break;
    }
  }
  LauncherConfig config;
  double grace_s = 10.0;
  double rdzv_timeout_s = 300.0;
  double last_call_s = 3.0;
  double store_timeout_s = 10.0;
  std::string nnodes = "1";
  CLI::App app{
      "meshrun: launch a meshtrain job's workers on this node.\n\n"
      "Usage: meshrun --nproc-per-node N [options] -- PROGRAM [ARGS...]\n\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,\n"
      "MASTER_PORT, TORCHELASTIC_RESTART_COUNT and MESHTRAIN_TOKEN. Node 0 hosts the rendezvous\n"
      "store (at --rdzv-endpoint, or on a free local port for a single node); with\n"
      "--rdzv-backend etcd the agents and workers meet in an etcd cluster instead (workers get\n"
      "MESHTRAIN_RDZV_BACKEND, MESHTRAIN_RDZV_ENDPOINT, MESHTRAIN_RDZV_ID; etcd credentials come\n"
      "from MESHTRAIN_ETCD_USER/MESHTRAIN_ETCD_PASSWORD[_FILE]). Worker output is\n"
      "prefixed with \"[rank N] \". When a worker fails, the others are stopped (SIGTERM, then\n"
      "SIGKILL after the grace period) and meshrun exits with that worker's status (128 + signal\n"
      "for a worker killed by a signal); with --max-restarts R it instead restarts every worker\n"
      "(rendezvous again, TORCHELASTIC_RESTART_COUNT + 1) up to R times, and a meshtrain job\n"
      "resumes from its newest checkpoint. A worker that said the others do not depend on it (an\n"
      "asynchronous parameter-server worker) and died by a signal is instead replaced alone\n"
      "while the others go on (MESHTRAIN_REPLACEMENT set; each replacement counts against R).\n"
      "SIGINT/SIGTERM/SIGHUP are forwarded to the workers\n"
      "(meshtrain finishes its step and writes a checkpoint) and are never retried; they are\n"
      "acted on within the grace period whatever meshrun is waiting on.\n"
      "The job token comes from --token-file, MESHTRAIN_TOKEN or MESHTRAIN_TOKEN_FILE; a single\n"
      "node generates one when none is given.\n\n"
      "Elastic jobs (--nnodes MIN:MAX): the agents present meet in numbered rounds; a round\n"
      "closes when MAX nodes joined, or when at least MIN joined and --rdzv-last-call seconds\n"
      "passed. Ranks follow the members' --node-rank order densely (GROUP_RANK is the node's\n"
      "index in the round). A node that leaves (its agent dies, or its own workers failed more\n"
      "than --max-restarts times) is absent from the next round; a node that arrives while a\n"
      "round runs makes the members stop their workers (they checkpoint) and meet again. Each\n"
      "round's workers get the new WORLD_SIZE and RANK, TORCHELASTIC_RESTART_COUNT = the round,\n"
      "and a meshtrain job resumes from its newest checkpoint (see dist.elastic_batch). A node\n"
      "that meshtrain names a straggler (elastic.drop_stragglers) leaves the job with status 0\n"
      "once every rank checkpointed, and the others meet again without it. With\n"
      "--rdzv-backend tcp the node with --node-rank 0 hosts the store and must stay; with etcd\n"
      "any node, the first included, may leave.\n\n"
      "Hangs: every collective has a deadline (meshtrain's dist.timeout_s); a worker that hangs\n"
      "makes its peers' collective fail, and that failure stops and restarts the group.\n"
      "`meshtrain env` lists every MESHTRAIN_* environment variable; one that is set but\n"
      "unknown (a misspelling) is named with a warning.",
      "meshrun"};
  app.add_option("--nproc-per-node", config.nproc_per_node, "Workers to start on this node")
      ->check(number_at_least(1))
      ->capture_default_str();
  app.add_option("--nnodes", nnodes,
                 "Number of nodes (one meshrun per node): N, or MIN:MAX for an elastic job")
      ->capture_default_str();
  app.add_option("--node-rank", config.node_rank,
                 "This node's index in [0, nnodes); elastic: a unique id ordering the nodes "
                 "(0 hosts the store)")
      ->check(number_at_least(0))
      ->capture_default_str();
  app.add_option("--rdzv-endpoint", config.rdzv_endpoint,
                 "HOST:PORT of node 0's rendezvous store ([addr]:port for IPv6); required with "
                 "--nnodes > 1");
  app.add_option("--rdzv-id", config.rdzv_id, "Job id, separating jobs that share a store")
      ->capture_default_str();
  app.add_option("--rdzv-backend", config.rdzv_backend,
                 "Rendezvous store: 'tcp' (node 0's meshrun hosts it at --rdzv-endpoint) or "
                 "'etcd' (an etcd cluster: --rdzv-endpoint HOST:PORT[,HOST:PORT...] lists its "
                 "members, --rdzv-id names this run; no node hosts the store, so losing any "
                 "node does not lose it)")
      ->check(CLI::IsMember({"tcp", "etcd"}))
      ->capture_default_str();
  app.add_option("--token-file", config.token_file,
                 "File holding the job token (overrides MESHTRAIN_TOKEN/MESHTRAIN_TOKEN_FILE)");
  app.add_option("--grace-period", grace_s,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(number_at_least(0))
      ->capture_default_str();
  app.add_option("--rdzv-timeout", rdzv_timeout_s,
                 "Seconds to wait for every node to join the rendezvous")
      ->check(number_at_least(0, true))
      ->capture_default_str();
  app.add_option("--store-timeout", store_timeout_s,
                 "Seconds a request that the tcp store answers at once (a heartbeat, a failure "
                 "report, a reconnect) may take before the store counts as lost: a node cut off "
                 "from it exits (or, with --max-restarts, fails to rejoin) within about "
                 "dist.timeout_s + 2 x this + --grace-period")
      ->check(number_at_least(0, true))
      ->capture_default_str();
  app.add_option("--rdzv-last-call", last_call_s,
                 "Elastic: seconds a round stays open for more nodes once MIN have joined")
      ->check(number_at_least(0))
      ->capture_default_str();
  app.add_option("--max-restarts", config.max_restarts,
                 "Restart all workers up to R times after a failure (they resume from their "
                 "latest checkpoint); TORCHELASTIC_RESTART_COUNT counts the restarts. Elastic: "
                 "only failures of this node's own workers count, and past R the node leaves. An "
                 "asynchronous parameter-server worker is replaced alone instead (counted too)")
      ->check(number_at_least(0))
      ->capture_default_str();
  app.add_flag("--bind-cores-to-rank", config.bind_cores,
               "Run each local worker on its own equal share of the cores this meshrun may use "
               "(contiguous; leftover cores stay unused), so that the scheduler never puts two "
               "workers' busy threads on one core while another idles. Set the workers' thread "
               "count (meshtrain: train.threads) to the share");
  app.add_option("--bind-core-list", config.bind_core_list,
                 "With --bind-cores-to-rank: split these cores instead (e.g. 0-15,32-47)");
  int metrics_port = -1;
  app.add_option("--metrics-port", metrics_port,
                 "Serve this node's aggregated /metrics here (read-only); workers serve theirs on "
                 "MESHTRAIN_METRICS_PORT + LOCAL_RANK (default: this port + 1 + LOCAL_RANK)")
      ->check(CLI::Range(1, 65535));
  int ps_servers = 0;
  bool tls = false;
  std::string tls_cert, tls_key, tls_ca;
  app.add_flag("--tls", tls,
               "TLS 1.3 with mutual certificates for the store and the workers' tcp collectives "
               "(also MESHTRAIN_TLS=1; workers inherit the settings)");
  app.add_option("--tls-cert", tls_cert, "this node's certificate, PEM (MESHTRAIN_TLS_CERT)");
  app.add_option("--tls-key", tls_key, "its private key, PEM (MESHTRAIN_TLS_KEY)");
  app.add_option("--tls-ca", tls_ca, "the job's CA certificate, PEM (MESHTRAIN_TLS_CA)");
  app.add_option("--ps-servers", ps_servers,
                 "A parameter-server job: the job's last N ranks serve (hold the parameters and "
                 "optimizer state), the others train; counted in --nproc-per-node x nodes")
      ->check(CLI::Range(1, 1 << 20));
  std::vector<std::string> positional;
  app.add_option("command", positional, "PROGRAM [ARGS...] (put it after --)");
  app.footer(
      "Examples:\n"
      "  meshrun --nproc-per-node 4 -- meshtrain train --config gpt.toml\n"
      "  meshrun --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 --token-file /run/token \\\n"
      "          --nproc-per-node 8 -- meshtrain train --config gpt.toml\n"
      "  meshrun --nnodes 1:4 --node-rank 2 --rdzv-endpoint node0:29400 --token-file /run/token "
      "\\\n"
      "          --max-restarts 3 --nproc-per-node 8 -- meshtrain train --config gpt.toml\n"
      "  meshrun --nproc-per-node 3 --ps-servers 1 -- meshtrain train --config gpt.toml\n"
      "  meshrun --nnodes 2 --node-rank 1 --rdzv-backend etcd --rdzv-id run-42 \\\n"
      "          --rdzv-endpoint etcd1:2379,etcd2:2379,etcd3:2379 --token-file /run/token \\\n"
      "          --nproc-per-node 8 -- meshtrain train --config gpt.toml");
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // A misspelt setting would otherwise be ignored without a word.
  for (const std::string& line : meshtrain::unknown_env_warnings())
    std::fprintf(stderr, "meshrun: warning: %s\n", line.c_str());
  config.command = positional;
  for (int i = split + 1; i < argc; ++i) config.command.emplace_back(argv[i]);
  // "N" (a fixed number of nodes) or "MIN:MAX" (elastic).
  if (!parse_nnodes(nnodes, config)) {
    std::fprintf(stderr,
                 "meshrun: error: --nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, "
                 "got '%s'\n",
                 nnodes.c_str());
    return 2;
  }
  config.rdzv_last_call = std::chrono::milliseconds(static_cast<int64_t>(last_call_s * 1000));
  config.grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
  config.rdzv_timeout = std::chrono::milliseconds(static_cast<int64_t>(rdzv_timeout_s * 1000));
  config.store_timeout = std::chrono::milliseconds(static_cast<int64_t>(store_timeout_s * 1000));
  if (ps_servers > 0) {
    // The fewest ranks the job may run with (an elastic job's MIN nodes).
    const int ranks =
        config.nproc_per_node * (config.min_nodes > 0 ? config.min_nodes : config.nnodes);
    if (ps_servers >= ranks) {
      std::fprintf(stderr,
                   "meshrun: error: --ps-servers %d leaves no worker among the %d ranks; start "
                   "more with --nproc-per-node\n",
                   ps_servers, ranks);
      return 2;
    }
    // Workers inherit it: meshtrain train runs parallel.mode = "parameter_server" with these
    // servers.
    ::setenv(std::string(meshtrain::env_name(meshtrain::Env::ps_servers)).c_str(),
             std::to_string(ps_servers).c_str(), 1);
  }
  try {
    // TLS: the flags become the MESHTRAIN_TLS* variables the workers inherit; the store this
    // agent hosts or reaches uses the same files. A missing file stops here (exit 2).
    meshtrain::comm::TlsSettings ts = meshtrain::comm::TlsSettings::from_env();
    auto flag = [](const std::string& value, const char* name, meshtrain::Env id, std::string& path,
                   std::string& from) {
      if (value.empty()) return;
      path = std::filesystem::absolute(value).string();
      from = name;
      ::setenv(std::string(meshtrain::env_name(id)).c_str(), path.c_str(), 1);
    };
    flag(tls_cert, "--tls-cert", meshtrain::Env::tls_cert, ts.cert, ts.cert_from);
    flag(tls_key, "--tls-key", meshtrain::Env::tls_key, ts.key, ts.key_from);
    flag(tls_ca, "--tls-ca", meshtrain::Env::tls_ca, ts.ca, ts.ca_from);
    if (tls || !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty()) {
      ts.enabled = true;
      ::setenv(std::string(meshtrain::env_name(meshtrain::Env::tls)).c_str(), "1", 1);
    }
    meshtrain::comm::set_default_tls(ts.enabled ? meshtrain::comm::TlsContext::load(ts) : nullptr);
    std::unique_ptr<meshtrain::obs::MetricsAggregator> aggregator;
    if (metrics_port > 0) {
      // Workers inherit MESHTRAIN_METRICS_PORT from this process's environment.
      using meshtrain::Env;
      const auto given = meshtrain::env_value(Env::metrics_port);
      const int base = given ? std::atoi(given->c_str()) : metrics_port + 1;
      if (!given) {
        ::setenv(std::string(meshtrain::env_name(Env::metrics_port)).c_str(),
                 std::to_string(base).c_str(), 1);
      }
      meshtrain::obs::MetricsAggregatorOptions mo;
      if (auto host = meshtrain::env_value(Env::metrics_host)) mo.host = *host;
      mo.port = metrics_port;
      mo.tls = meshtrain::comm::default_tls();
      for (int i = 0; i < config.nproc_per_node; ++i)
        mo.targets.push_back("127.0.0.1:" + std::to_string(base + i));
      aggregator = std::make_unique<meshtrain::obs::MetricsAggregator>(mo);
      std::fprintf(stderr, "meshrun: serving this node's metrics on %s\n",
                   aggregator->url().c_str());
    }
    meshtrain::runtime::LauncherAgent agent(std::move(config));
    return agent.run();
  } catch (const meshtrain::ValueError& e) {
    std::fprintf(stderr, "meshrun: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun: error: %s\n", e.what());
    return 1;
  }
}
