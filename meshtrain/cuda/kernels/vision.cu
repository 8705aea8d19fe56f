// See vision.h. Per-channel reductions take one block per channel and sum in double, as the CPU
// does; elementwise steps use grid-stride loops; pooling backward gathers, for each input
// position, the outputs whose windows cover it, so no two threads write one value.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/vision.h"

namespace meshtrain::cuda {
namespace {

using detail::grid_for;
using detail::kBlock;
using detail::kWarp;

__device__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ int64_t imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

__device__ double warp_sum_d(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block in a fixed tree; thread 0 gets the result. `shared` holds kBlock / 32.
__device__ double block_sum_d(double v, double* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / kWarp ? shared[threadIdx.x] : 0.0;
  if (warp == 0) v = warp_sum_d(v);
  return v;
}

// One block per channel c: the channel's N * HW values, each thread a fixed stride of them.
__global__ void bn_statistics_kernel(double* sums, const float* inp, int64_t N, int64_t C,
                                     int64_t HW) {
  __shared__ double shared[kBlock / kWarp];
  const int64_t c = blockIdx.x;
  double s1 = 0.0, s2 = 0.0;
  for (int64_t i = threadIdx.x; i < N * HW; i += blockDim.x) {
    const int64_t n = i / HW, j = i % HW;
    const double v = inp[(n * C + c) * HW + j];
    s1 += v;
    s2 += v * v;
  }
  s1 = block_sum_d(s1, shared);
  s2 = block_sum_d(s2, shared);
  if (threadIdx.x == 0) {
    sums[c] = s1;
    sums[C + c] = s2;
  }
}

__global__ void bn_backward_reduce_kernel(double* sums, const float* dout, const float* inp,
                                          const float* mean, const float* invstd, int64_t N,
                                          int64_t C, int64_t HW) {
  __shared__ double shared[kBlock / kWarp];
  const int64_t c = blockIdx.x;
  const float m = mean[c], s = invstd[c];
  double sdy = 0.0, sdyx = 0.0;
  for (int64_t i = threadIdx.x; i < N * HW; i += blockDim.x) {
    const int64_t at = ((i / HW) * C + c) * HW + i % HW;
    const double dy = dout[at];
    sdy += dy;
    sdyx += dy * static_cast<double>((inp[at] - m) * s);
  }
  sdy = block_sum_d(sdy, shared);
  sdyx = block_sum_d(sdyx, shared);
  if (threadIdx.x == 0) {
    sums[c] = sdy;
    sums[C + c] = sdyx;
  }
}

__global__ void bn_apply_kernel(float* out, const float* inp, const float* mean,
                                const float* invstd, const float* weight, const float* bias,
                                int64_t C, int64_t HW, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i / HW) % C;
    const float w = weight != nullptr ? weight[c] : 1.0f;
    const float b = bias != nullptr ? bias[c] : 0.0f;
    out[i] = (inp[i] - mean[c]) * invstd[c] * w + b;
  }
}

__global__ void bn_backward_apply_kernel(float* dinp, const float* dout, const float* inp,
                                         const float* mean, const float* invstd,
                                         const float* weight, const float* terms, int64_t C,
                                         int64_t HW, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i / HW) % C;
    const float s = invstd[c];
    const float k = (weight != nullptr ? weight[c] : 1.0f) * s;
    if (terms == nullptr) {
      dinp[i] = k * dout[i];
    } else {
      const float xhat = (inp[i] - mean[c]) * s;
      dinp[i] = k * (dout[i] - terms[c] - xhat * terms[C + c]);
    }
  }
}

struct Geometry {
  int64_t H, W, OH, OW, KH, KW, sh, sw, ph, pw;
};

Geometry geometry(const cpu::Pool2dShape& s) {
  return {s.H, s.W, s.out_h(), s.out_w(), s.KH, s.KW, s.stride_h, s.stride_w, s.pad_h, s.pad_w};
}

// The window of output (oh, ow) clipped to the image, and its count_include_pad divisor (the
// window clipped to the padded image): tensor/cpu/pool2d.cpp's Window.
struct Window {
  int64_t h0, h1, w0, w1, padded;
};

__device__ Window window_of(const Geometry& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  const int64_t he = imin(hs + g.KH, g.H + g.ph), we = imin(ws + g.KW, g.W + g.pw);
  return {imax(hs, 0), imin(he, g.H), imax(ws, 0), imin(we, g.W), (he - hs) * (we - ws)};
}

__device__ float divisor_of(const Window& w, bool count_include_pad) {
  return static_cast<float>(count_include_pad ? w.padded : (w.h1 - w.h0) * (w.w1 - w.w0));
}

// The outputs along one dimension whose windows cover input position x: [lo, hi).
__device__ void covering(int64_t x, int64_t pad, int64_t k, int64_t stride, int64_t out,
                         int64_t* lo, int64_t* hi) {
  const int64_t p = x + pad;  // position in the padded input
  const int64_t first = p - k + 1 <= 0 ? 0 : (p - k + 1 + stride - 1) / stride;
  *lo = first;
  *hi = imin(out, p / stride + 1);
}

__global__ void max_pool_forward_kernel(float* out, int32_t* argmax, const float* inp, Geometry g,
                                        int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const float* x = inp + plane * g.H * g.W;
    const Window w = window_of(g, oh, ow);
    float best = -INFINITY;
    int64_t at = w.h0 * g.W + w.w0;
    for (int64_t h = w.h0; h < w.h1; ++h)
      for (int64_t c = w.w0; c < w.w1; ++c) {
        const float v = x[h * g.W + c];
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          at = h * g.W + c;
        }
      }
    out[i] = best;
    if (argmax != nullptr) argmax[i] = static_cast<int32_t>(at);
  }
}

__global__ void max_pool_backward_kernel(float* dinp, const float* dout, const int32_t* argmax,
                                         Geometry g, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t x = i % g.W, y = (i / g.W) % g.H, plane = i / (g.W * g.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(y, g.ph, g.KH, g.sh, g.OH, &oh0, &oh1);
    covering(x, g.pw, g.KW, g.sw, g.OW, &ow0, &ow1);
    const int32_t here = static_cast<int32_t>(y * g.W + x);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = (plane * g.OH + oh) * g.OW + ow;
        if (argmax[o] == here) acc += dout[o];
      }
    dinp[i] += acc;
  }
}

__global__ void avg_pool_forward_kernel(float* out, const float* inp, Geometry g,
                                        bool count_include_pad, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = i % g.OW, oh = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const float* x = inp + plane * g.H * g.W;
    const Window w = window_of(g, oh, ow);
    float sum = 0.0f;
    for (int64_t h = w.h0; h < w.h1; ++h)
      for (int64_t c = w.w0; c < w.w1; ++c) sum += x[h * g.W + c];
    out[i] = sum / divisor_of(w, count_include_pad);
  }
}

__global__ void avg_pool_backward_kernel(float* dinp, const float* dout, Geometry g,
                                         bool count_include_pad, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t x = i % g.W, y = (i / g.W) % g.H, plane = i / (g.W * g.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(y, g.ph, g.KH, g.sh, g.OH, &oh0, &oh1);
    covering(x, g.pw, g.KW, g.sw, g.OW, &ow0, &ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow)
        acc += dout[(plane * g.OH + oh) * g.OW + ow] /
               divisor_of(window_of(g, oh, ow), count_include_pad);
    dinp[i] += acc;
  }
}

// One block per plane.
__global__ void global_avg_pool_forward_kernel(float* out, const float* inp, int64_t HW) {
  __shared__ double shared[kBlock / kWarp];
  const float* x = inp + blockIdx.x * HW;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) s += x[i];
  s = block_sum_d(s, shared);
  // The CPU's arithmetic: an empty plane averages to 0, not 0/0.
  const double inv = HW > 0 ? 1.0 / static_cast<double>(HW) : 0.0;
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(s * inv);
}

__global__ void global_avg_pool_backward_kernel(float* dinp, const float* dout, int64_t HW,
                                                int64_t total) {
  const float inv = 1.0f / static_cast<float>(HW);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x)
    dinp[i] += dout[i / HW] * inv;
}

__global__ void relu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = inp[i];
    out[i] = v < 0.0f ? 0.0f : v;  // as the CPU's: NaN passes, and so does -0
  }
}

__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

}  // namespace

void batch_norm_statistics(double* sums, const float* inp, int64_t N, int64_t C, int64_t HW,
                           cudaStream_t stream) {
  if (C <= 0) return;
  bn_statistics_kernel<<<static_cast<unsigned>(C), kBlock, 0, stream>>>(sums, inp, N, C, HW);
  MT_CUDA_CHECK(cudaGetLastError());
}

void batch_norm_apply(float* out, const float* inp, const float* mean, const float* invstd,
                      const float* weight, const float* bias, int64_t N, int64_t C, int64_t HW,
                      cudaStream_t stream) {
  const int64_t total = N * C * HW;
  if (total <= 0) return;
  bn_apply_kernel<<<grid_for(total), kBlock, 0, stream>>>(out, inp, mean, invstd, weight, bias, C,
                                                          HW, total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void batch_norm_backward_reduce(double* sums, const float* dout, const float* inp,
                                const float* mean, const float* invstd, int64_t N, int64_t C,
                                int64_t HW, cudaStream_t stream) {
  if (C <= 0) return;
  bn_backward_reduce_kernel<<<static_cast<unsigned>(C), kBlock, 0, stream>>>(sums, dout, inp, mean,
                                                                             invstd, N, C, HW);
  MT_CUDA_CHECK(cudaGetLastError());
}

void batch_norm_backward_apply(float* dinp, const float* dout, const float* inp, const float* mean,
                               const float* invstd, const float* weight, const float* terms,
                               int64_t N, int64_t C, int64_t HW, cudaStream_t stream) {
  const int64_t total = N * C * HW;
  if (total <= 0) return;
  bn_backward_apply_kernel<<<grid_for(total), kBlock, 0, stream>>>(dinp, dout, inp, mean, invstd,
                                                                   weight, terms, C, HW, total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void max_pool2d_forward(float* out, int32_t* argmax, const float* inp, const cpu::Pool2dShape& s,
                        cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.out_h() * s.out_w();
  if (total <= 0) return;
  max_pool_forward_kernel<<<grid_for(total), kBlock, 0, stream>>>(out, argmax, inp, geometry(s),
                                                                  total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void max_pool2d_backward(float* dinp, const float* dout, const int32_t* argmax,
                         const cpu::Pool2dShape& s, cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total <= 0) return;
  max_pool_backward_kernel<<<grid_for(total), kBlock, 0, stream>>>(dinp, dout, argmax, geometry(s),
                                                                   total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void avg_pool2d_forward(float* out, const float* inp, const cpu::Pool2dShape& s,
                        bool count_include_pad, cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.out_h() * s.out_w();
  if (total <= 0) return;
  avg_pool_forward_kernel<<<grid_for(total), kBlock, 0, stream>>>(out, inp, geometry(s),
                                                                  count_include_pad, total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void avg_pool2d_backward(float* dinp, const float* dout, const cpu::Pool2dShape& s,
                         bool count_include_pad, cudaStream_t stream) {
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total <= 0) return;
  avg_pool_backward_kernel<<<grid_for(total), kBlock, 0, stream>>>(dinp, dout, geometry(s),
                                                                   count_include_pad, total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void global_avg_pool_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW,
                             cudaStream_t stream) {
  if (N * C <= 0) return;
  global_avg_pool_forward_kernel<<<static_cast<unsigned>(N * C), kBlock, 0, stream>>>(out, inp, HW);
  MT_CUDA_CHECK(cudaGetLastError());
}

void global_avg_pool_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW,
                              cudaStream_t stream) {
  const int64_t total = N * C * HW;
  if (total <= 0) return;
  global_avg_pool_backward_kernel<<<grid_for(total), kBlock, 0, stream>>>(dinp, dout, HW, total);
  MT_CUDA_CHECK(cudaGetLastError());
}

void relu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  relu_forward_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, inp, n);
  MT_CUDA_CHECK(cudaGetLastError());
}

void relu_backward(float* dinp, const float* dout, const float* out, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  relu_backward_kernel<<<grid_for(n), kBlock, 0, stream>>>(dinp, dout, out, n);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshtrain::cuda
