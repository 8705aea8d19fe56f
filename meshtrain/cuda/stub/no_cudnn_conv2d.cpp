// conv2d.h for a CUDA build without cuDNN: convolutions on the device are refused in one line.
#include "meshtrain/cuda/kernels/conv2d.h"

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

[[noreturn]] void refuse() {
  MT_THROW(Error,
           "conv2d on a cuda tensor: this build has no cuDNN (the CUDA toolkit's libcudnn "
           "was not found when it was configured); rebuild with cuDNN installed");
}

}  // namespace

void conv2d_forward(float*, const float*, const float*, const float*, const cpu::Conv2dShape&,
                    cudaStream_t) {
  refuse();
}
void conv2d_backward_data(float*, const float*, const float*, const cpu::Conv2dShape&,
                          cudaStream_t) {
  refuse();
}
void conv2d_backward_weights(float*, float*, const float*, const float*, const cpu::Conv2dShape&,
                             cudaStream_t) {
  refuse();
}
std::string cudnn_version() {
  return "no cuDNN: this build was configured without cuDNN 9's headers, so it never loads "
         "libcudnn.so.9; rebuild with cuDNN installed";
}

}  // namespace meshtrain::cuda
