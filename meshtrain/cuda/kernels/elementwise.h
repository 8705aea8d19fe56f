// Elementwise f32 kernels on the device, the counterparts of tensor/cpu/elementwise.h, plus the
// column sum that bias gradients need. out may alias an input.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// out[n] = a[n] + b[n] and a[n] * b[n].
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
void mul(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
// out[n] = a[n] + row[n % width] (tensor/cpu/reduce.h's add_rows).
void add_rows(float* out, const float* a, const float* row, int64_t n, int64_t width,
              cudaStream_t stream);
// out[outer, inner] = the sum over m of inp[outer, mid, inner] in m order from zero
// (tensor/cpu/reduce.h's sum_dim, its bits): a thread an output element.
void sum_dim(float* out, const float* inp, int64_t outer, int64_t mid, int64_t inner,
             cudaStream_t stream);
// out[n] = a[n] * s.
void scale(float* out, const float* a, float s, int64_t n, cudaStream_t stream);
// xs[i][0 .. ns[i]) *= s for i < count, scale's bits, a launch per few dozen arrays (the pointer
// arrays are host memory): the gradients of a model with hundreds of parameters in one pass. The
// arrays must not overlap (blocks of one launch scale them at once).
void scale_many(float* const* xs, const int64_t* ns, int64_t count, float s, cudaStream_t stream);
// y[n] += alpha * x[n].
void axpy(float* y, const float* x, float alpha, int64_t n, cudaStream_t stream);
// out[C] += sum over rows of a[N, C], in a fixed order (the same bits on every run).
void column_sum_accumulate(float* out, const float* a, int64_t N, int64_t C, cudaStream_t stream);
// The same over a[N, C] of f32, bf16 or f16 (`type`), widened as read and summed in f32: the bias
// gradient of a half product from its half gradient, reading half the bytes.
void column_sum_accumulate(float* out, const void* a, DType type, int64_t N, int64_t C,
                           cudaStream_t stream);
// The same written over out (a bias gradient into a fresh buffer).
void column_sums(float* out, const void* a, DType type, int64_t N, int64_t C, cudaStream_t stream);

}  // namespace meshtrain::cuda
