// One warp per row for the forward and the input gradient: rows of GPT widths (768-1600 floats)
// fit a warp's registers in a few passes, and the two-pass variance matches the CPU reference's
// formulation. The backward reads dout and the input once: the parameter gradients are summed
// per column beside the input gradient, in a fixed order, without atomics (a separate column-sum
// pass where the rows are too wide for the shared memory that takes).
#include <algorithm>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/column_sums.cuh"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/layer_norm.h"

namespace meshtrain::cuda {
namespace {

using detail::kWarp;
using detail::warp_sum;

constexpr int kRowsPerBlock = 8;  // warps per block

template <typename O>
__global__ void layer_norm_forward_kernel(O* out, float* mean, float* rstd, const float* inp,
                                          const float* weight, const float* bias, int64_t N,
                                          int64_t C, float eps) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.y;
  if (row >= N) return;
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  float sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) sum += x[c];
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float s = rsqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  O* y = out + row * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    float v = (x[c] - m) * s;
    if (weight != nullptr) v *= weight[c];
    if (bias != nullptr) v += bias[c];
    detail::store_f32(y, c, v);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = s;
  }
}

// One row of the input gradient, computed by one warp: the row's means of dn = dout * weight and
// of dn * the normalised input, the two terms the gradient subtracts.
template <typename G>
struct RowGradient {
  const G* g;
  const float *x, *weight;
  float m, s, a = 0.0f, b = 0.0f;
  __device__ float dn(int64_t c, float gc) const { return weight != nullptr ? gc * weight[c] : gc; }
  __device__ float norm(int64_t c) const { return (x[c] - m) * s; }
  __device__ void take_means(int64_t C, int lane) {
    float sum_dn = 0.0f, sum_dn_norm = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float d = dn(c, detail::load_f32(g, c));
      sum_dn += d;
      sum_dn_norm += d * norm(c);
    }
    a = warp_sum(sum_dn) / static_cast<float>(C);
    b = warp_sum(sum_dn_norm) / static_cast<float>(C);
  }
  __device__ float dinp(int64_t c, float gc) const { return (dn(c, gc) - a - norm(c) * b) * s; }
  // Writes, or adds to what dx holds (a sum of its own: never fused into a multiply-add, so the
  // bits are those of a separate addition); returns what it wrote.
  __device__ static float put(float* dx, int64_t c, float v, bool accumulate) {
    const float r = accumulate ? __fadd_rn(dx[c], v) : v;
    dx[c] = r;
    return r;
  }
};

// A row of the input gradient's copy rounded to bf16 or f16, written beside it (p null: none).
struct HalfRow {
  void* p = nullptr;
  bool f16 = false;
  __device__ HalfRow row(int64_t r, int64_t C) const {
    return {p != nullptr ? static_cast<void*>(static_cast<uint16_t*>(p) + r * C) : nullptr, f16};
  }
  __device__ void put(int64_t c, float v) const {
    if (p == nullptr) return;
    if (f16)
      detail::store_f32(static_cast<__half*>(p), c, v);
    else
      detail::store_f32(static_cast<__nv_bfloat16*>(p), c, v);
  }
};

template <typename G>
__global__ void layer_norm_dinp_kernel(float* dinp, const G* dout, const float* inp,
                                       const float* weight, const float* mean, const float* rstd,
                                       int64_t N, int64_t C, bool accumulate, HalfRow half) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.y;
  if (row >= N) return;
  const int lane = threadIdx.x;
  RowGradient<G> r{dout + row * C, inp + row * C, weight, mean[row], rstd[row]};
  r.take_means(C, lane);
  float* dx = dinp + row * C;
  const HalfRow h = half.row(row, C);
  for (int64_t c = lane; c < C; c += kWarp)
    h.put(c, RowGradient<G>::put(dx, c, r.dinp(c, detail::load_f32(r.g, c)), accumulate));
}

// The whole backward in one pass over dout and inp: a block takes `chunk_rows` rows, a warp one
// row at a time (the input gradient as above), and each warp adds its rows' weight and bias
// gradients into its own shared-memory row of 2C floats (its lanes own distinct columns: no
// atomics). The block then sums its warps in order into partial[k][chunk][C], which
// column_finish_kernel adds up over the chunks in order: the same bits on every run.
constexpr int kFusedWarps = 4;

template <typename G>
__global__ void __launch_bounds__(kFusedWarps* kWarp)
    layer_norm_backward_fused_kernel(float* dinp, float* partial, const G* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd,
                                     int64_t N, int64_t C, int64_t chunk_rows, bool accumulate,
                                     HalfRow half) {
  extern __shared__ float acc[];  // [kFusedWarps][2][C]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* aw = acc + warp * 2 * C;
  float* ab = aw + C;
  for (int64_t c = lane; c < C; c += kWarp) aw[c] = ab[c] = 0.0f;
  const int64_t r_begin = blockIdx.x * chunk_rows;
  const int64_t r_end = r_begin + chunk_rows < N ? r_begin + chunk_rows : N;
  for (int64_t row = r_begin + warp; row < r_end; row += kFusedWarps) {
    RowGradient<G> r{dout + row * C, inp + row * C, weight, mean[row], rstd[row]};
    if (dinp != nullptr) r.take_means(C, lane);
    float* dx = dinp != nullptr ? dinp + row * C : nullptr;
    const HalfRow h = half.row(row, C);
    for (int64_t c = lane; c < C; c += kWarp) {
      const float gc = detail::load_f32(r.g, c);
      aw[c] += gc * r.norm(c);
      ab[c] += gc;
      if (dx != nullptr) h.put(c, RowGradient<G>::put(dx, c, r.dinp(c, gc), accumulate));
    }
  }
  __syncthreads();
  const int64_t chunks = gridDim.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float w = 0.0f, bsum = 0.0f;
#pragma unroll
    for (int k = 0; k < kFusedWarps; ++k) {
      w += acc[k * 2 * C + c];
      bsum += acc[k * 2 * C + C + c];
    }
    partial[blockIdx.x * C + c] = w;
    partial[(chunks + blockIdx.x) * C + c] = bsum;
  }
}

// The fused kernel's shared memory: within the default 48 KiB up to C = 1536 (GPT-2 XL's 1600
// takes the two-kernel path).
constexpr size_t fused_smem_bytes(int64_t C) {
  return static_cast<size_t>(kFusedWarps) * 2 * static_cast<size_t>(C) * sizeof(float);
}
constexpr size_t kDefaultSmem = 48 * 1024;

// dout * the normalised input (the weight's gradient) and dout (the bias's), per element.
template <typename G>
struct ParamGradOf {
  const G* dout;
  const float *inp, *mean, *rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float* v) const {
    const float g = detail::load_f32(dout, r * C + c);
    v[0] = g * ((inp[r * C + c] - mean[r]) * rstd[r]);
    v[1] = g;
  }
};

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void layer_norm_forward(void* out, DType out_type, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int64_t N, int64_t C, float eps,
                        cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  detail::with_float_type(out_type, "layer_norm: the output", [&]<typename O>(O*) {
    layer_norm_forward_kernel<<<row_blocks(N), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
        static_cast<O*>(out), mean, rstd, inp, weight, bias, N, C, eps);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void layer_norm_backward(float* dinp, float* dweight, float* dbias, const void* dout,
                         DType dout_type, const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C, cudaStream_t stream,
                         bool accumulate, void* dinp_half, DType half) {
  MT_CHECK(dinp_half == nullptr || (dinp != nullptr && (half == DType::bf16 || half == DType::f16)),
           "layer_norm: a half copy of the input gradient is bf16 or f16, beside the gradient");
  const HalfRow hrow{dinp_half, half == DType::f16};
  if (C <= 0) return;
  detail::with_float_type(dout_type, "layer_norm: the output's gradient", [&]<typename G>(G*) {
    const G* g = static_cast<const G*>(dout);
    const bool params = dweight != nullptr || dbias != nullptr;
    if (params && N > 0 && fused_smem_bytes(C) <= kDefaultSmem) {
      // Blocks of at least 32 rows, at most 2048 of them.
      const int64_t chunk_rows = std::max<int64_t>(32, (N + 2047) / 2048);
      const int64_t chunks = (N + chunk_rows - 1) / chunk_rows;
      const StreamScratch scratch(static_cast<size_t>(2 * chunks * C) * sizeof(float), stream);
      layer_norm_backward_fused_kernel<<<static_cast<unsigned>(chunks), kFusedWarps * kWarp,
                                         fused_smem_bytes(C), stream>>>(
          dinp, scratch.as<float>(), g, inp, weight, mean, rstd, N, C, chunk_rows, accumulate,
          hrow);
      MT_CUDA_CHECK_LAUNCH();
      detail::ColumnOutputs<2> o{{dweight, dbias}};
      detail::column_finish_kernel<2><<<static_cast<unsigned>((C + 255) / 256), 256, 0, stream>>>(
          o, scratch.as<float>(), chunks, C, false);
      MT_CUDA_CHECK_LAUNCH();
      return;
    }
    if (dinp != nullptr && N > 0) {
      layer_norm_dinp_kernel<<<row_blocks(N), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
          dinp, g, inp, weight, mean, rstd, N, C, accumulate, hrow);
      MT_CUDA_CHECK_LAUNCH();
    }
    // No rows: zeros written.
    if (params) {
      detail::column_sums_to<2>({dweight, dbias}, N, C, ParamGradOf<G>{g, inp, mean, rstd, C},
                                false, stream);
    }
  });
}

}  // namespace meshtrain::cuda
