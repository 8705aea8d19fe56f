// The messages of device_support.h: no CUDA header here, so that every build tests them.
#include <sstream>

#include "meshtrain/cuda/device_support.h"

namespace meshtrain::cuda {

std::string architectures_named(const std::string& list) {
  std::ostringstream out;
  std::istringstream in(list);
  std::string arch;
  bool first = true;
  while (std::getline(in, arch, ',')) {
    if (arch.empty()) continue;
    // nvcc's list gives 10 x the compute capability: 900 is sm_90, 1000 sm_100.
    const std::string digits = arch.size() > 1 ? arch.substr(0, arch.size() - 1) : arch;
    out << (first ? "" : ", ") << "sm_" << digits;
    first = false;
  }
  return first ? list : out.str();
}

std::string support_problem(const std::string& device, int major, int minor, DType precision,
                            const std::string& built_for, const std::string& image_error) {
  std::ostringstream why;
  if (!image_error.empty()) {
    why << device << " has no code in this build (" << image_error << "): its kernels are for "
        << built_for << "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" << major << minor
        << " (or scripts/gpu-bundle.sh --arch " << major << minor << ")";
    return why.str();
  }
  if (precision == DType::bf16 && major < 8) {
    why << device << " has no bf16 tensor cores (compute capability " << major << "." << minor
        << "; bf16 needs 8.0 or newer): use train.precision = \"f16\" (with loss scaling) or "
        << "\"f32\"";
    return why.str();
  }
  return "";
}

}  // namespace meshtrain::cuda
