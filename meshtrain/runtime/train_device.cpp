// train.device: the checks that turn a missing GPU into one line, and the nccl group.
#include "meshtrain/runtime/train_device.h"

#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/device_support.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

Device resolve_train_device(const ResolvedConfig& config, int local_rank) {
  const std::string& setting = config.config.train.device;
  if (config.device.is_cpu()) return Device::cpu();
  Device d = config.device;
  if (config.device_per_local_rank) d = Device::cuda(local_rank);
  const int n = cuda::device_count();
  if (n == 0)
    MT_THROW(ValueError, "config: train.device = \"", setting,
             "\" but this process cannot use CUDA: ", cuda::unavailable_reason());
  if (d.index >= n)
    MT_THROW(ValueError, "config: train.device = \"", setting, "\" means ", d.str(),
             (setting == "cuda" ? " (LOCAL_RANK " + std::to_string(local_rank) + ")" : ""),
             " but this process sees ", n, " CUDA device", n == 1 ? "" : "s",
             "; start at most one rank per device");
  cuda::use_device(d.index);
  const std::string why = cuda::unsupported_reason(d.index, config.precision);
  if (!why.empty()) MT_THROW(ValueError, "config: train.device = \"", setting, "\": ", why);
  return d;
}

comm::ProcessGroupPtr device_process_group(Device device, const comm::ProcessGroupPtr& cpu_group,
                                           std::shared_ptr<comm::Store> store,
                                           comm::Duration timeout) {
  if (device.is_cpu() || !cpu_group) return cpu_group;
  if (!cuda::register_nccl_backend())
    MT_THROW(ValueError, "train.device = ", device.str(), " with ", cpu_group->size(),
             " ranks needs the nccl backend, and this build has no NCCL");
  MT_CHECK(store != nullptr, "the nccl group needs the rendezvous store");
  comm::ProcessGroupOptions po = cpu_group->options();
  po.name = cpu_group->options().name + "-nccl";
  po.timeout = timeout;
  return comm::make_process_group("nccl", std::move(store), cpu_group->rank(), cpu_group->size(),
                                  po);
}

}  // namespace meshtrain::runtime
