// See worker_environment.h.
#include "meshtrain/runtime/worker_environment.h"

#include <set>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

bool is_worker_identity_variable(const std::string& name) {
  static const std::set<std::string> kNames = [] {
    std::set<std::string> names = {
        "RANK",      "LOCAL_RANK",  "WORLD_SIZE",  "LOCAL_WORLD_SIZE",          "GROUP_RANK",
        "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"};
    for (Env id : {Env::token, Env::token_file, Env::store_host, Env::rank, Env::world_size,
                   Env::local_rank, Env::local_world_size, Env::group_rank, Env::master_addr,
                   Env::master_port, Env::restart_count, Env::replacement, Env::grace_period_ms,
                   Env::rdzv_backend, Env::rdzv_endpoint, Env::rdzv_id, Env::elastic_min_nodes})
      names.emplace(env_name(id));
    return names;
  }();
  return kNames.count(name) > 0;
}

std::vector<std::string> worker_environment(std::span<const std::string> inherited,
                                            const WorkerIdentity& who) {
  std::vector<std::string> env;
  for (const std::string& entry : inherited) {
    if (!is_worker_identity_variable(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  auto put = [&](std::string_view name, const std::string& value) {
    env.push_back(detail::str_cat(name, "=", value));
  };
  put("RANK", std::to_string(who.rank));
  put("LOCAL_RANK", std::to_string(who.local_rank));
  put("WORLD_SIZE", std::to_string(who.world_size));
  put("LOCAL_WORLD_SIZE", std::to_string(who.local_world_size));
  put("GROUP_RANK", std::to_string(who.group_rank));
  put("ROLE_RANK", std::to_string(who.rank));
  put("MASTER_ADDR", who.master_addr);
  put("MASTER_PORT", std::to_string(who.master_port));
  put("TORCHELASTIC_RESTART_COUNT", std::to_string(who.restart_count));
  if (who.replacement > 0) put(env_name(Env::replacement), std::to_string(who.replacement));
  put(env_name(Env::token), who.token);
  if (who.grace_period_ms > 0)
    put(env_name(Env::grace_period_ms), std::to_string(who.grace_period_ms));
  put(env_name(Env::store_host), "agent");
  if (who.min_nodes > 0) put(env_name(Env::elastic_min_nodes), std::to_string(who.min_nodes));
  if (who.rdzv_backend == "etcd") {
    put(env_name(Env::rdzv_backend), "etcd");
    put(env_name(Env::rdzv_endpoint), who.rdzv_endpoint);
    put(env_name(Env::rdzv_id), who.rdzv_id);
  }
  return env;
}

}  // namespace meshtrain::runtime
