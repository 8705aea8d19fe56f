// The device a training process runs on (train.device), and the process group its device
// tensors are reduced through. Kept apart from the trainer so that the command line can pick the
// device before it creates any group, and so that the choice is tested on machines without a GPU.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/tensor/device.h"

namespace meshtrain::runtime {

// The resolved train.device: cpu; "cuda" (device LOCAL_RANK, one device per rank); "cuda:N".
// For cuda it also makes the device this process's current one. Throws ValueError naming
// train.device and the reason when the build has no CUDA, there is no device, the index does not
// exist, the build has no code for the device's architecture, or the device lacks what
// train.precision needs (bf16 before compute capability 8.0).
Device resolve_train_device(const ResolvedConfig& config, int local_rank);

// The group that all-reduces gradients living on `device`: `cpu_group` itself for the CPU; for
// cuda a new "nccl" group over the same ranks, its NCCL id exchanged through `store` under
// pg/<name>/. Collective: every rank calls it. Throws when the build has no NCCL.
comm::ProcessGroupPtr device_process_group(Device device, const comm::ProcessGroupPtr& cpu_group,
                                           std::shared_ptr<comm::Store> store,
                                           comm::Duration timeout);

}  // namespace meshtrain::runtime
