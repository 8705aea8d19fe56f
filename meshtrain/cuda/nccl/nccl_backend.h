// Registers the "nccl" ProcessGroup backend (collectives on CUDA device memory) with the comm
// layer's registry. Free of CUDA and NCCL headers: in a build without NCCL it returns false and
// registers nothing, so callers need no #if.
#pragma once

namespace meshtrain::cuda {

// True when the backend is now registered (built with NCCL); false otherwise. Idempotent.
bool register_nccl_backend();

}  // namespace meshtrain::cuda
