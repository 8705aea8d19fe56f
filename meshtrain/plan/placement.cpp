#include "meshtrain/plan/placement.h"

#include <toml++/toml.h>
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

toml::table parse_toml(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    MT_THROW(IoError, what, " ", path, " does not exist or is not a regular file");
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    MT_THROW(ValueError, what, " ", path, ":", e.source().begin.line, ": ", e.description());
  }
}

}  // namespace

void validate(const Inventory& inv) {
  if (inv.nodes.empty()) MT_THROW(ValueError, "the inventory has no nodes");
  std::set<std::string> names;
  for (const NodeInfo& n : inv.nodes) {
    if (n.name.empty()) MT_THROW(ValueError, "inventory: a node has no name");
    if (!names.insert(n.name).second)
      MT_THROW(ValueError, "inventory: node ", n.name, " is listed twice");
    if (n.devices <= 0) MT_THROW(ValueError, "inventory: node ", n.name, ": devices must be > 0");
    if (!n.islands.empty()) {
      int64_t sum = 0;
      for (int64_t s : n.islands) {
        if (s <= 0) MT_THROW(ValueError, "inventory: node ", n.name, ": an island is empty");
        sum += s;
      }
      if (sum != n.devices)
        MT_THROW(ValueError, "inventory: node ", n.name, ": islands add up to ", sum,
                 " devices but the node has ", n.devices);
    }
    std::set<int64_t> used;
    for (int64_t d : n.used) {
      if (d < 0 || d >= n.devices)
        MT_THROW(ValueError, "inventory: node ", n.name, ": used device ", d,
                 " does not exist (devices 0..", n.devices - 1, ")");
      if (!used.insert(d).second)
        MT_THROW(ValueError, "inventory: node ", n.name, ": used device ", d, " is listed twice");
    }
    if (n.device_memory <= 0)
      MT_THROW(ValueError, "inventory: node ", n.name, ": device_memory_gb must be > 0");
  }
}

Inventory load_inventory(const std::string& path) {
  const toml::table root = parse_toml(path, "inventory");
  const toml::array* nodes = root["node"].as_array();
  if (nodes == nullptr) MT_THROW(ValueError, "inventory ", path, ": no [[node]] tables");
  Inventory inv;
  for (const toml::node& el : *nodes) {
    const toml::table* t = el.as_table();
    if (t == nullptr) MT_THROW(ValueError, "inventory ", path, ": node entries must be tables");
    NodeInfo n;
    n.name = (*t)["name"].value_or(std::string());
    const std::string who = "inventory " + path + ": node " + (n.name.empty() ? "?" : n.name);
    for (const auto& [key, v] : *t) {
      static const std::set<std::string> known = {"name",    "rack", "devices",
                                                  "islands", "used", "device_memory_gb"};
      if (!known.count(std::string(key.str())))
        MT_THROW(ValueError, who, ": unknown key ", key.str());
      (void)v;
    }
    n.rack = (*t)["rack"].value_or(std::string("rack0"));
    n.devices = (*t)["devices"].value_or(int64_t{8});
    n.device_memory = (*t)["device_memory_gb"].value_or(80.0) * 1e9;
    auto ints = [&](const char* key, std::vector<int64_t>& out) {
      const toml::node* node = t->get(key);
      if (node == nullptr) return;
      const toml::array* a = node->as_array();
      if (a == nullptr) MT_THROW(ValueError, who, ": ", key, " must be a list of integers");
      for (const toml::node& x : *a) {
        auto v = x.value<int64_t>();
        if (!v) MT_THROW(ValueError, who, ": ", key, " must be a list of integers");
        out.push_back(*v);
      }
    };
    ints("islands", n.islands);
    ints("used", n.used);
    inv.nodes.push_back(std::move(n));
  }
  validate(inv);
  return inv;
}

Inventory synthetic_inventory(int64_t racks, int64_t nodes_per_rack, int64_t devices,
                              int64_t island) {
  Inventory inv;
  for (int64_t r = 0; r < racks; ++r)
    for (int64_t i = 0; i < nodes_per_rack; ++i) {
      NodeInfo n;
      n.name = "r" + std::to_string(r) + "n" + std::to_string(i);
      n.rack = "rack" + std::to_string(r);
      n.devices = devices;
      for (int64_t d = 0; d < devices; d += island)
        n.islands.push_back(std::min(island, devices - d));
      inv.nodes.push_back(std::move(n));
    }
  return inv;
}

std::vector<JobRequest> load_jobs(const std::string& path) {
  const toml::table root = parse_toml(path, "job queue");
  const toml::array* jobs = root["job"].as_array();
  if (jobs == nullptr) MT_THROW(ValueError, "job queue ", path, ": no [[job]] tables");
  std::vector<JobRequest> out;
  std::set<std::string> names;
  for (const toml::node& el : *jobs) {
    const toml::table* t = el.as_table();
    if (t == nullptr) MT_THROW(ValueError, "job queue ", path, ": job entries must be tables");
    JobRequest j;
    j.name = (*t)["name"].value_or(std::string("job") + std::to_string(out.size()));
    const std::string who = "job queue " + path + ": job " + j.name;
    if (!names.insert(j.name).second) MT_THROW(ValueError, who, " is listed twice");
    if (auto layout = (*t)["layout"].value<std::string>()) {
      const std::filesystem::path lp = std::filesystem::path(*layout).is_absolute()
                                           ? std::filesystem::path(*layout)
                                           : std::filesystem::path(path).parent_path() / *layout;
      const toml::table plan = parse_toml(lp.string(), "layout");
      j.tp = plan["parallel"]["tp"].value_or(int64_t{1});
      j.pp = plan["parallel"]["pp"].value_or(int64_t{1});
    }
    j.tp = (*t)["tp"].value_or(j.tp);
    j.pp = (*t)["pp"].value_or(j.pp);
    j.priority = (*t)["priority"].value_or(int64_t{0});
    j.memory_per_device = (*t)["memory_gb"].value_or(0.0) * 1e9;
    const int64_t devices = (*t)["devices"].value_or(int64_t{0});
    if (j.tp <= 0 || j.pp <= 0) MT_THROW(ValueError, who, ": tp and pp must be > 0");
    if (auto dp = (*t)["dp"].value<int64_t>()) {
      j.dp = *dp;
      if (devices != 0 && devices != j.devices())
        MT_THROW(ValueError, who, ": devices = ", devices, " but dp x tp x pp = ", j.devices());
    } else if (devices > 0) {
      if (devices % (j.tp * j.pp) != 0)
        MT_THROW(ValueError, who, ": devices = ", devices,
                 " is not a multiple of tp x pp = ", j.tp * j.pp);
      j.dp = devices / (j.tp * j.pp);
    }
    if (j.dp <= 0) MT_THROW(ValueError, who, ": dp must be > 0");
    out.push_back(std::move(j));
  }
  return out;
}

Policy parse_policy(const std::string& s) {
  if (s == "topology") return Policy::kTopology;
  if (s == "round-robin") return Policy::kRoundRobin;
  if (s == "first-fit") return Policy::kFirstFit;
  MT_THROW(ValueError, "placement policy \"", s,
           "\" is not one of topology, round-robin, first-fit");
}

ClusterState::ClusterState(Inventory inv) : inv_(std::move(inv)) {
  validate(inv_);
  for (const NodeInfo& n : inv_.nodes) {
    owner_.emplace_back(static_cast<size_t>(n.devices), "");
    for (int64_t d : n.used) owner_.back()[static_cast<size_t>(d)] = "-";
    std::vector<int> isl(static_cast<size_t>(n.devices), 0);
    if (!n.islands.empty()) {
      int64_t d = 0;
      for (size_t i = 0; i < n.islands.size(); ++i)
        for (int64_t k = 0; k < n.islands[i]; ++k)
          isl[static_cast<size_t>(d++)] = static_cast<int>(i);
    }
    island_of_.push_back(std::move(isl));
  }
}

int64_t ClusterState::free_devices() const {
  int64_t f = 0;
  for (const auto& node : owner_)
    for (const auto& o : node) f += o.empty() ? 1 : 0;
  return f;
}

int64_t ClusterState::total_devices() const {
  int64_t f = 0;
  for (const auto& node : owner_) f += static_cast<int64_t>(node.size());
  return f;
}

void ClusterState::take(const JobRequest& job, const std::vector<DeviceRef>& devs) {
  for (const DeviceRef& r : devs)
    owner_[static_cast<size_t>(r.node)][static_cast<size_t>(r.device)] = job.name;
  running_[job.name] = job;
  placed_[job.name] = devs;
  order_.push_back(job.name);
}

void ClusterState::release(const std::string& job) {
  auto it = placed_.find(job);
  if (it == placed_.end()) return;
  for (const DeviceRef& r : it->second)
    owner_[static_cast<size_t>(r.node)][static_cast<size_t>(r.device)] = "";
  placed_.erase(it);
  running_.erase(job);
  order_.erase(std::remove(order_.begin(), order_.end(), job), order_.end());
}

std::optional<std::vector<DeviceRef>> ClusterState::choose_topology(const JobRequest& job) {
  const int64_t W = job.devices();
  const size_t nn = inv_.nodes.size();
  // The unit kept together: a TP group when it fits in a node, else single devices.
  struct Cap {
    int64_t free = 0, groups = 0;
    bool eligible = false;
  };
  std::vector<Cap> cap(nn);
  for (size_t n = 0; n < nn; ++n) {
    const NodeInfo& node = inv_.nodes[n];
    if (job.memory_per_device > node.device_memory) continue;
    std::map<int, int64_t> free_in_island;
    int64_t largest = 0;
    for (size_t d = 0; d < owner_[n].size(); ++d) {
      if (owner_[n][d].empty()) {
        ++cap[n].free;
        ++free_in_island[island_of_[n][d]];
      }
    }
    for (int64_t s : node.islands) largest = std::max(largest, s);
    if (node.islands.empty()) largest = node.devices;
    cap[n].eligible = true;
    if (job.tp <= largest) {
      for (const auto& [i, f] : free_in_island) cap[n].groups += f / job.tp;
    } else if (job.tp <= node.devices) {
      cap[n].groups = cap[n].free / job.tp;
    } else {
      cap[n].groups = cap[n].free;  // units of one device
    }
  }
  const bool unit_is_group = [&] {
    for (const NodeInfo& n : inv_.nodes)
      if (job.tp > n.devices) return false;
    return true;
  }();
  const int64_t unit = unit_is_group ? job.tp : 1;
  const int64_t need = W / unit;

  std::vector<size_t> chosen;
  // One node: the fullest that fits (best fit keeps empty nodes for big jobs).
  for (size_t n = 0; n < nn; ++n) {
    if (!cap[n].eligible || cap[n].groups < need) continue;
    if (chosen.empty() || cap[n].free < cap[chosen[0]].free) chosen = {n};
  }
  if (chosen.empty()) {
    // Fewest nodes: the emptiest first. Within one rack when a rack can do it with no more
    // nodes than the whole cluster needs.
    auto greedy = [&](const std::vector<size_t>& pool) {
      std::vector<size_t> p = pool;
      std::stable_sort(p.begin(), p.end(),
                       [&](size_t a, size_t b) { return cap[a].groups > cap[b].groups; });
      std::vector<size_t> got;
      int64_t have = 0;
      for (size_t n : p) {
        if (have >= need) break;
        if (cap[n].groups == 0) continue;
        got.push_back(n);
        have += cap[n].groups;
      }
      if (have < need) got.clear();
      return got;
    };
    std::vector<size_t> all;
    std::map<std::string, std::vector<size_t>> racks;
    std::vector<std::string> rack_order;
    for (size_t n = 0; n < nn; ++n) {
      if (!cap[n].eligible) continue;
      all.push_back(n);
      if (!racks.count(inv_.nodes[n].rack)) rack_order.push_back(inv_.nodes[n].rack);
      racks[inv_.nodes[n].rack].push_back(n);
    }
    const std::vector<size_t> global = greedy(all);
    if (global.empty()) return std::nullopt;
    chosen = global;
    int64_t best_left = -1;
    for (const std::string& r : rack_order) {
      std::vector<size_t> got = greedy(racks[r]);
      if (got.empty() || got.size() > global.size()) continue;
      int64_t left = 0;
      for (size_t n : got) left += cap[n].groups;
      left -= need;
      if (best_left < 0 || got.size() < chosen.size() || left < best_left) {
        chosen = got;
        best_left = left;
      }
    }
    // Racks together, in inventory order, so stage neighbours cross a rack at most once.
    std::stable_sort(chosen.begin(), chosen.end(), [&](size_t a, size_t b) {
      const auto ra = std::find(rack_order.begin(), rack_order.end(), inv_.nodes[a].rack);
      const auto rb = std::find(rack_order.begin(), rack_order.end(), inv_.nodes[b].rack);
      return ra < rb;
    });
  }

  // Fill the chosen nodes in order, unit by unit; a TP group goes to the island with the fewest
  // free devices that still holds it whole.
  std::vector<DeviceRef> out;
  int64_t placed_units = 0;
  for (size_t n : chosen) {
    std::vector<std::vector<int>> free_by_island;
    for (size_t d = 0; d < owner_[n].size(); ++d) {
      if (!owner_[n][d].empty()) continue;
      const size_t i = static_cast<size_t>(island_of_[n][d]);
      if (free_by_island.size() <= i) free_by_island.resize(i + 1);
      free_by_island[i].push_back(static_cast<int>(d));
    }
    const bool by_island = unit > 1 && cap[n].groups > 0 && [&] {
      int64_t g = 0;
      for (const auto& f : free_by_island) g += static_cast<int64_t>(f.size()) / unit;
      return g == cap[n].groups;
    }();
    std::vector<int> pool;  // node-level when TP groups do not fit islands
    for (const auto& f : free_by_island) pool.insert(pool.end(), f.begin(), f.end());
    std::sort(pool.begin(), pool.end());
    size_t pool_next = 0;
    for (int64_t g = 0; g < cap[n].groups && placed_units < need; ++g, ++placed_units) {
      if (by_island) {
        int best = -1;
        for (size_t i = 0; i < free_by_island.size(); ++i) {
          const auto sz = static_cast<int64_t>(free_by_island[i].size());
          if (sz >= unit && (best < 0 || sz < static_cast<int64_t>(free_by_island[best].size())))
            best = static_cast<int>(i);
        }
        auto& f = free_by_island[static_cast<size_t>(best)];
        for (int64_t k = 0; k < unit; ++k)
          out.push_back({static_cast<int>(n), f[static_cast<size_t>(k)]});
        f.erase(f.begin(), f.begin() + unit);
      } else {
        for (int64_t k = 0; k < unit; ++k) out.push_back({static_cast<int>(n), pool[pool_next++]});
      }
    }
  }
  if (static_cast<int64_t>(out.size()) != W) return std::nullopt;
  return out;
}

std::optional<std::vector<DeviceRef>> ClusterState::choose(const JobRequest& job, Policy policy) {
  const int64_t W = job.devices();
  if (W > free_devices()) return std::nullopt;
  if (policy == Policy::kTopology) return choose_topology(job);
  std::vector<DeviceRef> out;
  const size_t nn = inv_.nodes.size();
  auto ok = [&](size_t n) { return job.memory_per_device <= inv_.nodes[n].device_memory; };
  if (policy == Policy::kFirstFit) {
    for (size_t n = 0; n < nn && static_cast<int64_t>(out.size()) < W; ++n) {
      if (!ok(n)) continue;
      for (size_t d = 0; d < owner_[n].size() && static_cast<int64_t>(out.size()) < W; ++d)
        if (owner_[n][d].empty()) out.push_back({static_cast<int>(n), static_cast<int>(d)});
    }
  } else {
    // Round-robin: one rank per node in turn, from where the last job stopped.
    std::vector<size_t> next_dev(nn, 0);
    size_t misses = 0;
    while (static_cast<int64_t>(out.size()) < W && misses < nn) {
      const size_t n = rr_next_ % nn;
      rr_next_ = (rr_next_ + 1) % nn;
      bool got = false;
      if (ok(n)) {
        while (next_dev[n] < owner_[n].size()) {
          const size_t d = next_dev[n]++;
          if (owner_[n][d].empty()) {
            out.push_back({static_cast<int>(n), static_cast<int>(d)});
            got = true;
            break;
          }
        }
      }
      misses = got ? 0 : misses + 1;
    }
  }
  if (static_cast<int64_t>(out.size()) != W) return std::nullopt;
  return out;
}

std::optional<Placement> ClusterState::place(const JobRequest& job, Policy policy, bool preempt) {
  MT_CHECK(job.devices() > 0, "job ", job.name, " asks for no devices");
  if (running_.count(job.name)) MT_THROW(ValueError, "job ", job.name, " is already placed");
  Placement p;
  p.job = job.name;
  if (auto devs = choose(job, policy)) {
    take(job, *devs);
    p.ranks = *devs;
    return p;
  }
  if (!preempt) return std::nullopt;
  // Lowest priority first; among equals the most recently placed (it has run the least).
  std::vector<std::pair<size_t, std::string>> victims;
  for (size_t i = 0; i < order_.size(); ++i)
    if (running_.at(order_[i]).priority < job.priority) victims.push_back({i, order_[i]});
  std::sort(victims.begin(), victims.end(), [&](const auto& a, const auto& b) {
    const int64_t pa = running_.at(a.second).priority, pb = running_.at(b.second).priority;
    return pa != pb ? pa < pb : a.first > b.first;
  });
  const auto saved_owner = owner_;
  const auto saved_running = running_;
  const auto saved_placed = placed_;
  const auto saved_order = order_;
  for (const auto& victim : victims) {
    const std::string& v = victim.second;
    release(v);
    p.preempted.push_back(v);
    if (auto devs = choose(job, policy)) {
      take(job, *devs);
      p.ranks = *devs;
      return p;
    }
  }
  owner_ = saved_owner;
  running_ = saved_running;
  placed_ = saved_placed;
  order_ = saved_order;
  return std::nullopt;
}

PlacedTraffic ClusterState::traffic(const JobRequest& job, const Placement& p) const {
  PlacedTraffic t;
  auto edge = [&](int64_t a, int64_t b, double bytes) {
    const DeviceRef& x = p.ranks[static_cast<size_t>(a)];
    const DeviceRef& y = p.ranks[static_cast<size_t>(b)];
    t.total += bytes;
    if (x.node != y.node) t.cross_node += bytes;
    if (inv_.nodes[static_cast<size_t>(x.node)].rack !=
        inv_.nodes[static_cast<size_t>(y.node)].rack)
      t.cross_rack += bytes;
  };
  auto rank = [&](int64_t pi, int64_t d, int64_t ti) { return (pi * job.dp + d) * job.tp + ti; };
  for (int64_t pi = 0; pi < job.pp; ++pi)
    for (int64_t d = 0; d < job.dp; ++d)
      for (int64_t ti = 0; ti < job.tp; ++ti) {
        if (job.tp > 1) edge(rank(pi, d, ti), rank(pi, d, (ti + 1) % job.tp), job.traffic.tp);
        if (job.dp > 1) edge(rank(pi, d, ti), rank(pi, (d + 1) % job.dp, ti), job.traffic.dp);
        if (pi + 1 < job.pp) edge(rank(pi, d, ti), rank(pi + 1, d, ti), job.traffic.pp);
      }
  return t;
}

namespace {

// Nodes in the order their first rank appears, with their devices in rank order.
std::vector<std::pair<int, std::vector<int>>> nodes_in_rank_order(const Placement& p) {
  std::vector<std::pair<int, std::vector<int>>> out;
  for (const DeviceRef& r : p.ranks) {
    auto it =
        std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == r.node; });
    if (it == out.end()) {
      out.push_back({r.node, {}});
      it = out.end() - 1;
    }
    it->second.push_back(r.device);
  }
  return out;
}

}  // namespace

std::string rank_table(const Inventory& inv, const Placement& p) {
  std::ostringstream os;
  os << "# rank node device rack\n";
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const NodeInfo& n = inv.nodes[static_cast<size_t>(p.ranks[r].node)];
    os << r << " " << n.name << " " << p.ranks[r].device << " " << n.rack << "\n";
  }
  return os.str();
}

std::string hostfile(const Inventory& inv, const Placement& p) {
  std::ostringstream os;
  for (const auto& [node, devs] : nodes_in_rank_order(p))
    os << inv.nodes[static_cast<size_t>(node)].name << " slots=" << devs.size() << "\n";
  return os.str();
}

std::string meshrun_commands(const Inventory& inv, const Placement& p) {
  std::ostringstream os;
  const auto nodes = nodes_in_rank_order(p);
  // meshrun numbers ranks node by node, so a node must hold consecutive ranks.
  size_t r = 0;
  bool contiguous = true;
  for (const auto& [node, devs] : nodes)
    for (size_t k = 0; k < devs.size(); ++k, ++r)
      contiguous = contiguous && p.ranks[r].node == node;
  if (!contiguous)
    os << "# ranks of one node are not consecutive: start the ranks from the rank table\n";
  const std::string master = inv.nodes[static_cast<size_t>(nodes.front().first)].name;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& [node, devs] = nodes[i];
    os << "# on " << inv.nodes[static_cast<size_t>(node)].name << "\n";
    os << "CUDA_VISIBLE_DEVICES=";
    for (size_t k = 0; k < devs.size(); ++k) os << (k ? "," : "") << devs[k];
    os << " MASTER_ADDR=" << master << " meshrun --nnodes " << nodes.size() << " --node-rank " << i
       << " --nproc-per-node " << devs.size() << " -- meshtrain train --config CONFIG\n";
  }
  return os.str();
}

std::string node_affinity_yaml(const Inventory& inv, const Placement& p) {
  std::ostringstream os;
  os << "affinity:\n"
     << "  nodeAffinity:\n"
     << "    requiredDuringSchedulingIgnoredDuringExecution:\n"
     << "      nodeSelectorTerms:\n"
     << "        - matchExpressions:\n"
     << "            - key: kubernetes.io/hostname\n"
     << "              operator: In\n"
     << "              values:\n";
  for (const auto& [node, devs] : nodes_in_rank_order(p))
    os << "                - " << inv.nodes[static_cast<size_t>(node)].name << "\n";
  return os.str();
}

}  // namespace meshtrain::plan
