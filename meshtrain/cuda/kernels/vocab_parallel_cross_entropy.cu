// One block a row for the two reductions (a fixed tree: the same bits on every run); the backward
// is one block a row too, so that the row's maximum, sum and target are read once.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/vocab_parallel_cross_entropy.h"
#include "meshtrain/tensor/vocab_parallel_loss_mean.h"

namespace meshtrain::cuda {
namespace {

constexpr int kRowBlock = 512;

__device__ double block_sum_double(double v, double* shared) {
  const int lane = threadIdx.x % detail::kWarp;
  const int warp = threadIdx.x / detail::kWarp;
  const int warps = blockDim.x / detail::kWarp;
  for (int o = detail::kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0;
  for (int o = detail::kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void row_max_kernel(float* max, const float* logits, int64_t V, int64_t valid) {
  __shared__ float shared[kRowBlock / detail::kWarp];
  const float* l = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, l[v]);
  m = detail::block_max(m, shared);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

__global__ void row_sums_kernel(float* sum, float* target_logit, const float* logits,
                                const float* max, const int32_t* targets, int64_t V, int64_t valid,
                                int64_t begin, int32_t ignore_index) {
  __shared__ double shared[kRowBlock / detail::kWarp];
  const int64_t n = blockIdx.x;
  const float* l = logits + n * V;
  const float m = max[n];
  double s = 0;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) s += expf(l[v] - m);
  s = block_sum_double(s, shared);
  if (threadIdx.x == 0) {
    sum[n] = static_cast<float>(s);
    const int32_t t = targets[n];
    const int64_t col = int64_t{t} - begin;
    target_logit[n] = t != ignore_index && col >= 0 && col < valid ? l[col] : 0.0f;
  }
}

__global__ void backward_kernel(float* dlogits, const float* logits, const float* max,
                                const float* sum, const int32_t* targets, int64_t V, int64_t valid,
                                int64_t begin, int32_t ignore_index, const float* dloss,
                                const float* count) {
  const int64_t n = blockIdx.x;
  const float* l = logits + n * V;
  float* d = dlogits + n * V;
  const int32_t t = targets[n];
  if (t == ignore_index) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = 0.0f;
    return;
  }
  const float scale = *dloss / *count;
  const float m = max[n], inv = 1.0f / sum[n];
  const int64_t col = int64_t{t} - begin;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    // Each product and the difference rounded on its own, as the CPU's (no multiply-add).
    float g = v < valid ? __fmul_rn(__fmul_rn(expf(l[v] - m), inv), scale) : 0.0f;
    if (v == col && col < valid) g = __fsub_rn(g, scale);
    d[v] = g;
  }
}

// One thread: the CPU's loop (the rows are few next to the logits).
__global__ void loss_mean_kernel(float* out, const float* max, const float* sum,
                                 const float* target_logit, const int32_t* targets, int64_t N,
                                 int32_t ignore_index) {
  vocab_parallel_loss_mean_rows(out, max, sum, target_logit, targets, N, ignore_index);
}

unsigned rows_grid(int64_t N) {
  MT_CHECK(N <= 0x7fffffff, "vocab-parallel cross-entropy: ", N, " rows are too many for a grid");
  return static_cast<unsigned>(N);
}

}  // namespace

void vocab_parallel_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid,
                            cudaStream_t stream) {
  if (N <= 0) return;
  row_max_kernel<<<rows_grid(N), kRowBlock, 0, stream>>>(max, logits, V, valid);
  MT_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_row_sums(float* sum, float* target_logit, const float* logits, const float* max,
                             const int32_t* targets, int64_t N, int64_t V, int64_t valid,
                             int64_t begin, int32_t ignore_index, cudaStream_t stream) {
  if (N <= 0) return;
  row_sums_kernel<<<rows_grid(N), kRowBlock, 0, stream>>>(sum, target_logit, logits, max, targets,
                                                          V, valid, begin, ignore_index);
  MT_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_backward(float* dlogits, const float* logits, const float* max,
                             const float* sum, const int32_t* targets, int64_t N, int64_t V,
                             int64_t valid, int64_t begin, int32_t ignore_index, const float* dloss,
                             const float* count, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  backward_kernel<<<rows_grid(N), kRowBlock, 0, stream>>>(dlogits, logits, max, sum, targets, V,
                                                          valid, begin, ignore_index, dloss, count);
  MT_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_loss_mean(float* out, const float* max, const float* sum,
                              const float* target_logit, const int32_t* targets, int64_t N,
                              int32_t ignore_index, cudaStream_t stream) {
  loss_mean_kernel<<<1, 1, 0, stream>>>(out, max, sum, target_logit, targets, N, ignore_index);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
