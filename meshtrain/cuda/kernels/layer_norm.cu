// One warp per row for the forward and the input gradient: rows of GPT widths (768-1600 floats)
// fit a warp's registers in a few passes, and the two-pass variance matches the CPU reference's
// formulation. Parameter gradients sum over rows per column in a separate kernel, in a fixed
// order, without atomics.
#include "meshtrain/cuda/check.h"
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

template <typename G>
__global__ void layer_norm_dinp_kernel(float* dinp, const G* dout, const float* inp,
                                       const float* weight, const float* mean, const float* rstd,
                                       int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.y;
  if (row >= N) return;
  const int lane = threadIdx.x;
  const float* x = inp + row * C;
  const G* g = dout + row * C;
  const float m = mean[row];
  const float s = rstd[row];
  float sum_dn = 0.0f, sum_dn_norm = 0.0f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float gc = detail::load_f32(g, c);
    const float dn = weight != nullptr ? gc * weight[c] : gc;
    sum_dn += dn;
    sum_dn_norm += dn * ((x[c] - m) * s);
  }
  const float a = warp_sum(sum_dn) / static_cast<float>(C);
  const float b = warp_sum(sum_dn_norm) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float gc = detail::load_f32(g, c);
    const float dn = weight != nullptr ? gc * weight[c] : gc;
    dx[c] = (dn - a - ((x[c] - m) * s) * b) * s;
  }
}

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
                         const float* rstd, int64_t N, int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  detail::with_float_type(dout_type, "layer_norm: the output's gradient", [&]<typename G>(G*) {
    const G* g = static_cast<const G*>(dout);
    if (dinp != nullptr) {
      layer_norm_dinp_kernel<<<row_blocks(N), dim3(kWarp, kRowsPerBlock), 0, stream>>>(
          dinp, g, inp, weight, mean, rstd, N, C);
      MT_CUDA_CHECK_LAUNCH();
    }
    if (dweight != nullptr || dbias != nullptr) {
      detail::column_sums_accumulate<2>({dweight, dbias}, N, C,
                                        ParamGradOf<G>{g, inp, mean, rstd, C}, stream);
    }
  });
}

}  // namespace meshtrain::cuda
