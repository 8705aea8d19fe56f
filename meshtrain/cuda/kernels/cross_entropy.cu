// One block per row: a max pass and a sum-of-exp pass over the logits (they stay in L2 between
// the passes at GPT vocabularies), never storing probabilities. The backward recomputes
// exp(x - lse) per element. Half logits are widened as they are read: the arithmetic is the f32
// kernel's, on the rounded values.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/cross_entropy.h"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

using detail::load_f32;
using detail::store_f32;

constexpr int kCeBlock = 512;

template <typename T>
__global__ void ce_forward_kernel(float* losses, float* lse, const T* logits,
                                  const int32_t* targets, int64_t V, int32_t ignore_index) {
  __shared__ float shared[kCeBlock / detail::kWarp];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, load_f32(x, v));
  m = detail::block_max(m, shared);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(load_f32(x, v) - m);
  sum = detail::block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const float l = m + logf(sum);
    lse[row] = l;
    const int32_t t = targets[row];
    if (t == ignore_index) {
      losses[row] = 0.0f;
    } else if (t < 0 || t >= V) {
      losses[row] = NAN;
    } else {
      losses[row] = l - load_f32(x, t);
    }
  }
}

// A single block: thread i sums rows i, i + blockDim, ... in double, then a fixed tree combines.
__global__ void ce_mean_kernel(float* mean_loss, const float* losses, const int32_t* targets,
                               int64_t N, int32_t ignore_index) {
  __shared__ double total[1024];
  __shared__ long long count[1024];
  double t = 0.0;
  long long c = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (targets[n] == ignore_index) continue;
    t += losses[n];
    ++c;
  }
  total[threadIdx.x] = t;
  count[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      total[threadIdx.x] += total[threadIdx.x + s];
      count[threadIdx.x] += count[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *mean_loss = count[0] == 0 ? NAN : static_cast<float>(total[0] / static_cast<double>(count[0]));
}

// scale = dloss / (rows not ignored), 0 when every row is ignored: one block counts in a fixed
// tree, so the gradient's scale never visits the host.
__global__ void ce_grad_scale_kernel(float* scale, const float* dloss, const int32_t* targets,
                                     int64_t N, int32_t ignore_index) {
  __shared__ long long count[1024];
  long long c = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) c += targets[n] != ignore_index;
  count[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) count[threadIdx.x] += count[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *scale = count[0] == 0 ? 0.0f : *dloss / static_cast<float>(count[0]);
}

// dlogits may be logits: each thread reads an element before it writes it, and no other.
template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                   const int32_t* targets, const float* scale, int64_t V,
                                   int32_t ignore_index) {
  const float g = *scale;
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  T* dx = dlogits + row * V;
  if (t == ignore_index) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) store_f32(dx, v, 0.0f);
    return;
  }
  const bool bad = t < 0 || t >= V;
  const T* x = logits + row * V;
  const float l = lse[row];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(load_f32(x, v) - l) * g;
    store_f32(dx, v, bad ? NAN : (v == t ? p - g : p));
  }
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, float* mean_loss, const void* logits,
                           DType type, const int32_t* targets, int64_t N, int64_t V,
                           int32_t ignore_index, cudaStream_t stream) {
  MT_CHECK(V >= 1, "cross_entropy: empty vocabulary");
  if (N > 0) {
    detail::with_float_type(type, "cross_entropy: logits", [&]<typename T>(T*) {
      ce_forward_kernel<<<static_cast<unsigned>(N), kCeBlock, 0, stream>>>(
          losses, lse, static_cast<const T*>(logits), targets, V, ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    });
  }
  if (mean_loss != nullptr) {
    ce_mean_kernel<<<1, 1024, 0, stream>>>(mean_loss, losses, targets, N, ignore_index);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void cross_entropy_backward(void* dlogits, const void* logits, DType type, const float* lse,
                            const int32_t* targets, const float* dloss, float* scale, int64_t N,
                            int64_t V, int32_t ignore_index, cudaStream_t stream) {
  if (N <= 0) return;
  ce_grad_scale_kernel<<<1, 1024, 0, stream>>>(scale, dloss, targets, N, ignore_index);
  MT_CUDA_CHECK_LAUNCH();
  detail::with_float_type(type, "cross_entropy: logits", [&]<typename T>(T*) {
    ce_backward_kernel<<<static_cast<unsigned>(N), kCeBlock, 0, stream>>>(
        static_cast<T*>(dlogits), static_cast<const T*>(logits), lse, targets, scale, V,
        ignore_index);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace meshtrain::cuda
