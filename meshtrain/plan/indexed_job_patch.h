// A placement as kustomize patches for deploy/k8s/indexed-job: what `meshtrain place --out-dir`
// writes beside the hostfile so that the Indexed Job runs where the placement put it.
//
//   JOB.k8s-patch.yaml   a strategic-merge patch of the Job `meshtrain`: completions and
//                        parallelism = the placed nodes, and node affinity on their
//                        kubernetes.io/hostname (it replaces an overlay's pool affinity: the
//                        placement is the narrower choice)
//   JOB.k8s-args.yaml    a JSON 6902 patch of the container's args: --nnodes=N:N (args[0]) and
//                        --nproc-per-node=D (args[6]), the positions the base gives them; only
//                        when every node has the same number of ranks (one pod template serves
//                        every pod)
//   JOB.k8s-gpu.yaml     for the GPU overlay: a strategic-merge patch giving the container D
//                        GPUs (nvidia.com/gpu requests and limits); same condition
//
// Kubernetes has no per-index node choice for one pod template: the affinity keeps the pods on
// the placed nodes (and the overlays' anti-affinity one per node), but which completion index,
// i.e. node rank, lands on which of them is the scheduler's choice. Where rank order across nodes
// matters (pipeline neighbours), use the hostfile or meshrun commands instead.
#pragma once

#include <optional>
#include <string>

#include "meshtrain/plan/placement.h"

namespace meshtrain::plan {

std::string indexed_job_patch_yaml(const Inventory& inv, const Placement& p);
// nullopt when the nodes have different numbers of ranks.
std::optional<std::string> indexed_job_args_patch_yaml(const Inventory& inv, const Placement& p);
std::optional<std::string> indexed_job_gpu_patch_yaml(const Inventory& inv, const Placement& p);

}  // namespace meshtrain::plan
