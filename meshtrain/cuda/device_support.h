// Whether training in a given precision can run on a device with this build: the build has code
// for the device's architecture, and the device has the products the precision needs. The
// message parts are plain functions, tested on every machine; the device query needs CUDA.
#pragma once

#include <string>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// "sm_80, sm_90" from nvcc's architecture list "800,900".
std::string architectures_named(const std::string& list);

// Empty when a device `device` (its description) of compute capability major.minor can train in
// `precision` with kernels built for `built_for`; else one line that says what is wrong and what
// to do. `image_error` is the runtime's answer when it found no code for the device (empty if
// it did).
std::string support_problem(const std::string& device, int major, int minor, DType precision,
                            const std::string& built_for, const std::string& image_error);

// This build's architectures, named as above.
std::string compiled_architectures();

// support_problem for device `index` of this process (empty when it can train in `precision`).
std::string unsupported_reason(int index, DType precision);

}  // namespace meshtrain::cuda
