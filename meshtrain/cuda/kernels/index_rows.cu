// Grid-stride loops over the n x C elements for the gather and the scatter (consecutive threads
// walk one row's columns); the backward takes one block a row for its dot product.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/index_rows.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

__global__ void gather_rows_kernel(float* out, const float* src, const int32_t* rows, int64_t n,
                                   int64_t C) {
  MT_GRID_STRIDE(k, n * C) {
    const int64_t i = k / C, c = k % C;
    out[k] = src[int64_t{rows[i]} * C + c];
  }
}

__global__ void scatter_add_rows_kernel(float* out, const float* src, const int32_t* rows,
                                        const float* weights, int64_t n, int64_t C) {
  MT_GRID_STRIDE(k, n * C) {
    const int64_t i = k / C, c = k % C;
    float* o = out + int64_t{rows[i]} * C + c;
    *o = weights == nullptr ? *o + src[k] : *o + weights[i] * src[k];
  }
}

constexpr int kRowBlock = 256;

__global__ void weighted_rows_backward_kernel(float* dsrc, float* dweights, const float* dout,
                                              const float* src, const float* weights,
                                              const int32_t* rows, int64_t C) {
  __shared__ double partial[kRowBlock];
  const int64_t m = blockIdx.x;
  const float* row = dout + int64_t{rows[m]} * C;
  const float w = weights[m];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dsrc[m * C + c] = w * row[c];
    dot += static_cast<double>(row[c]) * src[m * C + c];
  }
  partial[threadIdx.x] = dot;
  __syncthreads();
  for (int s = kRowBlock / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) dweights[m] = static_cast<float>(partial[0]);
}

}  // namespace

void gather_rows(float* out, const float* src, const int32_t* rows, int64_t n, int64_t C,
                 cudaStream_t stream) {
  if (n <= 0 || C <= 0) return;
  gather_rows_kernel<<<detail::grid_for(n * C), detail::kBlock, 0, stream>>>(out, src, rows, n, C);
  MT_CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(float* out, const float* src, const int32_t* rows, const float* weights,
                      int64_t n, int64_t C, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return;
  scatter_add_rows_kernel<<<detail::grid_for(n * C), detail::kBlock, 0, stream>>>(out, src, rows,
                                                                                  weights, n, C);
  MT_CUDA_CHECK_LAUNCH();
}

void weighted_rows_backward(float* dsrc, float* dweights, const float* dout, const float* src,
                            const float* weights, const int32_t* rows, int64_t n, int64_t C,
                            cudaStream_t stream) {
  if (n <= 0) return;
  weighted_rows_backward_kernel<<<static_cast<unsigned>(n), kRowBlock, 0, stream>>>(
      dsrc, dweights, dout, src, weights, rows, C);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
