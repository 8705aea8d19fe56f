// HostLayout: host ids through the store, grouped into hosts.
#include "meshtrain/comm/host_layout.h"

#include <unistd.h>

#include <cstdlib>
#include <map>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr size_t kMaxHostIdBytes = 255;

}  // namespace

int HostLayout::multi_rank_hosts() const {
  int n = 0;
  for (const auto& h : hosts) n += h.size() > 1 ? 1 : 0;
  return n;
}

bool HostLayout::uniform() const {
  for (const auto& h : hosts) {
    if (h.size() != hosts.front().size()) return false;
  }
  return true;
}

std::string local_host_id(const ProcessGroupOptions& opts) {
  if (!opts.host_id.empty()) return opts.host_id;
  if (auto env = env_value(Env::host_id)) return *env;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

HostLayout make_host_layout(std::vector<std::string> host_of) {
  HostLayout l;
  l.host_of = std::move(host_of);
  const int n = static_cast<int>(l.host_of.size());
  l.host_index.assign(n, -1);
  l.local_rank.assign(n, -1);
  std::map<std::string, int> index;
  for (int r = 0; r < n; ++r) {
    auto [it, added] = index.emplace(l.host_of[r], static_cast<int>(l.hosts.size()));
    if (added) l.hosts.emplace_back();
    l.host_index[r] = it->second;
    l.local_rank[r] = static_cast<int>(l.hosts[it->second].size());
    l.hosts[it->second].push_back(r);
  }
  return l;
}

HostLayout exchange_host_layout(Store& store, const std::string& key_prefix, int rank, int size,
                                const std::string& mine) {
  MT_CHECK(!mine.empty() && mine.size() <= kMaxHostIdBytes, "host id must have 1 to ",
           kMaxHostIdBytes, " bytes, got ", mine.size());
  store.set_string(key_prefix + std::to_string(rank), mine);
  std::vector<std::string> ids(size);
  for (int q = 0; q < size; ++q) {
    ids[q] = q == rank ? mine : store.get_string(key_prefix + std::to_string(q));
    if (ids[q].empty() || ids[q].size() > kMaxHostIdBytes) {
      MT_THROW(CommError, "rank ", q, " published an invalid host id (", ids[q].size(), " bytes)");
    }
  }
  return make_host_layout(std::move(ids));
}

}  // namespace meshtrain::comm
