// 2-D convolution on the device through cuDNN 9 (its convolution API: the library PyTorch's CUDA
// convolutions use), with tensor/cpu/conv2d.h's semantics: NCHW f32, PyTorch's weight layout,
// stride, padding, dilation, groups, optional bias. The backward functions WRITE their gradients.
// Products run in f32 unless TF32 is allowed for matrix products (gemm.h's allow_tf32, the same
// switch as the GEMMs). cuDNN's heuristics rank the algorithms (deterministic ones preferred;
// algorithm_rank.h); one whose workspace does not fit or that cuDNN refuses at run time gives way
// to the next. The workspace comes from the caching allocator, on the stream the call runs on. An
// empty output (no sample, channel or position) writes zero gradients, as on the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "meshtrain/tensor/cpu/conv2d.h"

namespace meshtrain::cuda {

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    const cpu::Conv2dShape& s, cudaStream_t stream);
void conv2d_backward_data(float* dinp, const float* dout, const float* weight,
                          const cpu::Conv2dShape& s, cudaStream_t stream);
// dweight and dbias may each be null.
void conv2d_backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                             const cpu::Conv2dShape& s, cudaStream_t stream);

// "cuDNN 9.x.y", for checkpoints and benchmark records.
std::string cudnn_version();

}  // namespace meshtrain::cuda
