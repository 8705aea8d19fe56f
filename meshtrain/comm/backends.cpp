// Registration of the built-in backends.
#include "meshtrain/comm/backends.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/comm/process_group_tcp.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

std::string host_id(const ProcessGroupOptions& opts) {
  if (!opts.host_id.empty()) return opts.host_id;
  if (const char* env = std::getenv("MESHTRAIN_HOST_ID"); env != nullptr && *env != '\0')
    return env;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// "auto": every rank publishes its host id; one host means shm, several mean tcp.
ProcessGroupPtr make_auto(std::shared_ptr<Store> store, int rank, int size,
                          const ProcessGroupOptions& opts) {
  const std::string prefix = "pg/" + opts.name + "/auto/host/";
  const std::string mine = host_id(opts);
  store->set_string(prefix + std::to_string(rank), mine);
  bool one_host = true;
  for (int q = 0; q < size && one_host; ++q) {
    if (q != rank) one_host = store->get_string(prefix + std::to_string(q)) == mine;
  }
  // Every rank must pick the same backend: count the ranks that saw one host, once all voted.
  const std::string base = "pg/" + opts.name + "/auto/";
  store->add(base + "one_host", one_host ? 1 : 0);
  store->add(base + "voted", 1);
  auto deadline = std::chrono::steady_clock::now() + store->timeout();
  while (store->add(base + "voted", 0) < size) {
    if (std::chrono::steady_clock::now() > deadline) {
      MT_THROW(CommError, "auto backend: not every rank joined group '", opts.name, "'");
    }
    ::usleep(1000);
  }
  bool all = store->add(base + "one_host", 0) == size;
  return make_process_group(all ? "shm" : "tcp", std::move(store), rank, size, opts);
}

}  // namespace

void register_builtin_backends() {
  register_backend("shm",
                   [](std::shared_ptr<Store> store, int rank, int size,
                      const ProcessGroupOptions& opts) -> ProcessGroupPtr {
                     return std::make_shared<ShmProcessGroup>(std::move(store), rank, size, opts);
                   });
  register_backend("tcp",
                   [](std::shared_ptr<Store> store, int rank, int size,
                      const ProcessGroupOptions& opts) -> ProcessGroupPtr {
                     return std::make_shared<TcpProcessGroup>(std::move(store), rank, size, opts);
                   });
  register_backend("auto", make_auto);
}

}  // namespace meshtrain::comm
