// Block (t, b*NH + h) owns query row t of one head. Dot products over the head size are one warp
// each (lanes over channels); products with V loop over keys with threads over channels, so every
// read of a K or V row is coalesced. The backward's second kernel owns key row s and sums over
// the queries t >= s that attend to it, so no gradient needs atomics.
#include <cmath>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/attention.h"
#include "meshtrain/cuda/kernels/attention_shared.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

using detail::kWarp;
constexpr int kAttBlock = 128;
constexpr int kWarps = kAttBlock / kWarp;

struct Dims {
  int64_t T, C, NH, HS;
  float scale;
};

__device__ inline float dot_warp(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = threadIdx.x % kWarp; d < n; d += kWarp) s += a[d] * b[d];
  return detail::warp_sum(s);
}

__global__ void attention_forward_kernel(float* out, float* att, const float* qkv, Dims dm) {
  // attention_row_floats(T) floats: the row's scores, then probabilities; the padding past T is
  // only ever read by the compiler's wide loads, never used (attention_shared.h).
  extern __shared__ float p[];
  __shared__ float red[kWarps];
  const int64_t t = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / dm.NH, h = bh % dm.NH;
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * dm.HS;
  const float* q = base + t * C3;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int64_t s = warp; s <= t; s += kWarps) {
    const float v = dot_warp(q, base + s * C3 + dm.C, dm.HS);
    if (lane == 0) p[s] = v * dm.scale;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) m = fmaxf(m, p[s]);
  m = detail::block_max(m, red);
  float sum = 0.0f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    const float e = expf(p[s] - m);
    p[s] = e;
    sum += e;
  }
  const float inv = 1.0f / detail::block_sum(sum, red);  // block_sum syncs before reading p
  float* arow = att + (bh * dm.T + t) * dm.T;
  for (int64_t s = threadIdx.x; s < dm.T; s += blockDim.x) {
    const float v = s <= t ? p[s] * inv : 0.0f;
    if (s <= t) p[s] = v;
    arow[s] = v;
  }
  __syncthreads();
  float* o = out + (b * dm.T + t) * dm.C + h * dm.HS;
  for (int64_t d = threadIdx.x; d < dm.HS; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s <= t; ++s) acc += p[s] * base[s * C3 + 2 * dm.C + d];
    o[d] = acc;
  }
}

// Query row t: dpre[t, s] = att * (datt - sum(att * datt)) with datt[s] = dout_t . v_s, saved to
// scratch, and dq_t = scale * sum_s dpre[t, s] k_s.
__global__ void attention_backward_query_kernel(float* dqkv, float* scratch, const float* dout,
                                                const float* qkv, const float* att, Dims dm) {
  extern __shared__ float g[];  // attention_row_floats(T) floats: datt, then dpre
  __shared__ float red[kWarps];
  const int64_t t = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / dm.NH, h = bh % dm.NH;
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * dm.HS;
  const float* go = dout + (b * dm.T + t) * dm.C + h * dm.HS;
  const float* arow = att + (bh * dm.T + t) * dm.T;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int64_t s = warp; s <= t; s += kWarps) {
    const float v = dot_warp(go, base + s * C3 + 2 * dm.C, dm.HS);
    if (lane == 0) g[s] = v;
  }
  __syncthreads();
  float part = 0.0f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) part += arow[s] * g[s];
  const float total = detail::block_sum(part, red);
  float* drow = scratch + (bh * dm.T + t) * dm.T;
  for (int64_t s = threadIdx.x; s < dm.T; s += blockDim.x) {
    const float v = s <= t ? arow[s] * (g[s] - total) : 0.0f;
    if (s <= t) g[s] = v;
    drow[s] = v;
  }
  __syncthreads();
  float* dq = dqkv + (b * dm.T + t) * C3 + h * dm.HS;
  for (int64_t d = threadIdx.x; d < dm.HS; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s <= t; ++s) acc += g[s] * base[s * C3 + dm.C + d];
    dq[d] = acc * dm.scale;
  }
}

// Key row s: dk_s = scale * sum_{t >= s} dpre[t, s] q_t and dv_s = sum_{t >= s} att[t, s] dout_t.
__global__ void attention_backward_key_kernel(float* dqkv, const float* scratch, const float* dout,
                                              const float* qkv, const float* att, Dims dm) {
  const int64_t s = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / dm.NH, h = bh % dm.NH;
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * dm.HS;
  const float* gbase = dout + b * dm.T * dm.C + h * dm.HS;
  const float* dcol = scratch + bh * dm.T * dm.T + s;
  const float* acol = att + bh * dm.T * dm.T + s;
  float* dk = dqkv + (b * dm.T + s) * C3 + dm.C + h * dm.HS;
  float* dv = dk + dm.C;
  for (int64_t d = threadIdx.x; d < dm.HS; d += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int64_t t = s; t < dm.T; ++t) {
      ak += dcol[t * dm.T] * base[t * C3 + d];
      av += acol[t * dm.T] * gbase[t * dm.C + d];
    }
    dk[d] = ak * dm.scale;
    dv[d] = av;
  }
}

Dims make_dims(int64_t T, int64_t C, int64_t NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not divisible by NH=", NH);
  const int64_t HS = C / NH;
  return Dims{T, C, NH, HS, 1.0f / std::sqrt(static_cast<float>(HS))};
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, cudaStream_t stream) {
  const Dims dm = make_dims(T, C, NH);
  if (B <= 0 || T <= 0) return;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(B * NH));
  attention_forward_kernel<<<grid, kAttBlock, attention_row_shared_bytes(T), stream>>>(out, att,
                                                                                       qkv, dm);
  MT_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                        cudaStream_t stream) {
  const Dims dm = make_dims(T, C, NH);
  if (B <= 0 || T <= 0) return;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(B * NH));
  attention_backward_query_kernel<<<grid, kAttBlock, attention_row_shared_bytes(T), stream>>>(
      dqkv, scratch, dout, qkv, att, dm);
  MT_CUDA_CHECK_LAUNCH();
  attention_backward_key_kernel<<<grid, kAttBlock, 0, stream>>>(dqkv, scratch, dout, qkv, att, dm);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
