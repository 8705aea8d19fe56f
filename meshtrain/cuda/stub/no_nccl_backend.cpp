// register_nccl_backend() in a build without NCCL: nothing to register.
#include "meshtrain/cuda/nccl/nccl_backend.h"

namespace meshtrain::cuda {

bool register_nccl_backend() {
  return false;
}

}  // namespace meshtrain::cuda
