// One block per row, one pass over the logits: each thread keeps a running maximum and the sum of
// exponentials relative to it (rescaled when the maximum grows), and the block combines those
// pairs in a fixed tree, so a row is read from memory once (a max pass then a sum pass read it
// twice wherever the rows in flight outgrow L2) and the bits are the same on every run. Rows whose
// length is a multiple of four are read four elements at a time. The backward recomputes
// exp(x - lse) per element. Half logits are widened as they are read: the arithmetic is f32, on
// the rounded values. Label smoothing adds the row's sum to the forward's pass (a third value per
// thread, combined by the same tree) and a constant to each gradient; without it the arithmetic
// is the plain loss's.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/cross_entropy.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

using detail::load_f32;
using detail::store_f32;

// The forward's blocks: each row's loss comes from the same tree whether or not the gradient is
// written with it (an evaluation's loss has the training step's bits).
constexpr int kCeForwardBlock = 1024;
constexpr int kCeBlock = 512;

// A running log-sum-exp: the maximum m seen so far and the sum s of exp(x - m).
struct OnlineSum {
  float m = -INFINITY, s = 0.0f;
  __device__ void add(float v) {
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else if (v != -INFINITY) {
      s += expf(v - m);
    }
  }
  __device__ void add4(float4 q) {
    const float top = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
    if (top > m) {
      s *= expf(m - top);
      m = top;
    }
    // -inf adds nothing (and -inf - -inf would be NaN); a NaN still makes the sum NaN.
    const auto term = [&](float v) { return v == -INFINITY ? 0.0f : expf(v - m); };
    s += term(q.x) + term(q.y) + term(q.z) + term(q.w);
  }
  __device__ void merge(float m2, float s2) {
    if (m2 > m) {
      s = s * expf(m - m2) + s2;
      m = m2;
    } else if (m2 != -INFINITY) {
      s += s2 * expf(m2 - m);
    } else {
      // The other side saw no finite value: its sum is 0, or NaN when it read a NaN (an all-NaN
      // quad, or a lone NaN in a scalar lane), which must reach the row's sum.
      s += s2;
    }
  }
};

// The gradient of one row's loss, (softmax - target) * g, over the row's logits, the target
// (1 - eps) on t and eps / V everywhere (the CPU's order: (p - eps / V) * g, then minus
// (1 - eps) * g on t); dx may be x: each thread reads its elements before it writes them, and no
// others.
template <typename T>
__device__ void write_row_gradient(T* dx, const T* x, float l, int32_t t, float g, int64_t V,
                                   int32_t ignore_index, bool quads, float eps) {
  const bool ignored = t == ignore_index, bad = !ignored && (t < 0 || t >= V);
  const float uniform = eps / static_cast<float>(V), on_target = (1.0f - eps) * g;
  const auto grad = [&](int64_t v, float xv) {
    if (ignored) return 0.0f;
    if (eps == 0.0f) {
      // The plain loss's expression as it was, so that its bits do not hang on how the compiler
      // contracts the smoothed one.
      const float p = expf(xv - l) * g;
      return bad ? NAN : (v == t ? p - g : p);
    }
    const float p = (expf(xv - l) - uniform) * g;
    return bad ? NAN : (v == t ? p - on_target : p);
  };
  if (quads) {
    for (int64_t i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 q = detail::load4_f32(x, i);
      const int64_t v = 4 * i;
      detail::store4_f32(
          dx, i, make_float4(grad(v, q.x), grad(v + 1, q.y), grad(v + 2, q.z), grad(v + 3, q.w)));
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) store_f32(dx, v, grad(v, load_f32(x, v)));
  }
}

// quads: V is a multiple of four and the logits 16-byte aligned (every row then starts on a whole
// four-element group); write_quads: dlogits too. The loss is read the way the forward alone reads
// it, wherever dlogits lies, so that it keeps the same bits. With dlogits the block goes over its
// row a second time, writing the gradient (scale = 1 / count); the row was read a moment before, so
// the second read comes from L2: blocks of 1024 threads keep two rows an SM in flight, a GPT-2 bf16
// step's 264 rows of 100 KB on an H100 or H200, well within its L2 (blocks of 512 would keep 528).
template <typename T>
__global__ void __launch_bounds__(kCeForwardBlock)
    ce_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t V,
                      int32_t ignore_index, bool quads, T* dlogits, const float* scale,
                      bool write_quads, float eps) {
  constexpr int kWarps = kCeForwardBlock / detail::kWarp;
  __shared__ float warp_m[kWarps], warp_s[kWarps], warp_r[kWarps];
  __shared__ float row_lse;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const bool smooth = eps != 0.0f;
  OnlineSum acc;
  float row_sum = 0.0f;  // label smoothing's sum of the row's logits
  if (quads) {
    for (int64_t i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 q = detail::load4_f32(x, i);
      acc.add4(q);
      if (smooth) row_sum += (q.x + q.y) + (q.z + q.w);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float xv = load_f32(x, v);
      acc.add(xv);
      if (smooth) row_sum += xv;
    }
  }
  for (int o = detail::kWarp / 2; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, acc.m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, acc.s, o);
    acc.merge(m2, s2);
    if (smooth) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, o);
  }
  const int warp = threadIdx.x / detail::kWarp;
  if (threadIdx.x % detail::kWarp == 0) {
    warp_m[warp] = acc.m;
    warp_s[warp] = acc.s;
    warp_r[warp] = row_sum;
  }
  __syncthreads();
  const int32_t t = targets[row];
  if (threadIdx.x == 0) {
    OnlineSum all;
    float all_sum = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / detail::kWarp); ++w) {
      all.merge(warp_m[w], warp_s[w]);
      all_sum += warp_r[w];
    }
    const float l = all.m + logf(all.s);
    lse[row] = l;
    row_lse = l;
    if (t == ignore_index) {
      losses[row] = 0.0f;
    } else if (t < 0 || t >= V) {
      losses[row] = NAN;
    } else if (!smooth) {
      losses[row] = l - load_f32(x, t);
    } else {
      losses[row] =
          (1.0f - eps) * (l - load_f32(x, t)) + eps * (l - all_sum / static_cast<float>(V));
    }
  }
  if (dlogits == nullptr) return;
  // Every read of the first pass (thread 0's of the target's logit too) is done before any
  // thread writes over the row.
  __syncthreads();
  write_row_gradient(dlogits + row * V, x, row_lse, t, *scale, V, ignore_index, write_quads, eps);
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

// scale = dloss / (rows not ignored) (dloss null: 1), 0 when every row is ignored: one block
// counts in a fixed tree, so the gradient's scale never visits the host.
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
  if (threadIdx.x == 0)
    *scale = count[0] == 0 ? 0.0f : (dloss ? *dloss : 1.0f) / static_cast<float>(count[0]);
}

// dlogits may be logits (write_row_gradient).
template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                   const int32_t* targets, const float* scale, int64_t V,
                                   int32_t ignore_index, bool quads, float eps) {
  const int64_t row = blockIdx.x;
  write_row_gradient(dlogits + row * V, logits + row * V, lse[row], targets[row], *scale, V,
                     ignore_index, quads, eps);
}

void check_smoothing(float label_smoothing) {
  MT_CHECK(label_smoothing >= 0.0f && label_smoothing < 1.0f,
           "cross_entropy: label_smoothing must be in [0, 1), got ", label_smoothing);
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, float* mean_loss, const void* logits,
                           DType type, const int32_t* targets, int64_t N, int64_t V,
                           int32_t ignore_index, cudaStream_t stream, void* dlogits, float* scale,
                           float label_smoothing) {
  MT_CHECK(V >= 1, "cross_entropy: empty vocabulary");
  check_smoothing(label_smoothing);
  MT_CHECK(dlogits == nullptr || scale != nullptr,
           "cross_entropy: the fused gradient needs a device float for its scale");
  if (N > 0) {
    if (dlogits != nullptr) {
      ce_grad_scale_kernel<<<1, 1024, 0, stream>>>(scale, nullptr, targets, N, ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    }
    detail::with_float_type(type, "cross_entropy: logits", [&]<typename T>(T*) {
      ce_forward_kernel<<<static_cast<unsigned>(N), kCeForwardBlock, 0, stream>>>(
          losses, lse, static_cast<const T*>(logits), targets, V, ignore_index,
          detail::quads(V, {logits}), static_cast<T*>(dlogits), scale,
          detail::quads(V, {logits, dlogits}), label_smoothing);
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
                            int64_t V, int32_t ignore_index, cudaStream_t stream,
                            float label_smoothing) {
  check_smoothing(label_smoothing);
  if (N <= 0) return;
  ce_grad_scale_kernel<<<1, 1024, 0, stream>>>(scale, dloss, targets, N, ignore_index);
  MT_CUDA_CHECK_LAUNCH();
  detail::with_float_type(type, "cross_entropy: logits", [&]<typename T>(T*) {
    ce_backward_kernel<<<static_cast<unsigned>(N), kCeBlock, 0, stream>>>(
        static_cast<T*>(dlogits), static_cast<const T*>(logits), lse, targets, scale, V,
        ignore_index, detail::quads(V, {logits, dlogits}), label_smoothing);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace meshtrain::cuda
