// Registration of the built-in backends and the "auto" choice.
#include "meshtrain/comm/backends.h"

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/process_group_hier.h"
#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/comm/process_group_tcp.h"

namespace meshtrain::comm {
namespace {

// Every rank reads every rank's host id, so all of them derive the same choice.
ProcessGroupPtr make_auto(std::shared_ptr<Store> store, int rank, int size,
                          const ProcessGroupOptions& opts) {
  HostLayout layout = exchange_host_layout(*store, "pg/" + opts.name + "/auto/host/", rank, size,
                                           local_host_id(opts));
  return make_process_group(auto_backend_for(layout), std::move(store), rank, size, opts);
}

}  // namespace

std::string auto_backend_for(const HostLayout& layout) {
  if (layout.num_hosts() <= 1) return "shm";
  if (layout.multi_rank_hosts() >= 2) return "hier";
  return "tcp";
}

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
  register_backend("hier",
                   [](std::shared_ptr<Store> store, int rank, int size,
                      const ProcessGroupOptions& opts) -> ProcessGroupPtr {
                     return std::make_shared<HierProcessGroup>(std::move(store), rank, size, opts);
                   });
  register_backend("auto", make_auto);
}

}  // namespace meshtrain::comm
