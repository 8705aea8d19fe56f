// Layout moves are grid-stride loops over the packed side (coalesced reads and writes of each
// head's HS contiguous channels). The softmax kernels own one row per block and reduce in a fixed
// tree (launch.cuh), so every run gives the same bits.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/attention_parts.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

constexpr int kRowBlock = 256;

// Index of packed element (b, t, c) in the per-head layout [B, NH, T, HS].
struct HeadIndex {
  int64_t T, C, HS, NH;
  __device__ int64_t operator()(int64_t packed, int64_t* bt_row) const {
    const int64_t c = packed % C;
    const int64_t bt = packed / C;
    const int64_t t = bt % T, b = bt / T;
    *bt_row = bt;
    return ((b * NH + c / HS) * T + t) * HS + c % HS;
  }
};

__global__ void split_qkv_kernel(float* q, float* k, float* v, const float* qkv, int64_t n,
                                 HeadIndex hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = 0;
    const int64_t j = hi(i, &bt);
    const float* row = qkv + bt * 3 * hi.C + i % hi.C;
    q[j] = row[0];
    k[j] = row[hi.C];
    v[j] = row[2 * hi.C];
  }
}

__global__ void merge_qkv_kernel(float* dqkv, const float* dq, const float* dk, const float* dv,
                                 int64_t n, HeadIndex hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = 0;
    const int64_t j = hi(i, &bt);
    float* row = dqkv + bt * 3 * hi.C + i % hi.C;
    row[0] = dq[j];
    row[hi.C] = dk[j];
    row[2 * hi.C] = dv[j];
  }
}

__global__ void split_heads_kernel(float* y, const float* x, int64_t n, HeadIndex hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = 0;
    y[hi(i, &bt)] = x[i];
  }
}

__global__ void merge_heads_kernel(float* x, const float* y, int64_t n, HeadIndex hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = 0;
    x[i] = y[hi(i, &bt)];
  }
}

// Each thread reads and writes only its own columns s = threadIdx.x + k * blockDim.x, so the
// row can be rewritten in place between the reductions.
__global__ void causal_softmax_forward_kernel(float* att, int64_t T) {
  __shared__ float red[kRowBlock / detail::kWarp];
  const int64_t r = blockIdx.x;
  const int64_t t = r % T;
  float* x = att + r * T;
  float m = -INFINITY;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) m = fmaxf(m, x[s]);
  m = detail::block_max(m, red);
  float sum = 0.0f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) sum += expf(x[s] - m);
  const float inv = 1.0f / detail::block_sum(sum, red);
  for (int64_t s = threadIdx.x; s < T; s += blockDim.x) x[s] = s <= t ? expf(x[s] - m) * inv : 0.0f;
}

__global__ void causal_softmax_backward_kernel(float* g, const float* att, int64_t T) {
  __shared__ float red[kRowBlock / detail::kWarp];
  const int64_t r = blockIdx.x;
  const int64_t t = r % T;
  float* gr = g + r * T;
  const float* a = att + r * T;
  float part = 0.0f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) part += a[s] * gr[s];
  const float total = detail::block_sum(part, red);
  for (int64_t s = threadIdx.x; s < T; s += blockDim.x)
    gr[s] = s <= t ? a[s] * (gr[s] - total) : 0.0f;
}

HeadIndex head_index(int64_t T, int64_t C, int64_t NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not divisible by NH=", NH);
  return HeadIndex{T, C, C / NH, NH};
}

}  // namespace

void split_qkv(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T, int64_t C,
               int64_t NH, cudaStream_t stream) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  split_qkv_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(q, k, v, qkv, n,
                                                                       head_index(T, C, NH));
  MT_CUDA_CHECK_LAUNCH();
}

void merge_qkv(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t B, int64_t T,
               int64_t C, int64_t NH, cudaStream_t stream) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  merge_qkv_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(dqkv, dq, dk, dv, n,
                                                                       head_index(T, C, NH));
  MT_CUDA_CHECK_LAUNCH();
}

void split_heads(float* y, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                 cudaStream_t stream) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  split_heads_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(y, x, n,
                                                                         head_index(T, C, NH));
  MT_CUDA_CHECK_LAUNCH();
}

void merge_heads(float* x, const float* y, int64_t B, int64_t T, int64_t C, int64_t NH,
                 cudaStream_t stream) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  merge_heads_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(x, y, n,
                                                                         head_index(T, C, NH));
  MT_CUDA_CHECK_LAUNCH();
}

void causal_softmax_forward(float* att, int64_t rows, int64_t T, cudaStream_t stream) {
  if (rows <= 0 || T <= 0) return;
  causal_softmax_forward_kernel<<<static_cast<unsigned>(rows), kRowBlock, 0, stream>>>(att, T);
  MT_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(float* g, const float* att, int64_t rows, int64_t T,
                             cudaStream_t stream) {
  if (rows <= 0 || T <= 0) return;
  causal_softmax_backward_kernel<<<static_cast<unsigned>(rows), kRowBlock, 0, stream>>>(g, att, T);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
