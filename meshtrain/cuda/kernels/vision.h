// The vision layers' kernels on the device besides convolution (conv2d.h): batch norm's steps,
// pooling and ReLU, with the semantics of tensor/cpu/batch_norm.h, pool2d.h and relu.h. Per-channel
// arrays (mean, invstd, the backward's terms) are device memory here; the kernel table uploads the
// host's. Reductions run in a fixed order (one block per channel or plane, a fixed tree), so a
// launch gives the same bits every time; they are not the CPU's bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/cpu/pool2d.h"

namespace meshtrain::cuda {

// sums[c] = sum of inp[:, c, :], sums[C + c] = sum of squares, in double (device memory).
void batch_norm_statistics(double* sums, const float* inp, int64_t N, int64_t C, int64_t HW,
                           cudaStream_t stream);
// out = (inp - mean[c]) * invstd[c] * weight[c] + bias[c] (weight, bias may be null).
void batch_norm_apply(float* out, const float* inp, const float* mean, const float* invstd,
                      const float* weight, const float* bias, int64_t N, int64_t C, int64_t HW,
                      cudaStream_t stream);
// sums[c] = sum dout, sums[C + c] = sum dout * xhat, in double (device memory).
void batch_norm_backward_reduce(double* sums, const float* dout, const float* inp,
                                const float* mean, const float* invstd, int64_t N, int64_t C,
                                int64_t HW, cudaStream_t stream);
// dinp = weight * invstd * (dout - terms[c] - xhat * terms[C + c]) with terms = the total sums over
// the count (float), or weight * invstd * dout when terms is null (evaluation). Written.
void batch_norm_backward_apply(float* dinp, const float* dout, const float* inp, const float* mean,
                               const float* invstd, const float* weight, const float* terms,
                               int64_t N, int64_t C, int64_t HW, cudaStream_t stream);

void max_pool2d_forward(float* out, int32_t* argmax, const float* inp, const cpu::Pool2dShape& s,
                        cudaStream_t stream);
// Accumulates into dinp: each input position sums the gradients of the windows whose argmax it
// is (a gather: no atomics, a fixed order).
void max_pool2d_backward(float* dinp, const float* dout, const int32_t* argmax,
                         const cpu::Pool2dShape& s, cudaStream_t stream);
void avg_pool2d_forward(float* out, const float* inp, const cpu::Pool2dShape& s,
                        bool count_include_pad, cudaStream_t stream);
void avg_pool2d_backward(float* dinp, const float* dout, const cpu::Pool2dShape& s,
                         bool count_include_pad, cudaStream_t stream);
void global_avg_pool_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW,
                             cudaStream_t stream);
void global_avg_pool_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW,
                              cudaStream_t stream);

void relu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
void relu_backward(float* dinp, const float* dout, const float* out, int64_t n,
                   cudaStream_t stream);

}  // namespace meshtrain::cuda
