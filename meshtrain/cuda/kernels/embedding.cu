// Grid-stride loops over B*T*C elements; consecutive threads walk the channels of one token, so
// the table rows are read and written coalesced.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/embedding.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

__global__ void embedding_forward_kernel(float* out, const int32_t* idx, const float* wte,
                                         const float* wpe, int64_t T, int64_t C, int64_t V,
                                         int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int64_t c = i % C;
    const int64_t t = bt % T;
    const int32_t tok = idx[bt];
    out[i] = (tok >= 0 && tok < V) ? wte[tok * C + c] + wpe[t * C + c] : NAN;
  }
}

__global__ void embedding_wte_backward_kernel(float* dwte, const float* dout, const int32_t* idx,
                                              int64_t C, int64_t V, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int32_t tok = idx[bt];
    if (tok >= 0 && tok < V) atomicAdd(&dwte[tok * C + i % C], dout[i]);
  }
}

__global__ void embedding_wpe_backward_kernel(float* dwpe, const float* dout, int64_t B, int64_t T,
                                              int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T * C;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
    dwpe[i] += s;
  }
}

}  // namespace

void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  const int64_t total = B * T * C;
  if (total <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(total), detail::kBlock, 0, stream>>>(
      out, idx, wte, wpe, T, C, V, total);
  MT_CUDA_CHECK_LAUNCH();
}

void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  const int64_t total = B * T * C;
  if (total <= 0) return;
  if (dwte != nullptr) {
    embedding_wte_backward_kernel<<<detail::grid_for(total), detail::kBlock, 0, stream>>>(
        dwte, dout, idx, C, V, total);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dwpe != nullptr) {
    embedding_wpe_backward_kernel<<<detail::grid_for(T * C), detail::kBlock, 0, stream>>>(
        dwpe, dout, B, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace meshtrain::cuda
