// See indexed_job_patch.h.
#include "meshtrain/plan/indexed_job_patch.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

namespace meshtrain::plan {
namespace {

// (node name, ranks on it), in node-rank order (the order of the node's first rank).
std::vector<std::pair<std::string, int>> nodes_and_ranks(const Inventory& inv, const Placement& p) {
  std::vector<std::pair<std::string, int>> out;
  for (const DeviceRef& r : p.ranks) {
    const std::string& name = inv.nodes.at(static_cast<size_t>(r.node)).name;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == name; });
    if (it == out.end())
      out.emplace_back(name, 1);
    else
      ++it->second;
  }
  return out;
}

}  // namespace

std::string indexed_job_patch_yaml(const Inventory& inv, const Placement& p) {
  const auto nodes = nodes_and_ranks(inv, p);
  std::ostringstream os;
  os << "# meshtrain place: job " << p.job << " on " << nodes.size() << " node(s), "
     << p.ranks.size() << " rank(s). A strategic-merge patch for deploy/k8s/indexed-job\n"
     << "# (kustomize patchesStrategicMerge); the args go with " << p.job << ".k8s-args.yaml.\n"
     << "apiVersion: batch/v1\n"
     << "kind: Job\n"
     << "metadata:\n"
     << "  name: meshtrain\n"
     << "spec:\n"
     << "  completions: " << nodes.size() << "\n"
     << "  parallelism: " << nodes.size() << "\n"
     << "  template:\n"
     << "    spec:\n"
     << "      affinity:\n"
     << "        nodeAffinity:\n"
     << "          requiredDuringSchedulingIgnoredDuringExecution:\n"
     << "            nodeSelectorTerms:\n"
     << "            - matchExpressions:\n"
     << "              - key: kubernetes.io/hostname\n"
     << "                operator: In\n"
     << "                values:\n";
  for (const auto& [name, ranks] : nodes) os << "                - " << name << "\n";
  return os.str();
}

// The ranks every node holds; nullopt when they differ (or there are none).
std::optional<int> even_ranks_per_node(const Inventory& inv, const Placement& p) {
  const auto nodes = nodes_and_ranks(inv, p);
  if (nodes.empty()) return std::nullopt;
  for (const auto& n : nodes)
    if (n.second != nodes.front().second) return std::nullopt;
  return nodes.front().second;
}

std::optional<std::string> indexed_job_args_patch_yaml(const Inventory& inv, const Placement& p) {
  const auto per_node = even_ranks_per_node(inv, p);
  if (!per_node) return std::nullopt;
  const auto nodes = nodes_and_ranks(inv, p);
  std::ostringstream os;
  os << "# meshtrain place: job " << p.job
     << ". A JSON 6902 patch for deploy/k8s/indexed-job (kustomize patchesJson6902,\n"
     << "# target batch/v1 Job meshtrain): args[0] is --nnodes and args[6] --nproc-per-node.\n"
     << "- op: replace\n"
     << "  path: /spec/template/spec/containers/0/args/0\n"
     << "  value: --nnodes=" << nodes.size() << ":" << nodes.size() << "\n"
     << "- op: replace\n"
     << "  path: /spec/template/spec/containers/0/args/6\n"
     << "  value: --nproc-per-node=" << *per_node << "\n";
  return os.str();
}

std::optional<std::string> indexed_job_gpu_patch_yaml(const Inventory& inv, const Placement& p) {
  const auto per_node = even_ranks_per_node(inv, p);
  if (!per_node) return std::nullopt;
  std::ostringstream os;
  os << "# meshtrain place: job " << p.job << ". For the GPU overlay of deploy/k8s/indexed-job\n"
     << "# (kustomize patchesStrategicMerge): one GPU per rank of the pod.\n"
     << "apiVersion: batch/v1\n"
     << "kind: Job\n"
     << "metadata:\n"
     << "  name: meshtrain\n"
     << "spec:\n"
     << "  template:\n"
     << "    spec:\n"
     << "      containers:\n"
     << "      - name: meshtrain\n"
     << "        resources:\n"
     << "          requests:\n"
     << "            nvidia.com/gpu: \"" << *per_node << "\"\n"
     << "          limits:\n"
     << "            nvidia.com/gpu: \"" << *per_node << "\"\n";
  return os.str();
}

}  // namespace meshtrain::plan
