// Whether a process group can move tensors where they live: host backends (shm, tcp) read host
// memory, so tensors on a device need the device group (nccl). One line naming both otherwise.
#pragma once

#include <string_view>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/tensor/device.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

// `what`: the tensors, as the error names them ("the gradients", "ZeRO's parameters").
inline void check_group_reaches(const comm::ProcessGroup& pg, Device device,
                                std::string_view what) {
  MT_CHECK(device.is_cpu() || pg.backend_name() == "nccl", what, " are on ", device.str(),
           " but the process group is '", pg.backend_name(),
           "', which reads host memory; device tensors need the nccl backend");
}

}  // namespace meshtrain::parallel
