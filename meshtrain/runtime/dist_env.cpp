// See dist_env.h. Each field remembers which variable it came from, so that a validation error
// names the variable the user has to fix.
#include "meshtrain/runtime/dist_env.h"

#include "meshtrain/runtime/job_store_keys.h"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <vector>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/etcd_store.h"
#include "meshtrain/comm/prefix_store.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::runtime {
namespace {

struct Field {
  int value = 0;
  std::string source;  // variable name, empty for a default
};

class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> str(const std::string& name) const {
    auto v = env_(name);
    if (v && v->empty()) return std::nullopt;  // set but empty counts as unset
    return v;
  }
  std::optional<std::string> str(Env id) const { return str(std::string(env_name(id))); }
  bool has(const std::string& name) const { return str(name).has_value(); }
  bool read(Env id, Field& field) const { return read(std::string(env_name(id)), field); }

  // Reads an integer variable into `field` when it is set.
  bool read(const std::string& name, Field& field) const {
    auto v = str(name);
    if (!v) return false;
    field.value = parse_int(name, *v);
    field.source = name;
    return true;
  }

  static int parse_int(const std::string& name, const std::string& text) {
    int v = 0;
    const char* b = text.data();
    const char* e = b + text.size();
    auto [ptr, ec] = std::from_chars(b, e, v);
    if (ec != std::errc() || ptr != e) {
      MT_THROW(ValueError, "environment variable ", name, "='", text, "' is not an integer");
    }
    return v;
  }

 private:
  const EnvLookup& env_;
};

void check_range(const Field& f, const char* what, int lo) {
  if (f.value < lo) {
    MT_THROW(ValueError, "environment variable ", f.source.empty() ? what : f.source, "=", f.value,
             " must be at least ", lo);
  }
}

void check_below(const Field& f, const Field& bound) {
  if (f.value >= bound.value) {
    MT_THROW(ValueError, "environment variable ", f.source, "=", f.value, " is not below ",
             bound.source.empty() ? "the size" : bound.source, "=", bound.value);
  }
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
  }
  std::string first = nodelist.substr(0, end);
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string ranges = first.substr(open + 1);
  size_t stop = ranges.find_first_of(",-]");
  std::string suffix;
  auto close = first.find(']');
  if (close != std::string::npos) suffix = first.substr(close + 1);
  return prefix + ranges.substr(0, stop) + suffix;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id) {
  int node = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string item =
        tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int count = 0;
    int repeat = 1;
    auto paren = item.find('(');
    count = Reader::parse_int("SLURM_TASKS_PER_NODE", item.substr(0, paren));
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')') {
        MT_THROW(ValueError, "environment variable SLURM_TASKS_PER_NODE='", tasks_per_node,
                 "' is malformed");
      }
      repeat = Reader::parse_int("SLURM_TASKS_PER_NODE",
                                 item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node_id < node + repeat) return count;
    node += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  MT_THROW(ValueError, "environment variable SLURM_TASKS_PER_NODE='", tasks_per_node,
           "' has no entry for node ", node_id);
}

DistEnv discover_dist_env() {
  return discover_dist_env([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

DistEnv discover_dist_env(const EnvLookup& lookup) {
  Reader env(lookup);
  DistEnv out;
  Field rank, world{1, ""}, local_rank, local_world{1, ""}, group_rank, restart;
  bool group_rank_known = false;
  std::optional<std::string> master_addr;

  if (env.has("RANK") && env.has("WORLD_SIZE")) {
    // torchrun, meshrun, Kubeflow PyTorchJob (one process per pod: no LOCAL_* variables).
    out.launcher = "torchrun";
    env.read("RANK", rank);
    env.read("WORLD_SIZE", world);
    env.read("LOCAL_RANK", local_rank);
    env.read("LOCAL_WORLD_SIZE", local_world);
    group_rank_known = env.read("GROUP_RANK", group_rank);
    env.read("TORCHELASTIC_RESTART_COUNT", restart);
  } else if (env.has("SLURM_PROCID")) {
    out.launcher = "slurm";
    env.read("SLURM_PROCID", rank);
    if (!env.read("SLURM_NTASKS", world)) env.read("SLURM_NPROCS", world);
    env.read("SLURM_LOCALID", local_rank);
    group_rank_known = env.read("SLURM_NODEID", group_rank);
    if (!env.read("SLURM_NTASKS_PER_NODE", local_world)) {
      if (auto tpn = env.str("SLURM_TASKS_PER_NODE")) {
        local_world.value = slurm_tasks_on_node(*tpn, group_rank.value);
        local_world.source = "SLURM_TASKS_PER_NODE";
      }
    }
    if (auto list = env.str("SLURM_JOB_NODELIST")) {
      master_addr = first_slurm_host(*list);
    } else if (auto list2 = env.str("SLURM_NODELIST")) {
      master_addr = first_slurm_host(*list2);
    } else if (auto ip = env.str("SLURM_LAUNCH_NODE_IPADDR")) {
      master_addr = *ip;
    }
    env.read("SLURM_RESTART_COUNT", restart);
  } else if (env.has("OMPI_COMM_WORLD_RANK")) {
    out.launcher = "openmpi";
    env.read("OMPI_COMM_WORLD_RANK", rank);
    env.read("OMPI_COMM_WORLD_SIZE", world);
    env.read("OMPI_COMM_WORLD_LOCAL_RANK", local_rank);
    env.read("OMPI_COMM_WORLD_LOCAL_SIZE", local_world);
  } else if (env.has("PMI_RANK")) {
    out.launcher = "pmi";
    env.read("PMI_RANK", rank);
    env.read("PMI_SIZE", world);
    env.read("MPI_LOCALRANKID", local_rank);
    env.read("MPI_LOCALNRANKS", local_world);
  }

  // Project settings win over whatever the launcher said.
  env.read(Env::rank, rank);
  env.read(Env::world_size, world);
  env.read(Env::local_rank, local_rank);
  env.read(Env::local_world_size, local_world);
  if (env.read(Env::group_rank, group_rank)) group_rank_known = true;
  env.read(Env::restart_count, restart);
  Field replacement{0, ""};
  env.read(Env::replacement, replacement);
  Field min_nodes{0, ""};
  env.read(Env::elastic_min_nodes, min_nodes);

  check_range(world, "WORLD_SIZE", 1);
  check_range(min_nodes, "MESHTRAIN_ELASTIC_MIN_NODES", 0);
  check_range(rank, "RANK", 0);
  check_range(local_world, "LOCAL_WORLD_SIZE", 1);
  check_range(local_rank, "LOCAL_RANK", 0);
  check_range(group_rank, "GROUP_RANK", 0);
  check_range(restart, "TORCHELASTIC_RESTART_COUNT", 0);
  check_below(rank, world);
  check_below(local_rank, local_world);
  if (local_world.value > world.value) {
    MT_THROW(ValueError, "environment variable ", local_world.source, "=", local_world.value,
             " exceeds ", world.source, "=", world.value);
  }
  if (!group_rank_known) {
    // Block placement (ranks of one node are consecutive), which every supported launcher uses.
    group_rank.value = rank.value / local_world.value;
  }

  if (auto a = env.str("MASTER_ADDR")) master_addr = *a;
  if (auto a = env.str(Env::master_addr)) master_addr = *a;
  if (master_addr) out.master_addr = *master_addr;
  Field port{kDefaultMasterPort, ""};
  env.read("MASTER_PORT", port);
  env.read(Env::master_port, port);
  if (port.value < 1 || port.value > 65535) {
    MT_THROW(ValueError, "environment variable ", port.source, "=", port.value,
             " is not a TCP port (1-65535)");
  }
  if (auto host = env.str(Env::store_host)) {
    if (*host == "agent") {
      out.agent_hosts_store = true;
    } else if (*host != "rank0") {
      MT_THROW(ValueError, "environment variable MESHTRAIN_STORE_HOST='", *host,
               "' must be 'agent' or 'rank0'");
    }
  }

  if (auto backend = env.str(Env::rdzv_backend)) {
    if (*backend != "tcp" && *backend != "etcd") {
      MT_THROW(ValueError, "environment variable MESHTRAIN_RDZV_BACKEND='", *backend,
               "' must be 'tcp' or 'etcd'");
    }
    out.store_backend = *backend;
  }
  if (out.store_backend == "etcd") {
    auto endpoint = env.str(Env::rdzv_endpoint);
    auto id = env.str(Env::rdzv_id);
    if (!endpoint || !id) {
      MT_THROW(ValueError,
               "MESHTRAIN_RDZV_BACKEND=etcd needs MESHTRAIN_RDZV_ENDPOINT (the etcd members, "
               "HOST:PORT[,HOST:PORT...]) and MESHTRAIN_RDZV_ID (the job id)");
    }
    comm::parse_etcd_endpoints(*endpoint);  // a malformed list fails here, naming itself
    out.store_endpoint = *endpoint;
    out.rdzv_id = *id;
  }

  if (out.launcher == "torchrun" && out.agent_hosts_store) out.launcher = "meshrun";
  out.rank = rank.value;
  out.world_size = world.value;
  out.local_rank = local_rank.value;
  out.local_world_size = local_world.value;
  out.group_rank = group_rank.value;
  out.restart_count = restart.value;
  out.replacement = replacement.value;
  out.elastic_min_nodes = min_nodes.value;
  out.master_port = static_cast<uint16_t>(port.value);
  return out;
}

std::string job_id(const DistEnv& env) {
  if (env.launcher == "none" && env.world_size == 1) return "";
  if (!env.rdzv_id.empty()) return env.rdzv_id;
  // The token itself is a secret and must not reach a file: its hash tells two jobs that use
  // one store address apart (one after the other on a port). A loopback store address is the
  // same on every host, so single-node jobs on two hosts add the host's name.
  std::string addr = env.master_addr;
  if (addr.starts_with("127.") || addr == "localhost" || addr == "::1") {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    addr = detail::str_cat(host, "/", addr);
  }
  return detail::str_cat(addr, ":", env.master_port, "/",
                         hash_hex(xxh3_64(comm::AuthToken::from_env().secret())).substr(0, 8));
}

std::shared_ptr<comm::Store> connect_store(const DistEnv& env, comm::Duration timeout) {
  comm::TcpStoreOptions options;
  options.timeout = timeout;
  std::shared_ptr<comm::Store> base;
  if (env.store_backend == "etcd") {
    comm::EtcdStoreOptions eo = comm::EtcdStoreOptions::from_env();
    eo.endpoints = comm::parse_etcd_endpoints(env.store_endpoint);
    eo.prefix = comm::etcd_job_prefix(env.rdzv_id);
    eo.timeout = timeout;
    base = std::make_shared<comm::EtcdStore>(std::move(eo));
  } else if (env.rank == 0 && !env.agent_hosts_store) {
    options.is_server = true;
    base = std::make_shared<comm::TcpStore>("127.0.0.1", env.master_port, options);
    MT_LOG_INFO("rendezvous", "rank 0 hosts the store on port ", env.master_port);
  } else {
    base = std::make_shared<comm::TcpStore>(env.master_addr, env.master_port, options);
  }
  return std::make_shared<comm::PrefixStore>(job_keys::run_prefix(env.restart_count),
                                             std::move(base));
}

}  // namespace meshtrain::runtime
